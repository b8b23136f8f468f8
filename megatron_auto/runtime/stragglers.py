"""Stragglers at run time (issue 39): each rank's busy seconds against its stage's prediction, and a re-plan
with the measured node speeds when one stays slower than the plan.

- `BusyClock`: Megatron-Core's schedules time every micro-batch's forward and backward pass through
  TransformerConfig.timers ('forward-compute', 'backward-compute'); the clock, installed there, adds them up
  for this rank (CUDA events on a GPU, so that nothing waits for the device; the host's clock on CPU). The
  time a rank waits for its pipeline neighbours, the gradient sync and the optimizer step are not in it.
- `StragglerWatch`, after every iteration: each `interval` iterations the ranks all-gather their busy
  seconds; `judge` divides each by its stage's predicted busy seconds (cost.estimate.stage_busy_seconds on
  the cluster the plan was priced on, measured speeds included) and by the median of those ratios over the
  job, which takes out the cost model's error common to all ranks. A node whose ranks run beyond
  1 +- threshold of that median gets a new measured speed (a share of the modelled one, in SPEED_STEP steps).
- The search then plans for the cluster at those speeds (specs.presets.with_node_speeds). When its plan is
  predicted at least MIN_GAIN faster than the running plan at the same speeds, a job under --auto-parallel that
  saves checkpoints (--save) saves one and raises `PlanReplaced`: runtime.fit builds the new plan's session and
  resumes from that checkpoint (no sample lost or repeated). Otherwise the finding and the plan it would use
  are logged.

Speeds are per node: node groups are the cluster's unit (a slow GPU slows its whole node's share).

On CPU, `MEGATRON_AUTO_SLOW_RANK=RANK:FACTOR[:BASE]` is the tests' slow rank: every rank's forward and backward
passes last BASE times their compute time, the CPU seconds of the thread that runs them (after each the rank sleeps
the rest; default 1, as they are), and rank RANK's FACTOR x BASE times, as on a throttled GPU. Counting CPU seconds,
not wall time, keeps a pass as long whatever else runs on the machine, as a GPU's kernels take as long beside a
busy host. A BASE above 1 leaves each rank's core idle most of a pass, as
a GPU leaves its host: four ranks on two cores then run side by side like four devices instead of time-slicing
their cores, which would otherwise hide most of a slow rank behind the others' shared cores.
"""
from __future__ import annotations

import logging
import os
import statistics
import time
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import torch

from ..cost.estimate import estimate_plan, stage_busy_seconds
from ..errors import UserError
from ..plan import Plan
from ..specs.cluster import ClusterSpec
from ..specs.presets import with_node_speeds
from .memory_check import stage_of_rank
from .node_speed import SPEED_STEP, emulated_pass_end, injected_slowdown, rounded_speed
from .session import is_logging_rank, save_now, stop_iteration

logger = logging.getLogger(__name__)

MIN_GAIN = 0.05
"""The least predicted saving of a re-plan (a share of the running plan's iteration at the measured speeds);
below it the job keeps its plan and logs the finding."""
COUNTED = ("forward-compute", "backward-compute")


@dataclass(frozen=True)
class Policy:
    """--auto-parallel-straggler-threshold and --auto-parallel-straggler-interval."""

    threshold: float = 0.2
    """How far from the job's median a rank's busy seconds per predicted second may be."""
    interval: int = 100
    """Iterations per check window (0: no watch)."""


class _Idle:
    """The timers of the schedule that the clock does not count."""

    def start(self, barrier: bool = False) -> None:
        pass

    def stop(self, barrier: bool = False) -> None:
        pass


class _PassTimer:
    """One counted timer: host time on CPU, a pair of CUDA events per pass on a GPU."""

    def __init__(self, clock: "BusyClock"):
        self.clock, self._started, self._started_cpu, self._event = clock, 0.0, 0.0, None

    def start(self, barrier: bool = False) -> None:
        if self.clock.on_cuda:
            self._event = torch.cuda.Event(enable_timing=True)
            self._event.record()
        else:
            self._started, self._started_cpu = time.perf_counter(), time.thread_time()

    def stop(self, barrier: bool = False) -> None:
        if self.clock.on_cuda:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self.clock.pending.append((self._event, end))
            return
        if self.clock.slowdown > 1.0:
            emulated_pass_end(self._started, self._started_cpu, self.clock.slowdown, time)
        self.clock.busy_s += time.perf_counter() - self._started


class BusyClock:
    """Megatron-Core's TransformerConfig.timers: the seconds this rank spends in forward and backward passes."""

    def __init__(self, device: torch.device, slowdown: float = 1.0):
        self.on_cuda, self.slowdown = device.type == "cuda", slowdown
        self.busy_s, self.pending = 0.0, []
        self._timers = {name: _PassTimer(self) for name in COUNTED}
        self._idle = _Idle()

    def __call__(self, name: str, log_level: Optional[int] = None):
        return self._timers.get(name, self._idle)

    def take(self) -> float:
        """Busy seconds since the last take (after an iteration, whose loss read has waited for the device)."""
        if self.pending:
            self.pending[-1][1].synchronize()
            self.busy_s += sum(start.elapsed_time(end) for start, end in self.pending) / 1e3
            self.pending.clear()
        busy, self.busy_s = self.busy_s, 0.0
        return busy


def install_clock(model: list, clock: BusyClock) -> None:
    """Hand `clock` to the schedules, which read the first chunk's TransformerConfig."""
    from megatron.core.utils import get_model_config

    get_model_config(model[0]).timers = clock


@dataclass(frozen=True)
class Finding:
    """What one check window measured."""

    slowdowns: tuple[float, ...]
    """Per rank: its busy seconds over its stage's prediction, relative to the job's median of that ratio."""
    node_speeds: tuple[float, ...]
    """Per node: the speed to plan with (the speeds planned with so far, times what this window measured)."""
    planned: tuple[float, ...]
    """Per node: the speeds the running plan was priced with."""

    @property
    def changed(self) -> bool:
        """Whether any node's speed differs from the speeds the running plan was priced with."""
        return self.node_speeds != self.planned

    def summary(self, node_ranks: Sequence[tuple[int, int]], threshold: float) -> str:
        """One line: the ranks off the job's pace (with their nodes) and the node speeds measured."""
        node_of = {first + local: node for node, (first, count) in enumerate(node_ranks) for local in range(count)}
        off = [f"rank {rank} (node {node_of[rank]}) at {slowdown:.2f}x"
               for rank, slowdown in enumerate(self.slowdowns) if abs(slowdown - 1.0) > threshold]
        speeds = ", ".join(f"{speed:g}" for speed in self.node_speeds)
        return (f"ranks beyond 1 +- {threshold:g} of the job's busy time per predicted second: {', '.join(off)}; "
                f"measured node speeds: {speeds}")


def judge(busy_s: Sequence[float], predicted_s: Sequence[float], node_ranks: Sequence[tuple[int, int]],
          speeds: Sequence[float], threshold: float) -> Finding:
    """The finding of one window: `busy_s` and `predicted_s` per rank, `speeds` per node as planned so far;
    `node_ranks`: each node's (first rank, ranks) (ClusterSpec.node_ranks)."""
    ratios = [busy / predicted for busy, predicted in zip(busy_s, predicted_s)]
    median = statistics.median(ratios)
    slowdowns = tuple(ratio / median for ratio in ratios)
    new_speeds = []
    for (first, count), speed in zip(node_ranks, speeds):
        worst = max(slowdowns[first:first + count])
        if worst > 1.0 + threshold or (worst < 1.0 - threshold and speed < 1.0):
            speed = rounded_speed(speed / worst)
        new_speeds.append(speed)
    return Finding(slowdowns, tuple(new_speeds), tuple(speeds))


class PlanReplaced(Exception):
    """The job saved a checkpoint and goes on under `plan`, priced on `cluster` (the measured node speeds)."""

    def __init__(self, plan: Plan, cluster: ClusterSpec, speeds: tuple[float, ...], reason: str):
        super().__init__(reason)
        self.plan, self.cluster, self.speeds, self.reason = plan, cluster, speeds, reason


@dataclass(frozen=True)
class Watch:
    """What a StragglerWatch checks against and how it acts."""

    threshold: float
    interval: int
    predicted_s: tuple[float, ...]
    """Per rank: its stage's predicted busy seconds per iteration."""
    node_ranks: tuple[tuple[int, int], ...]
    """Per node: (first rank, ranks) (ClusterSpec.node_ranks)."""
    speeds: tuple[float, ...]
    """Per node: the speeds the running plan was priced with."""
    replan: Callable[[tuple[float, ...]], tuple[Plan, ClusterSpec, float, float]]
    """Speeds -> (the search's plan, the cluster at those speeds, its predicted iteration, the running plan's)."""
    restart: bool
    """Whether the job re-plans by itself (--auto-parallel with --save) or only logs."""


def confirmed(previous: Optional[Finding], current: Finding) -> Optional[Finding]:
    """The finding of two windows in a row that moved the same nodes the same way, at their mean speeds; None when
    this window stands alone (a node that "stays slower" is one that two windows saw)."""
    if previous is None or not previous.changed or not current.changed:
        return None
    moved = [_direction(a, b) for a, b in zip(previous.node_speeds, previous.planned)]
    if moved != [_direction(a, b) for a, b in zip(current.node_speeds, current.planned)]:
        return None
    speeds = tuple(rounded_speed((a + b) / 2) for a, b in zip(previous.node_speeds, current.node_speeds))
    slowdowns = tuple((a + b) / 2 for a, b in zip(previous.slowdowns, current.slowdowns))
    return Finding(slowdowns, speeds, current.planned)


def _moved(speeds: tuple[float, ...], before: tuple[float, ...]) -> bool:
    """Whether any node's speed moved by more than one SPEED_STEP (the noise of the last acted-on finding)."""
    return any(abs(a - b) > SPEED_STEP + 1e-9 for a, b in zip(speeds, before))


def _direction(measured: float, planned: float) -> int:
    return (measured > planned) - (measured < planned)


class StragglerWatch:
    """runtime.session.train's after_iteration: measure, judge every `interval` iterations, act on what two
    windows in a row confirm."""

    def __init__(self, watch: Watch, clock: BusyClock, iterations: tuple[int, int], save: Callable[[], None]):
        """`iterations`: the session's first iteration (it resumed after) and the one it stops at."""
        self.watch, self.clock, self.save = watch, clock, save
        self.window_start = iterations[0] + 1  # the session's first iteration (warm-up) is not measured
        self.last_check = iterations[1] - watch.interval  # a re-plan must leave a window to run in
        self.busy_s, self.previous, self.logged = 0.0, None, watch.speeds

    def __call__(self, session, result) -> None:
        busy = self.clock.take()
        if session.iteration <= self.window_start:
            return
        self.busy_s += busy
        if (session.iteration - self.window_start) % self.watch.interval:
            return
        gathered = _all_gathered(self.busy_s, session.device)
        self.busy_s = 0.0
        finding = judge(gathered, self.watch.predicted_s, self.watch.node_ranks, self.watch.speeds,
                        self.watch.threshold)
        both = confirmed(self.previous, finding)
        self.previous = finding
        if both is not None and _moved(both.node_speeds, self.logged) and session.iteration <= self.last_check:
            self._act(session, both)

    def _act(self, session, finding: Finding) -> None:
        from .session import is_logging_rank

        what = finding.summary(self.watch.node_ranks, self.watch.threshold)
        try:
            plan, cluster, new_s, running_s = self.watch.replan(finding.node_speeds)
        except UserError as error:
            self.logged = finding.node_speeds
            logger.warning("iteration %d: stragglers: %s; no plan fits those speeds: %s", session.iteration, what, error)
            return
        gain = 1.0 - new_s / running_s
        verdict = (f"{what}; the plan for those speeds is predicted at {new_s:.3f} s per iteration, the running "
                   f"plan's at {running_s:.3f} s ({gain:+.1%})")
        if self.watch.restart and gain >= MIN_GAIN:
            self.save()
            raise PlanReplaced(plan, cluster, finding.node_speeds, f"iteration {session.iteration}: {verdict}")
        self.logged = finding.node_speeds
        if is_logging_rank():
            why = ("the gain is below the least worth a restart" if gain < MIN_GAIN else
                   "this job does not re-plan by itself (it needs --auto-parallel and --save)")
            logger.warning("iteration %d: stragglers: %s; kept the running plan: %s. The plan: %s",
                           session.iteration, verdict, why, _plan_text(plan))


def watch_for(session, plan: Plan, basis, speeds: tuple[float, ...], policy: Policy, base_cluster: ClusterSpec,
              replan: Callable[[ClusterSpec, int], Plan], restart: bool, rank: int) -> Optional[StragglerWatch]:
    """The watch over `session` (`basis`: memory_check.PlanBasis, priced at `speeds`); None when the policy is off,
    for a hybrid-space plan (its own schedules do not time their passes), or when the stages cannot be priced."""
    if policy.interval <= 0 or plan.space != "megatron":
        return None
    try:
        stage_s = stage_busy_seconds(plan, basis.model, basis.cluster, basis.training)
    except (UserError, ValueError):
        return None
    if min(stage_s) <= 0.0:
        return None

    def replan_at(new_speeds: tuple[float, ...]) -> tuple[Plan, ClusterSpec, float, float]:
        cluster = with_node_speeds(base_cluster, new_speeds)
        found = replan(cluster, basis.training.memory_budget_bytes)
        running = estimate_plan(plan, basis.model, cluster, basis.training).iteration_time_s
        return found, cluster, found.prediction.iteration_time_s, running

    if is_logging_rank():
        acts = "re-plans" if restart else "logs the plan it would use (re-planning needs --auto-parallel and --save)"
        logger.info("straggler watch: every %d iterations, threshold %g; a slow node %s", policy.interval,
                    policy.threshold, acts)
    predicted = tuple(stage_s[stage_of_rank(plan, r)] for r in range(plan.world_size))
    clock = BusyClock(session.device, injected_slowdown(rank))
    install_clock(session.model, clock)
    watch = Watch(policy.threshold, policy.interval, predicted, base_cluster.node_ranks(), speeds, replan_at,
                  restart)
    return StragglerWatch(watch, clock, (session.iteration, stop_iteration(session.settings)),
                          lambda: save_now(session))


def _all_gathered(busy_s: float, device: torch.device) -> list[float]:
    """Every rank's busy seconds, in rank order (on the job's default group)."""
    world = torch.distributed.get_world_size()
    mine = torch.tensor([busy_s], dtype=torch.float64, device=device)
    every = [torch.zeros_like(mine) for _ in range(world)]
    torch.distributed.all_gather(every, mine)
    return [float(t.item()) for t in every]


def _plan_text(plan: Plan) -> str:
    from ..megatron_flags import megatron_flags

    return "megatron-lm flags: " + " ".join(megatron_flags(plan)) if plan.space == "megatron" else "a hybrid plan"
