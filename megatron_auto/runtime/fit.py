"""Train a plan and prove that it fits: the memory check after warm-up, and on an out-of-memory
error in the first iterations a re-plan under a lower budget (runtime.oom); and keep it fast: a node that
stays slower than the plan re-plans the job for the measured speeds (runtime.stragglers).

`train_fitting` is what tools/pretrain_gpt.py runs on every rank. Under `--auto-parallel`
(`restart=True`) a plan that ran out of memory is replaced in this process by the
search's plan under the lowered budget, up to `MAX_ATTEMPTS` plans; otherwise, or when
the ranks cannot safely go on (a peer is gone, an NCCL collective failed), the re-planned
plan is written to `REPLAN_FILE` and the job stops with a UserError naming it (exit 2).
"""
from __future__ import annotations

import dataclasses
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import torch

from ..errors import UserError
from ..megatron_flags import megatron_flags
from ..plan import Plan, save_plan
from ..specs.cluster import ClusterSpec
from ..specs.training import GIB
from . import memory_check, oom
from . import stragglers as stragglers_
from . import session as sessions
from .memory_check import MemoryCheck, PlanBasis
from .settings import TrainSettings
from .stragglers import Policy

logger = logging.getLogger(__name__)

MAX_ATTEMPTS = 3
"""Plans tried in one process before the job stops with the last re-plan."""
REPLAN_FILE = "auto_parallel_replan.json"


Replanner = Callable[[ClusterSpec, int], Plan]
"""The search's plan for the job on a cluster under a memory budget in bytes (0: the cluster's; raises UserError if
none fits)."""


@dataclass
class _Course:
    """Where the job stands between attempts: the plan, what it is priced on, the node speeds measured so far,
    and the checkpoint a re-planned attempt resumes from."""

    plan: Plan
    basis: PlanBasis
    speeds: tuple[float, ...]
    resume_from: Optional[str] = None
    out_of_memory: int = 0
    """Plans that ran out of memory so far."""


def train_fitting(plan: Plan, basis: PlanBasis, settings: TrainSettings, info, replan: Replanner,
                  restart: bool, stragglers: Policy = Policy()) -> Plan:
    """Train `plan` (from a checkpoint when settings.load or pretrained_checkpoint), re-planning on an early
    OOM and on stragglers (runtime.stragglers); returns the plan that trained last. `info`: distributed.DeviceInfo."""
    rank = torch.distributed.get_rank()
    group = oom.agreement_group(settings.timeout_s)
    memory_check.log_device_memory_at_start(info.device, rank)
    injection = oom.injected_oom()
    course = _Course(plan, basis, (1.0,) * basis.cluster.num_nodes)
    try:
        while True:
            try:
                _train_attempt(course, settings, info, group, injection if course.out_of_memory == 0 else None,
                               _StragglerSetup(stragglers, basis.cluster, replan, restart and bool(settings.save)))
                return course.plan
            except oom.PlanDidNotFit as failure:
                course.out_of_memory += 1
                go_on = restart and failure.restartable and course.out_of_memory < MAX_ATTEMPTS
                course.plan, course.basis = _replanned(failure, course.basis, replan, settings, go_on)
            except stragglers_.PlanReplaced as change:
                _log_replaced(change)
                course.plan, course.speeds, course.resume_from = change.plan, change.speeds, settings.save
                course.basis = dataclasses.replace(course.basis, cluster=change.cluster)
    finally:
        # The vote's group (and its gloo threads) would outlive the run in a process that runs several jobs.
        torch.distributed.destroy_process_group(group)


@dataclass(frozen=True)
class _StragglerSetup:
    policy: Policy
    base_cluster: ClusterSpec
    """The job's cluster before any measured speed."""
    replan: Replanner
    restart: bool


def _train_attempt(course: _Course, settings: TrainSettings, info, group, injection: Optional[oom.InjectedOom],
                   setup: _StragglerSetup) -> None:
    """Build the session for the course's plan and train it, the first iterations guarded and checked, every
    iteration watched for stragglers."""
    rank = torch.distributed.get_rank()
    plan, basis = course.plan, course.basis
    job = sessions.build_session(plan, basis.model, settings, info.backend, info.device)
    if course.resume_from:
        sessions.resume(job, course.resume_from)
    elif settings.starts_from_checkpoint:
        sessions.resume(job)
    stop = sessions.stop_iteration(job.settings)
    watch = stragglers_.watch_for(job, plan, basis, course.speeds, setup.policy, setup.base_cluster,
                                  setup.replan, setup.restart, rank)
    try:
        check = MemoryCheck(plan, basis, rank, job.iteration, stop)
    except (UserError, ValueError) as error:  # a hand-made plan the cost model cannot price
        logger.info("rank %d: memory not checked: the cost model cannot price this plan (%s)", rank, error)
        sessions.train(job)
        return
    budget = basis.training.budget_for(basis.cluster.gpu.capacity_bytes)
    guard = oom.OomGuard(lambda s: sessions.run_iteration(s), group, check.predicted_bytes, budget,
                         check.check_at, injection)
    oom.install_injection(job, injection, rank)
    try:
        sessions.train(job, run=guard, after_iteration=_both(check, watch))
    except (oom.PlanDidNotFit, stragglers_.PlanReplaced):
        oom.release(job)
        raise


def _both(check: MemoryCheck, watch):
    if watch is None:
        return check

    def after_iteration(session, result) -> None:
        check(session, result)
        watch(session, result)
    return after_iteration


def _log_replaced(change: stragglers_.PlanReplaced) -> None:
    if sessions.is_logging_rank():
        logger.warning("stragglers: %s; re-planned, resuming from the checkpoint just saved with: %s", change.reason,
                       _flags_text(change.plan))


def _replanned(failure: oom.PlanDidNotFit, basis: PlanBasis, replan: Replanner, settings: TrainSettings,
               go_on: bool) -> tuple[Plan, PlanBasis]:
    """The search's plan under the lowered budget and its basis; a UserError naming it unless `go_on`."""
    budget_gib = failure.budget_bytes / GIB
    try:
        plan = replan(basis.cluster, failure.budget_bytes)
    except UserError as error:
        raise UserError(f"{failure.summary()}; no plan fits the lowered budget of {budget_gib:.2f} GiB: "
                        f"{error}") from None
    if not go_on:
        raise stop_with_replan(failure, plan, settings)
    if sessions.is_logging_rank():
        logger.warning("%s: re-planned under a %.2f GiB budget; starting again with: %s", failure.summary(),
                       budget_gib, _flags_text(plan))
    training = dataclasses.replace(basis.training, memory_budget_bytes=failure.budget_bytes)
    return plan, dataclasses.replace(basis, training=training)


def replan_path(settings: TrainSettings) -> Path:
    """Where the re-planned plan is written: beside the checkpoints, else in the working directory."""
    return Path(settings.save or os.getcwd()) / REPLAN_FILE


def stop_with_replan(failure: oom.PlanDidNotFit, plan: Plan, settings: TrainSettings) -> UserError:
    """Write `plan` (every rank writes the same bytes, atomically) and the one-line error naming it."""
    path = replan_path(settings)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f"{path.name}.rank{torch.distributed.get_rank()}")
    save_plan(plan, partial)
    os.replace(partial, path)
    return UserError(f"{failure.summary()}; re-planned under a {failure.budget_bytes / GIB:.2f} GiB budget: "
                     f"run with --auto-parallel-plan {path} ({_flags_text(plan)})")


def _flags_text(plan: Plan) -> str:
    if plan.space != "megatron":
        return "a hybrid-space plan"
    return "megatron-lm flags: " + " ".join(megatron_flags(plan))
