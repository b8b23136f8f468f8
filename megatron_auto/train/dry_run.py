"""--auto-parallel-dry-run: the plan and its prediction, beside the launch line's own flags priced alike."""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from typing import Optional

from megatron_auto.errors import UserError
from megatron_auto.runtime.manual_plan import plan_from_flags
from megatron_auto.runtime.settings import TrainSettings
from megatron_auto.specs.model import ModelSpec

from .log import logger
from .plan_choice import manual_flags, plan_basis


def own_flags_plan(args: argparse.Namespace, model: ModelSpec, world_size: int, basis):
    """The plan of the launch line's own parallelism flags (Megatron-LM's defaults where absent), priced under
    `basis`; or None and why it is no layout here."""
    from megatron_auto.cost.estimate import estimate_plan

    flags = manual_flags(args)
    flags = dataclasses.replace(flags, sequence_parallel=flags.sequence_parallel and flags.tp > 1)
    try:
        own = plan_from_flags(model, world_size, flags)
        training = dataclasses.replace(basis.training, global_batch_size=own.global_batch_size)
        return dataclasses.replace(own, prediction=estimate_plan(own, basis.model, basis.cluster, training)), None
    except UserError as error:
        return None, str(error)


def dry_run(args: argparse.Namespace, adjustments: list[str], plan, model: ModelSpec, world_size: int,
            settings: TrainSettings, gpus_per_node: Optional[int] = None) -> None:
    """--auto-parallel-dry-run: the plan and its prediction on stdout, and under --auto-parallel (or a plan file)
    the line's own flags priced on the same cluster (in nodes of `gpus_per_node` GPUs when given); rank 0 only."""
    from megatron_auto.cost.estimate import estimate_plan
    from megatron_auto.report import comparison_lines, node_group_lines, plan_table
    from megatron_auto.runtime.planning import describe_job_cluster

    if int(os.environ.get("RANK", "0")) != 0:
        return
    for line in adjustments:
        logger.warning("%s", line)
    basis = plan_basis(args, plan, model, world_size, settings, gpus_per_node)
    if basis is None:
        raise UserError("--auto-parallel-dry-run: no cluster preset for this device; name one with "
                        "--auto-parallel-cluster PRESET|FILE.json")
    logger.info("%s", describe_job_cluster(basis.cluster, world_size, gpus_per_node))
    if plan.prediction is None or args.auto_parallel_plan:  # a plan file's prediction was priced elsewhere
        plan = dataclasses.replace(plan, prediction=estimate_plan(plan, basis.model, basis.cluster, basis.training))
    text = plan_table(plan) + "".join(f"{line}\n" for line in node_group_lines(plan, basis.cluster))
    if args.auto_parallel or args.auto_parallel_plan:
        text += "\n" + "\n".join(comparison_lines(plan, *own_flags_plan(args, model, world_size, basis))) + "\n"
    sys.stdout.write(text)  # the dry run's product is this table on stdout, as `megatron-auto show` prints it
    sys.stdout.flush()
