"""Out of memory in the first iterations: every rank agrees, then the job re-plans.

A rank that runs out of device memory (torch.OutOfMemoryError) leaves the
pipeline schedule in the middle of it; its peers may be blocked in a
collective or p2p transfer that waits for it. So:

- the first `memory_check.WARM_UP_ITERATIONS` iterations run guarded: an OOM,
  or a collective that failed (a peer left it and the group's timeout ran out),
  is caught, and after every guarded iteration all ranks exchange a small
  record over a gloo group of their own (`agreement_group`) whose timeout is
  twice the job's collective timeout plus a minute: a peer blocked in a
  collective reaches the vote once its own group times out, before the vote
  does; a rank that died makes the vote time out, so no rank waits forever;
- when any rank ran out of memory, every rank raises `PlanDidNotFit` with the
  budget to re-plan under (`lowered_budget`): the caller frees the session
  (`release`) and re-plans, or stops with the plan to use.

On NCCL, a rank whose collective waits for a rank that left is ended by the
ProcessGroupNCCL watchdog after the group's timeout (torch's default
TORCH_NCCL_ASYNC_ERROR_HANDLING tears the process down); the rank that ran out of
memory then sees its vote fail and stops with the re-planned plan (exit 2, the
plan written beside the run: runtime.fit). When every rank runs out of memory at
the same point (the usual case for data parallelism, whose ranks hold the same
bytes), or on one GPU, the vote completes and the job re-plans in-process.

On CPU nothing runs out of memory; `MEGATRON_AUTO_INJECT_OOM=RANK:ITERATION[:SHARE]`
raises torch.OutOfMemoryError in rank RANK's first forward of iteration
ITERATION (1-based, the first attempt only), as if the device held SHARE x the
predicted peak (default 1.0), so tests exercise the same path on gloo.
"""
from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Callable, Optional

import torch

from ..specs.training import GIB
from . import distributed
from .memory_check import TOLERANCE

logger = logging.getLogger(__name__)

INJECT_ENV = "MEGATRON_AUTO_INJECT_OOM"


@dataclass(frozen=True)
class InjectedOom:
    """A test's stand-in for a CUDA out-of-memory error (see the module docstring)."""

    rank: int
    iteration: int
    """1-based iteration whose first forward raises."""
    capacity_share: float = 1.0
    """The device's capacity as a share of the plan's predicted peak."""


def injected_oom(environ=os.environ) -> Optional[InjectedOom]:
    """The injection that `MEGATRON_AUTO_INJECT_OOM` asks for, if any."""
    text = environ.get(INJECT_ENV)
    if not text:
        return None
    parts = text.split(":")
    return InjectedOom(int(parts[0]), int(parts[1]), float(parts[2]) if len(parts) > 2 else 1.0)


def install_injection(session, injection: Optional[InjectedOom], rank: int) -> None:
    """A forward pre-hook on the first model chunk that raises at the injected iteration."""
    if injection is None or injection.rank != rank:
        return

    def raise_out_of_memory(module, args):
        if session.iteration + 1 == injection.iteration:
            raise torch.OutOfMemoryError(f"{INJECT_ENV}: injected out of memory at iteration {injection.iteration}")

    session.model[0].register_forward_pre_hook(raise_out_of_memory)


def lowered_budget(budget_bytes: float, predicted_bytes: float, capacity_bytes: float) -> int:
    """The memory budget to re-plan under after a plan predicted at `predicted_bytes` ran out of
    a device of `capacity_bytes`.

    The run needed more than the capacity where the cost model said `predicted`, so the model
    under-counts this plan by at least overshoot = capacity / predicted; a plan fits if its
    prediction times the overshoot is within min(budget, capacity). The result is also kept
    TOLERANCE (5%) below the failed plan's prediction, so the search cannot pick it again.
    """
    overshoot = max(1.0, capacity_bytes / predicted_bytes)
    return int(min(min(budget_bytes, capacity_bytes) / overshoot, predicted_bytes * (1.0 - TOLERANCE)))


def device_capacity_bytes(device: torch.device, predicted_bytes: float,
                          injection: Optional[InjectedOom]) -> float:
    """The memory the plan ran out of: the CUDA device's total (mem_get_info), or the injected share."""
    if device.type == "cuda":
        return float(torch.cuda.mem_get_info(device)[1])
    return predicted_bytes * (injection.capacity_share if injection else 1.0)


@dataclass(frozen=True)
class Vote:
    """One rank's record after a guarded iteration (exchanged by all_gather)."""

    out_of_memory: bool
    failed: bool
    """Any exception in the iteration (an OOM, or a collective a peer left)."""
    budget_bytes: float = math.inf
    predicted_bytes: float = 0.0
    capacity_bytes: float = 0.0

    def as_tensor(self) -> torch.Tensor:
        return torch.tensor([float(self.out_of_memory), float(self.failed), self.budget_bytes,
                             self.predicted_bytes, self.capacity_bytes], dtype=torch.float64)

    @classmethod
    def from_tensor(cls, t: torch.Tensor) -> "Vote":
        return cls(bool(t[0]), bool(t[1]), float(t[2]), float(t[3]), float(t[4]))


class PlanDidNotFit(Exception):
    """Some rank ran out of memory: re-plan under `budget_bytes`."""

    def __init__(self, budget_bytes: int, rank: int, iteration: int, vote: Vote, restartable: bool):
        self.budget_bytes, self.rank, self.iteration, self.vote = budget_bytes, rank, iteration, vote
        self.restartable = restartable
        """False when the vote could not complete (a peer is gone): the job must stop."""
        super().__init__(self.summary())

    def summary(self) -> str:
        return (f"out of memory at iteration {self.iteration} on rank {self.rank} (plan predicted "
                f"{self.vote.predicted_bytes / GIB:.2f} GiB, device holds {self.vote.capacity_bytes / GIB:.2f} GiB)")


def agreement_group(timeout_s: float):
    """A gloo group over every rank for the vote, outlasting every collective of the job."""
    return torch.distributed.new_group(backend="gloo", timeout=timedelta(seconds=2 * timeout_s + 60))


def exchange(vote: Vote, group) -> list[Vote]:
    """Every rank's vote, in rank order (a gloo all_gather of five float64s)."""
    world = torch.distributed.get_world_size()
    gathered = [torch.zeros(5, dtype=torch.float64) for _ in range(world)]
    torch.distributed.all_gather(gathered, vote.as_tensor(), group=group)
    return [Vote.from_tensor(t) for t in gathered]


def verdict(votes: list[Vote], iteration: int, on_cuda: bool) -> Optional[PlanDidNotFit]:
    """PlanDidNotFit for the lowest budget any rank proposed, or None when no rank ran out of memory.

    A restart in this process is safe unless a collective failed on NCCL (the watchdog may have
    aborted its communicator); gloo groups are destroyed and rebuilt with the new plan's.
    """
    oom = [(v.budget_bytes, rank, v) for rank, v in enumerate(votes) if v.out_of_memory]
    if not oom:
        return None
    budget, rank, vote = min(oom, key=lambda entry: entry[0])
    collective_failed = any(v.failed and not v.out_of_memory for v in votes)
    return PlanDidNotFit(int(budget), rank, iteration, vote, restartable=not (on_cuda and collective_failed))


class OomGuard:
    """The train loop's iteration function for the first iterations: run, vote, raise on any OOM."""

    def __init__(self, run: Callable, group, predicted_bytes: float, budget_bytes: float,
                 guard_until: int, injection: Optional[InjectedOom] = None):
        self.run, self.group, self.guard_until = run, group, guard_until
        self.predicted_bytes, self.budget_bytes, self.injection = predicted_bytes, budget_bytes, injection

    def __call__(self, session):
        if session.iteration >= self.guard_until:
            return self.run(session)
        iteration, result, error, own = session.iteration + 1, None, None, Vote(False, False)
        try:
            result = self.run(session)
        except torch.OutOfMemoryError:
            own = self._out_of_memory_vote(session.device)  # the traceback (and its tensors) is dropped here
        except RuntimeError as failure:
            if "out of memory" in str(failure).lower():  # raised as a plain error (e.g. by NCCL's allocations)
                own = self._out_of_memory_vote(session.device)
            else:
                error, own = failure, Vote(False, True)
        try:
            votes = exchange(own, self.group)
        except RuntimeError:
            if own.out_of_memory:  # a peer is gone: stop with the re-plan, no restart
                raise PlanDidNotFit(int(own.budget_bytes), torch.distributed.get_rank(), iteration, own, False)
            raise
        failure = verdict(votes, iteration, session.device.type == "cuda")
        if failure is not None:
            raise failure
        if error is not None:
            raise error
        if any(v.failed for v in votes):
            raise RuntimeError(f"iteration {iteration} failed on rank {[v.failed for v in votes].index(True)}")
        return result

    def _out_of_memory_vote(self, device: torch.device) -> Vote:
        capacity = device_capacity_bytes(device, self.predicted_bytes, self.injection)
        budget = lowered_budget(self.budget_bytes, self.predicted_bytes, capacity)
        logger.warning("rank %d: out of memory (predicted %.2f GiB, device %.2f GiB)",
                       torch.distributed.get_rank(), self.predicted_bytes / GIB, capacity / GIB)
        return Vote(True, True, float(budget), self.predicted_bytes, capacity)


def release(session) -> None:
    """Drop the session's model and optimizer, return cached device memory, and tear down
    Megatron's process groups, so that another plan can be built in this process."""
    for name in ("model", "optimizer", "scheduler", "hybrid", "source"):
        setattr(session, name, None)
    if session.device.type == "cuda":
        torch.cuda.synchronize(session.device)
    distributed.destroy_parallel_groups()  # it collects the dropped model's cycles too
    if session.device.type == "cuda":
        torch.cuda.empty_cache()  # after the collection, so the freed blocks go back
        torch.cuda.reset_peak_memory_stats(session.device)
