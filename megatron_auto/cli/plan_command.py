"""`megatron-auto plan`: search for the fastest plan that fits, print it, write it."""
from __future__ import annotations

import argparse
import logging
import sys
from dataclasses import replace

from ..cost.estimate import estimate_plan
from ..errors import UserError
from ..report import node_group_lines, plan_table
from ..search.constraints import SearchConstraints
from .estimate_command import fsdp_stage
from .job import distributed_optimizer_arg, graph_recompute_problem, knob_switches, load_job, sequence_parallel_flag
from .output import print_json, summary, write_plan
from .progress import ProgressBar

logger = logging.getLogger(__name__)


def constraints_from_args(args: argparse.Namespace) -> SearchConstraints:
    """The layout flags the user pinned; everything left out is the search's to choose. --use-megatron-fsdp pins
    its sharding strategy's ZeRO stage (1: the distributed optimizer, 0: neither)."""
    sharding, distributed = fsdp_stage(args), distributed_optimizer_arg(args)
    if getattr(args, "use_megatron_fsdp", None) and sharding < 2:
        distributed = sharding == 1
    return SearchConstraints(
        tp=args.tp, pp=args.pp, dp=args.dp, micro_batch_size=args.micro_batch_size,
        vp=args.virtual_stages, sequence_parallel=sequence_parallel_flag(args),
        distributed_optimizer=distributed, recompute=args.recompute,
        ep=args.ep, etp=args.etp, cp=args.cp,
        fsdp_sharding=sharding if sharding >= 2 else None,
    )


OUTER_RULE_REASONS = {
    "pp-at-most-layers": "every pipeline stage needs at least one layer",
    "invalid-flags": "Megatron rejects the combination (batch or layers do not divide)",
    "lower-bound": "a bound proved the (pipeline degree, micro-batch) pair slower than the best so far",
    "cp-long-sequences": "context parallelism where each CP rank keeps at least 2048 tokens of a sequence",
    "cp-comm-type": "context parallelism that Transformer Engine's attention does not run with this --cp-comm-type",
}


def log_search(result) -> None:
    """--verbose: what each decision-tree rule pruned (and why), and where the search's time went."""
    from ..search.space import RULES

    reasons = {**OUTER_RULE_REASONS, **{rule.name: rule.reason for rule in RULES}}
    for rule, removed in result.pruning:
        logger.info("pruned %6d by %-30s (%s)", removed, rule, reasons.get(rule, "outer-loop rule"))
    for phase, seconds in result.timings:
        share = 100.0 * seconds / result.search_time_s if result.search_time_s else 0.0
        logger.info("time %8.3f s %5.1f%%  %s", seconds, share, phase)


def search_choices(args: argparse.Namespace) -> dict:
    """What `plan` leaves to the search beyond the layout: the recompute modules unless given, TP overlap under
    `search`, and the run-wide switches (search_plan's keyword arguments)."""
    return dict(choose_recompute_modules=args.recompute_modules is None,
                choose_tp_comm_overlap=args.tp_comm_overlap == "search", switches=knob_switches(args))


def run_plan(args: argparse.Namespace) -> int:
    problem = graph_recompute_problem(args)
    if problem:
        raise UserError(problem)
    model, cluster, training = load_job(args)
    from ..search import search_plan  # after the inputs are checked: the search is the heavy import

    constraints = constraints_from_args(args)
    logger.info("searching the %s space for %s on %d GPUs (%s)", args.space, model.name,
                cluster.world_size, cluster.name)
    with ProgressBar("searching") as progress:
        result = search_plan(model, cluster, training, space=args.space, constraints=constraints,
                             progress=progress, **search_choices(args))
    plan = result.plan
    if plan.prediction is None:
        plan = replace(plan, prediction=estimate_plan(plan, model, cluster, training))
    log_search(result)
    write_plan(plan, args.out)
    groups = node_group_lines(plan, cluster)
    if args.json:
        print_json({**summary(plan), "search_time_s": result.search_time_s,
                    "candidates_evaluated": result.candidates_evaluated,
                    "pruning": [[rule, removed] for rule, removed in result.pruning],
                    **({"node_groups": [line.strip() for line in groups[1:]]} if groups else {})})
    else:
        sys.stdout.write(plan_table(plan) + "".join(f"{line}\n" for line in groups))
        sys.stderr.write(f"searched {result.candidates_evaluated} candidates in {result.search_time_s:.2f} s"
                         + (f"; wrote {args.out}" if args.out else "") + "\n")
    return 0
