"""A stand-in for the `time` module in the tests of timed passes (runtime/stragglers.py, profiling/node_speeds.py)."""
from __future__ import annotations


class FakeClock:
    """perf_counter, thread_time and sleep of clocks that only move when told to (the wall clock also when slept on)."""

    def __init__(self):
        self.now, self.cpu = 0.0, 0.0

    def perf_counter(self) -> float:
        return self.now

    def thread_time(self) -> float:
        return self.cpu

    def sleep(self, seconds: float) -> None:
        self.now += seconds

    def compute(self, cpu_s: float, wall_s: float) -> None:
        self.cpu += cpu_s
        self.now += wall_s
