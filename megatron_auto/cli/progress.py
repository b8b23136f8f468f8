"""A progress bar on stderr that appears only once a task has run longer than a second."""
from __future__ import annotations

import os
import sys
import time
from typing import Optional, TextIO

FORCE_ENV = "MEGATRON_AUTO_PROGRESS"
"""Set to 1 to draw the bar even when stderr is not a terminal, 0 to never draw it."""


def _enabled(stream: TextIO) -> bool:
    forced = os.environ.get(FORCE_ENV)
    if forced is not None:
        return forced == "1"
    return hasattr(stream, "isatty") and stream.isatty()


class ProgressBar:
    """Callable taking a fraction 0..1; draws `label [####....]  42%` after `delay_s`."""

    def __init__(self, label: str, stream: Optional[TextIO] = None, delay_s: float = 1.0,
                 width: int = 30, min_interval_s: float = 0.1) -> None:
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.delay_s = delay_s
        self.width = width
        self.min_interval_s = min_interval_s
        self.enabled = _enabled(self.stream)
        self.start = time.monotonic()
        self.last_draw = float("-inf")
        self.drawn = False

    def __call__(self, fraction: float) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if now - self.start < self.delay_s or now - self.last_draw < self.min_interval_s:
            return
        self.last_draw, self.drawn = now, True
        self.stream.write("\r" + self.render(fraction, now - self.start))
        self.stream.flush()

    def render(self, fraction: float, elapsed_s: float) -> str:
        """The bar's text for `fraction` done after `elapsed_s` seconds."""
        fraction = min(max(float(fraction), 0.0), 1.0)
        filled = int(round(fraction * self.width))
        bar = "#" * filled + "." * (self.width - filled)
        return f"{self.label} [{bar}] {100 * fraction:3.0f}%  {elapsed_s:5.1f} s"

    def close(self) -> None:
        """Erase the bar, so that whatever is printed next starts on a clean line."""
        if self.drawn:
            self.stream.write("\r\033[K")
            self.stream.flush()
            self.drawn = False

    def __enter__(self) -> "ProgressBar":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
