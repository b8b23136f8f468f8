"""The runtime's proof that a plan fits: measured peak memory against the planner's prediction.

At start, rank by rank, the device's free and total memory (torch.cuda.mem_get_info).
After the warm-up iterations (`WARM_UP_ITERATIONS`), the measured peak against the
cost model's peak for this rank's pipeline stage (cost.estimate.estimate_plan under
the cluster and training spec the search used), with a warning when the peak allocated
or the device memory measured exceeds its prediction by more than `TOLERANCE`.

Why after iteration 2: Adam's moments are allocated lazily inside the first
optimizer step, after that iteration's activations were freed; iteration 2 is
the first whose forward and backward run with every model state resident, i.e.
the first to reach the steady-state peak that the cost model predicts
(states + in-flight activations + transients). torch's peak counters are
cumulative, so the check after iteration 2 covers both iterations.

On CUDA the measured figure is torch's peak reserved bytes plus what the process
holds outside torch's allocator (CUDA context, cuBLAS workspace, NCCL buffers:
used - reserved from mem_get_info), i.e. the device memory the plan really
needed, against the cost model's device memory (cost.peak_memory.device_bytes: the
allocator's reserve, CUDA context and workspaces, NCCL communicators); torch's peak
allocated bytes are compared with the cost model's allocated peak. On CPU torch keeps no peak of its allocator, so the check says "not
measured on CPU" (validation/validate_cost_model.py measures CPU peaks with the
profiler) and logs the process's peak resident set for information only.
"""
from __future__ import annotations

import logging
import resource
from dataclasses import dataclass
from typing import Optional

import torch

from ..cost.estimate import estimate_plan, plan_communicators
from ..cost.peak_memory import device_bytes
from ..plan import Plan
from ..specs.cluster import ClusterSpec
from ..specs.model import ModelSpec
from ..specs.training import GIB, TrainingSpec

logger = logging.getLogger(__name__)

WARM_UP_ITERATIONS = 2
"""Iterations after which the peak is compared (see the module docstring)."""
TOLERANCE = 0.05
"""Measured device memory above the prediction by more than this share is reported (issue 12)."""


@dataclass(frozen=True)
class PlanBasis:
    """What the plan was priced under: the model, the job's cluster and the training spec."""

    model: ModelSpec
    cluster: ClusterSpec
    """The cluster shaped to the job's world size (runtime.planning.cluster_for_world)."""
    training: TrainingSpec


@dataclass(frozen=True)
class MeasuredPeak:
    """Peak memory of this rank's device since the start (or the last reset)."""

    allocated_bytes: int
    """torch.cuda.max_memory_allocated: the most bytes held by live tensors."""
    reserved_bytes: int
    """torch.cuda.max_memory_reserved: the most bytes the caching allocator held."""
    outside_torch_bytes: int
    """Device memory the process holds outside torch's allocator (context, libraries, NCCL)."""

    @property
    def device_bytes(self) -> int:
        """What the plan needed of the device: the allocator's peak plus the rest of the process."""
        return self.reserved_bytes + self.outside_torch_bytes


def stage_of_rank(plan: Plan, rank: int) -> int:
    """Pipeline stage of a global rank: Megatron's rank order (tp-cp-ep-dp-pp) and the hybrid
    runtime's (runtime/hybrid/groups.py) both place stage s on ranks s*n .. s*n+n-1."""
    return rank // plan.gpus_per_stage


@dataclass(frozen=True)
class PredictedPeak:
    """The cost model's peak on one GPU of a stage."""

    allocated_bytes: float
    """Bytes held by live tensors at the peak (torch.cuda.max_memory_allocated's counterpart)."""
    device_bytes: float
    """Device memory in use then: the allocator's reserve and what lives outside it included."""


def predicted_stage_peak(plan: Plan, basis: PlanBasis, stage: int) -> PredictedPeak:
    """The cost model's peak on one GPU of `stage`."""
    prediction = estimate_plan(plan, basis.model, basis.cluster, basis.training)
    allocated = prediction.stage_memory_gib[stage] * GIB
    return PredictedPeak(allocated, device_bytes(allocated, basis.cluster, plan_communicators(plan, basis.model)))


def measure_peak(device: torch.device) -> Optional[MeasuredPeak]:
    """The CUDA peaks of `device`; None on CPU (torch keeps no peak of the CPU allocator)."""
    if device.type != "cuda":
        return None
    free, total = torch.cuda.mem_get_info(device)
    outside = max(0, (total - free) - torch.cuda.memory_reserved(device))
    return MeasuredPeak(allocated_bytes=torch.cuda.max_memory_allocated(device),
                        reserved_bytes=torch.cuda.max_memory_reserved(device), outside_torch_bytes=outside)


def exceeds(measured_bytes: float, predicted_bytes: float, tolerance: float = TOLERANCE) -> bool:
    """True when the measurement is above the prediction by more than `tolerance` (a share)."""
    return measured_bytes > predicted_bytes * (1.0 + tolerance)


def memory_report(rank: int, stage: int, measured: Optional[MeasuredPeak], predicted: PredictedPeak,
                  iteration: int) -> tuple[str, bool]:
    """The log line of the check and whether it is a warning (allocated or device memory measured
    above its prediction by more than 5%)."""
    head = (f"memory after iteration {iteration}, rank {rank} (stage {stage}): predicted peak allocated "
            f"{predicted.allocated_bytes / GIB:.2f} GiB, device {predicted.device_bytes / GIB:.2f} GiB")
    if measured is None:
        rss_gib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GIB
        return (f"{head}; peak not measured on CPU (torch keeps no CPU allocator peak; process peak RSS "
                f"{rss_gib:.2f} GiB, for information only)"), False
    line = (f"{head}; measured peak allocated {measured.allocated_bytes / GIB:.2f} GiB "
            f"({measured.allocated_bytes / predicted.allocated_bytes:.1%} of predicted), device "
            f"{measured.device_bytes / GIB:.2f} GiB ({measured.device_bytes / predicted.device_bytes:.1%}) "
            f"= peak reserved {measured.reserved_bytes / GIB:.2f} GiB "
            f"+ {measured.outside_torch_bytes / GIB:.2f} GiB outside torch")
    if (exceeds(measured.allocated_bytes, predicted.allocated_bytes)
            or exceeds(measured.device_bytes, predicted.device_bytes)):
        return f"WARNING: {line}: the plan needs more than the cost model predicted (> {TOLERANCE:.0%})", True
    return line, False


def log_device_memory_at_start(device: torch.device, rank: int) -> None:
    """torch.cuda.mem_get_info (free/total) of this rank's device, or that CPU memory is not tracked."""
    if device.type != "cuda":
        logger.info("rank %d: on CPU: device memory is not measured", rank)
        return
    free, total = torch.cuda.mem_get_info(device)
    logger.info("rank %d: %s: %.2f GiB free of %.2f GiB at start", rank, torch.cuda.get_device_name(device),
                free / GIB, total / GIB)


class MemoryCheck:
    """Called after every iteration: at WARM_UP_ITERATIONS (counted from the run's first
    iteration, so a resumed run checks too; or at `stop` if sooner) it logs the comparison once."""

    def __init__(self, plan: Plan, basis: PlanBasis, rank: int, first_iteration: int = 0,
                 stop: Optional[int] = None):
        self.stage = stage_of_rank(plan, rank)
        self.rank = rank
        self.predicted = predicted_stage_peak(plan, basis, self.stage)
        self.predicted_bytes = self.predicted.device_bytes
        """The device memory predicted: what a memory budget is compared with."""
        self.check_at = first_iteration + WARM_UP_ITERATIONS
        if stop is not None:  # a shorter run is checked at its last iteration
            self.check_at = max(first_iteration + 1, min(self.check_at, stop))
        self.report: Optional[tuple[str, bool]] = None
        """The line logged and whether it warned, once the check ran."""

    def __call__(self, session, result=None) -> None:
        if self.report is not None or session.iteration < self.check_at:
            return
        self.report = memory_report(self.rank, self.stage, measure_peak(session.device), self.predicted,
                                    session.iteration)
        (logger.warning if self.report[1] else logger.info)(self.report[0])
