"""Train a plan and prove that it fits: the memory check after warm-up, and on an out-of-memory
error in the first iterations a re-plan under a lower budget (runtime.oom).

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
from pathlib import Path
from typing import Callable, Optional

import torch

from ..errors import UserError
from ..megatron_flags import megatron_flags
from ..plan import Plan, save_plan
from ..specs.training import GIB
from . import memory_check, oom
from . import session as sessions
from .memory_check import MemoryCheck, PlanBasis
from .settings import TrainSettings

logger = logging.getLogger(__name__)

MAX_ATTEMPTS = 3
"""Plans tried in one process before the job stops with the last re-plan."""
REPLAN_FILE = "auto_parallel_replan.json"


Replanner = Callable[[int], Plan]
"""The search's plan for the job under a memory budget in bytes (raises UserError if none fits)."""


def train_fitting(plan: Plan, basis: PlanBasis, settings: TrainSettings, info, replan: Replanner,
                  restart: bool) -> Plan:
    """Train `plan` (from a checkpoint when settings.load or pretrained_checkpoint), re-planning on an early
    OOM; returns the plan that trained. `info`: distributed.DeviceInfo."""
    rank = torch.distributed.get_rank()
    group = oom.agreement_group(settings.timeout_s)
    memory_check.log_device_memory_at_start(info.device, rank)
    injection = oom.injected_oom()
    try:
        for attempt in range(MAX_ATTEMPTS):
            try:
                _train_attempt(plan, basis, settings, info, group, injection if attempt == 0 else None)
                return plan
            except oom.PlanDidNotFit as failure:
                go_on = restart and failure.restartable and attempt + 1 < MAX_ATTEMPTS
                plan, basis = _replanned(failure, basis, replan, settings, go_on)
        raise AssertionError("unreachable: the last attempt stops with a UserError")
    finally:
        # The vote's group (and its gloo threads) would outlive the run in a process that runs several jobs.
        torch.distributed.destroy_process_group(group)


def _train_attempt(plan: Plan, basis: PlanBasis, settings: TrainSettings, info, group,
                   injection: Optional[oom.InjectedOom]) -> None:
    """Build the session for `plan` and train it, the first iterations guarded and checked."""
    rank = torch.distributed.get_rank()
    job = sessions.build_session(plan, basis.model, settings, info.backend, info.device)
    if settings.starts_from_checkpoint:
        sessions.resume(job)
    stop = sessions.stop_iteration(job.settings)
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
        sessions.train(job, run=guard, after_iteration=check)
    except oom.PlanDidNotFit:
        oom.release(job)
        raise


def _replanned(failure: oom.PlanDidNotFit, basis: PlanBasis, replan: Replanner, settings: TrainSettings,
               go_on: bool) -> tuple[Plan, PlanBasis]:
    """The search's plan under the lowered budget and its basis; a UserError naming it unless `go_on`."""
    budget_gib = failure.budget_bytes / GIB
    try:
        plan = replan(failure.budget_bytes)
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
