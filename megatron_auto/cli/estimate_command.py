"""`megatron-auto estimate`: predict the time and memory of Megatron flags or of a plan file."""
from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from typing import Optional

from ..cost.estimate import estimate_plan
from ..errors import UserError
from ..parallel_dims import ParallelDims
from ..megatron_flags import FSDP_SHARDING, flag_groups
from ..pipeline_layout import LAYOUT_FLAG, chunk_layers_of_layout, mtp_chunk_of_layout
from ..plan import Plan, load_plan
from ..report import plan_table
from ..search.uniform import (UniformConfig, best_uniform_plan, build_uniform_plan, stage_layer_counts,
                              virtual_stage_choices)
from ..search.uneven_split import best_split_plan, splits_as_given
from ..specs import ClusterSpec, load_model
from ..specs.training import recompute_modules_problem
from .job import (attach_profiles, distributed_optimizer_arg, fit_cluster_to_world, graph_recompute_problem,
                  load_cluster_arg, load_job, offload_job_problem, sequence_parallel_flag, training_spec,
                  with_speeds)
from .output import flags_or_none, print_json, summary, write_plan

SPLIT_FLAGS = ("decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers",
               "account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split",
               "pipeline_model_parallel_layout")
SPLIT_FLAG_SPELLINGS = (*(f"--{name.replace('_', '-')}" for name in SPLIT_FLAGS[:-1]), LAYOUT_FLAG)
"""Megatron-LM's spelling of each of SPLIT_FLAGS."""
LAYOUT_FLAGS = ("tp", "pp", "dp", "cp", "micro_batch_size", "virtual_stages", "recompute",
                "sequence_parallel", "distributed_optimizer", "ep", "etp", "use_megatron_fsdp", "recompute_num_layers",
                *SPLIT_FLAGS)


def check_dp(args: argparse.Namespace, cluster: ClusterSpec) -> None:
    """--tp x --pp (x --cp) must divide the world, and --dp, when given, must be what is left."""
    try:
        ParallelDims.for_world(cluster.world_size, tp=args.tp, pp=args.pp, cp=args.cp or 1, dp=args.dp)
    except UserError as error:
        raise UserError(f"{error} ({cluster.num_nodes} node(s) x {cluster.gpus_per_node} GPUs)") from None


def split_from_args(args: argparse.Namespace, num_layers: int) -> tuple[Optional[tuple[int, ...]], tuple[bool, bool]]:
    """(stage_layers, account_for) of --decoder-first/last-pipeline-num-layers and
    --account-for-embedding/loss-in-pipeline-split, which Megatron-LM does not combine."""
    first, last = args.decoder_first_pipeline_num_layers, args.decoder_last_pipeline_num_layers
    account_for = (bool(args.account_for_embedding_in_pipeline_split), bool(args.account_for_loss_in_pipeline_split))
    if any(account_for) and (first is not None or last is not None):
        raise UserError("--account-for-embedding/loss-in-pipeline-split cannot go with "
                        "--decoder-first/last-pipeline-num-layers (as in Megatron-LM)")
    if first is None and last is None:
        return None, account_for
    if args.pp == 1:
        raise UserError("--decoder-first/last-pipeline-num-layers need --pp 2 or more")
    return tuple(stage_layer_counts(num_layers, args.pp, first, last)), account_for


def layout_from_args(args: argparse.Namespace, num_layers: int) -> Optional[tuple[int, ...]]:
    """The chunks of --pipeline-model-parallel-layout, which Megatron-LM takes alone of the split flags."""
    if args.pipeline_model_parallel_layout is None:
        return None
    others = [f"--{name.replace('_', '-')}" for name in (*SPLIT_FLAGS[:-1], "virtual_stages")
              if getattr(args, name) is not None]
    if others:
        raise UserError(f"{LAYOUT_FLAG} cannot go with {', '.join(others)} (the layout fixes the chunks)")
    return chunk_layers_of_layout(args.pipeline_model_parallel_layout, args.pp, num_layers)


def fsdp_stage(args: argparse.Namespace) -> int:
    """The ZeRO stage of --use-megatron-fsdp's --data-parallel-sharding-strategy (0 without the flag)."""
    if not getattr(args, "use_megatron_fsdp", None):
        return 0
    return {name: zero for zero, name in FSDP_SHARDING.items()}[args.data_parallel_sharding_strategy]


def recompute_num_layers(args: argparse.Namespace) -> Optional[int]:
    """--recompute-num-layers, which Megatron-LM reads with full recomputation only."""
    layers = getattr(args, "recompute_num_layers", None)
    if layers is not None and args.recompute != "full":
        raise UserError("--recompute-num-layers needs --recompute full (as in Megatron-LM)")
    return layers


def config_from_args(args: argparse.Namespace, num_layers: int) -> UniformConfig:
    chunk_layers = layout_from_args(args, num_layers)
    stage_layers, account_for = split_from_args(args, num_layers)
    virtual = len(chunk_layers) // args.pp if chunk_layers else args.virtual_stages or 1
    sharding = fsdp_stage(args)
    return UniformConfig(
        tp=args.tp, pp=args.pp, micro_batch_size=args.micro_batch_size or 1,
        vp=virtual, sequence_parallel=bool(sequence_parallel_flag(args)),
        distributed_optimizer=bool(distributed_optimizer_arg(args)) or sharding == 1,
        recompute=args.recompute or "none", fsdp_sharding=sharding if sharding >= 2 else 0,
        recompute_num_layers=recompute_num_layers(args),
        stage_layers=stage_layers, account_for=account_for, chunk_layers=chunk_layers,
        mtp_chunk=mtp_chunk_of_layout(args.pipeline_model_parallel_layout) if chunk_layers else None,
        ep=args.ep or 1, etp=args.etp, cp=args.cp or 1,
    )


def estimate_flags(args: argparse.Namespace) -> tuple[Plan, list[str]]:
    """The plan Megatron runs for --tp/--pp/...; picks micro-batch and virtual stages when absent, and, when no
    split flag is given and the layers do not split evenly, the pipeline split (best_split_plan)."""
    if args.tp is None or args.pp is None:
        raise UserError("estimate needs --tp and --pp (or --plan FILE)")
    model, cluster, training = load_job(args)
    check_dp(args, cluster)
    config = config_from_args(args, model.num_layers)
    fixed_virtual = args.virtual_stages or config.chunk_layers
    picked = [name for name, value in (("micro_batch_size", args.micro_batch_size),
                                       ("virtual_stages", fixed_virtual)) if not value]
    if all(getattr(args, name) is None for name in SPLIT_FLAGS) and not splits_as_given(model, config):
        plan = best_split_plan(model, cluster, training, config, choose_micro_batch="micro_batch_size" in picked,
                               choose_virtual_stages="virtual_stages" in picked)
        return plan, ["pipeline_split", *picked]
    plan = build_uniform_plan(model, cluster, training, config)  # surfaces the specific reason it cannot work
    if picked:
        # The split flags hold with one chunk per stage too (then the first and last stage hold one layer fewer).
        virtual = [1, *virtual_stage_choices(model, config)] if any(config.account_for) else None
        plan = best_uniform_plan(model, cluster, training, config, choose_micro_batch="micro_batch_size" in picked,
                                 choose_virtual_stages="virtual_stages" in picked, virtual_choices=virtual)
    else:
        plan = replace(plan, prediction=estimate_plan(plan, model, cluster, training))
    return plan, picked


def estimate_file(args: argparse.Namespace) -> Plan:
    """Score a plan file; model and cluster from the flags or from what the plan records."""
    given = [f"--{name.replace('_', '-')}" for name in LAYOUT_FLAGS if getattr(args, name) is not None]
    if given:
        raise UserError(f"{', '.join(given)} cannot be combined with --plan (the plan fixes the layout)")
    plan = load_plan(args.plan)
    if args.model is not None:
        model = load_model(args.model)
    elif plan.model is not None:
        model = plan.model
    else:
        raise UserError(f"plan file '{args.plan}' does not record its model; give --model")
    cluster_name = args.cluster or plan.cluster
    if not cluster_name:
        raise UserError(f"plan file '{args.plan}' does not record its cluster; give --cluster")
    try:
        cluster = load_cluster_arg(cluster_name, args.num_nodes, args.gpus_per_node)
    except UserError as error:
        if args.cluster:
            raise
        raise UserError(f"the plan's cluster '{cluster_name}' cannot be loaded ({error}); give --cluster") from None
    cluster = with_speeds(attach_profiles(fit_cluster_to_world(cluster, plan.world_size, args), args), args)
    training = training_spec(args, cluster.name, args.global_batch_size or plan.global_batch_size)
    problem = (recompute_modules_problem(model.layers, training.recompute_modules)
               or offload_job_problem(cluster, training, ()))
    if problem:
        raise UserError(problem)
    return replace(plan, prediction=estimate_plan(plan, model, cluster, training))


def pipeline_split_flags(plan: Plan) -> list[str]:
    """The Megatron-LM flags of the plan's pipeline split, as its megatron_flags spell them ([] for an even split;
    the chunk size of --num-layers-per-virtual-pipeline-stage belongs to the virtual stages)."""
    groups = flag_groups(flags_or_none(plan) or [])
    return [token for group in groups if group[0] in SPLIT_FLAG_SPELLINGS for token in group]


def picked_values(plan: Plan, picked: list[str]) -> dict:
    """What `estimate` picked, by name: the split as its Megatron-LM flags, the other values as the summary has them."""
    data = summary(plan)
    return {name: pipeline_split_flags(plan) if name == "pipeline_split" else data[name] for name in picked}


def _picked_line(plan: Plan, picked: list[str]) -> str:
    values = {"micro_batch_size": f"micro-batch size {plan.local_micro_batch(plan.embedding)}",
              "virtual_stages": f"virtual stages {plan.virtual_stages}",
              "pipeline_split": f"pipeline split {' '.join(pipeline_split_flags(plan))}"}
    named = [values[name] for name in picked]
    listed = ", ".join(named[:-1]) + " and " + named[-1] if len(named) > 1 else named[0]
    return f"picked {listed} (the fastest that fits)\n"


def run_estimate(args: argparse.Namespace) -> int:
    for flag, value in (("--tp-comm-overlap", args.tp_comm_overlap), ("--cuda-graph-impl", args.cuda_graph_impl),
                        ("--fine-grained-activation-offloading", args.fine_grained_activation_offloading),
                        ("--use-precision-aware-optimizer", args.use_precision_aware_optimizer),
                        ("--overlap-moe-expert-parallel-comm", args.overlap_moe_expert_parallel_comm),
                        ("--cp-comm-type", args.cp_comm_type)):
        if value == "search":
            raise UserError(f"{flag} search is plan's choice; estimate prices the flags given")
    problem = graph_recompute_problem(args)
    if problem:
        raise UserError(problem)
    if args.plan is not None:
        plan, picked = estimate_file(args), []
    else:
        plan, picked = estimate_flags(args)
    write_plan(plan, args.out)
    if args.json:
        print_json({**summary(plan), "picked": picked_values(plan, picked)})
    else:
        sys.stdout.write((_picked_line(plan, picked) + "\n" if picked else "") + plan_table(plan))
    return 0
