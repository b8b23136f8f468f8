"""The plan a run uses (a plan file's, the search's under --auto-parallel, or the launch line's flags'),
what it is priced under, and the checks that it runs before any work."""
from __future__ import annotations

import argparse
import dataclasses
import math
from typing import Optional

from megatron_auto.cli.job import CPU_CLUSTER_PRESET
from megatron_auto.errors import UserError
from megatron_auto.kernel_choice import resolve_attention_backend, resolve_bias_fusions, resolve_optimizer_impl
from megatron_auto.runtime.manual_plan import ManualParallelism, plan_from_flags
from megatron_auto.runtime.settings import TrainSettings
from megatron_auto.search.constraints import SearchConstraints
from megatron_auto.specs.model import ModelSpec
from megatron_auto.specs.training import TrainingSpec, recompute_modules_problem

from .log import logger


def manual_flags(args: argparse.Namespace) -> ManualParallelism:
    """The launch line's parallelism flags, with Megatron-LM's defaults where absent."""
    return ManualParallelism(
        tp=args.tensor_model_parallel_size or 1, pp=args.pipeline_model_parallel_size or 1,
        micro_batch_size=args.micro_batch_size, global_batch_size=args.global_batch_size,
        layers_per_virtual_stage=args.num_layers_per_virtual_pipeline_stage,
        first_stage_layers=args.decoder_first_pipeline_num_layers, last_stage_layers=args.decoder_last_pipeline_num_layers,
        account_for_embedding=args.account_for_embedding_in_pipeline_split,
        account_for_loss=args.account_for_loss_in_pipeline_split,
        pipeline_layout=args.pipeline_model_parallel_layout,
        recompute_granularity=args.recompute_granularity, recompute_method=args.recompute_method,
        recompute_num_layers=args.recompute_num_layers, sequence_parallel=bool(args.sequence_parallel),
        distributed_optimizer=bool(args.use_distributed_optimizer),
        ep=args.expert_model_parallel_size or 1, etp=args.expert_tensor_parallel_size,
        cp=args.context_parallel_size)


def search_constraints(args: argparse.Namespace, model: ModelSpec) -> SearchConstraints:
    """The explicit parallelism flags, as constraints on the search."""
    virtual = None
    if args.num_layers_per_virtual_pipeline_stage and args.pipeline_model_parallel_size:
        virtual = model.num_layers // (args.num_layers_per_virtual_pipeline_stage * args.pipeline_model_parallel_size)
    # A growing batch keeps --micro-batch-size (every batch of the ramp must split into micro-batches).
    micro_batch = args.micro_batch_size if args.batch_ramp is not None else None
    return SearchConstraints(tp=args.tensor_model_parallel_size, pp=args.pipeline_model_parallel_size,
                             micro_batch_size=micro_batch,
                             vp=virtual, sequence_parallel=None,  # SP: the planner's choice
                             distributed_optimizer=args.use_distributed_optimizer,
                             recompute=args.recompute_granularity, ep=args.expert_model_parallel_size,
                             etp=args.expert_tensor_parallel_size,
                             cp=args.context_parallel_size if args.context_parallel_size > 1 else None)


def training_for_job(args: argparse.Namespace, settings: TrainSettings, world_size: int) -> TrainingSpec:
    """What the search prices: the global batch, the precision, the kernels this run resolves to (Transformer
    Engine's layer spec, with its fused norms, where it imports on a GPU) and the memory margin."""
    from megatron_auto.runtime.kernels import cuda_host, transformer_engine_available

    global_batch = args.global_batch_size or args.micro_batch_size * world_size
    # A dry run prices the named GPU cluster's kernels, wherever it runs.
    on_gpu = cuda_host() or (args.auto_parallel_dry_run and args.auto_parallel_cluster is not None
                                           and args.auto_parallel_cluster != CPU_CLUSTER_PRESET)
    common = dict(attention_backend=resolve_attention_backend(settings.attention_backend, on_gpu),
                  optimizer_impl=resolve_optimizer_impl(settings.optimizer_impl, on_gpu),
                  memory_margin=args.auto_parallel_memory_margin,
                  moe_token_dispatcher=settings.moe.token_dispatcher, moe_grouped_gemm=settings.moe.grouped_gemm,
                  moe_shared_expert_overlap=settings.moe.shared_expert_overlap,
                  recompute_modules=settings.recompute_modules,
                  fused_norms=on_gpu and transformer_engine_available(),
                  # The fused bias + activation as runtime/kernels.choose_kernels resolves it; RoPE stays unfused.
                  bias_activation_fusion=resolve_bias_fusions(settings.bias_fusions, on_gpu)
                  and settings.bias_activation_fusion,
                  # `auto` fuses on a GPU (once the stand-in's start-up check passes): cli.job prices the same.
                  grad_accumulation_fusion=settings.grad_accumulation_fusion == "on"
                  or (settings.grad_accumulation_fusion == "auto" and on_gpu))
    return TrainingSpec.for_precision(settings.precision, global_batch, **common)


def choose_plan(args: argparse.Namespace, model: ModelSpec, world_size: int, settings: TrainSettings,
                gpus_per_node: Optional[int] = None):
    """The plan this run uses: the plan file's, the search's (on nodes of `gpus_per_node` GPUs when given,
    LOCAL_WORLD_SIZE) or the launch line's flags'."""
    from megatron_auto.runtime import planning

    if args.auto_parallel_plan:
        return planning.plan_from_file(args.auto_parallel_plan, model, world_size)
    if not args.auto_parallel:
        return plan_from_flags(model, world_size, manual_flags(args))
    constraints = search_constraints(args, model)
    search = lambda constraints: planning.search_for_job(  # noqa: E731
        model, world_size, args.auto_parallel_cluster, training_for_job(args, settings, world_size), constraints,
        args.auto_parallel_space, args.auto_parallel_profile, choose_recompute_modules=args.recompute_modules is None,
        gpus_per_node=gpus_per_node)
    plan = search(constraints)
    if args.batch_ramp is None or _ramp_splits(args, plan):
        return plan
    # Every batch of a growing batch must split over the replicas: the widest data parallelism that does.
    unit = math.gcd(*args.batch_ramp.batch_sizes(args.global_batch_size)) // args.micro_batch_size
    for dp in sorted((d for d in range(1, world_size + 1) if world_size % d == 0 and unit % d == 0), reverse=True):
        try:
            return search(dataclasses.replace(constraints, dp=dp))
        except UserError:
            continue
    return plan  # session.build_session names the batch that does not split


def overridden_flags(args: argparse.Namespace, plan) -> list[str]:
    """The launch line's flags that a searched megatron-space plan sets otherwise, as `--flag given -> planned`.
    The other parallelism flags are constraints of the search (search_constraints) and hold; --micro-batch-size
    is the search's to choose (Megatron-LM's launch lines always give one) except under a batch ramp (sequence
    parallelism, its choice too, has its own adjustment line)."""
    if plan.space != "megatron":
        return []
    planned_mbs = plan.local_micro_batch(plan.embedding)  # what megatron_flags writes as --micro-batch-size
    if args.micro_batch_size and args.micro_batch_size != planned_mbs:
        return [f"--micro-batch-size {args.micro_batch_size} -> {planned_mbs}"]
    return []


def override_lines(args: argparse.Namespace, plan) -> list[str]:
    """Under --auto-parallel, one line naming every launch-line flag the searched plan overrides (the run's
    header and the dry run log it with the other adjustments)."""
    changed = overridden_flags(args, plan) if args.auto_parallel and not args.auto_parallel_plan else []
    if not changed:
        return []
    return [f"--auto-parallel overrides {', '.join(changed)} (the search's choice; the other parallelism flags "
            "given are constraints)"]


def _ramp_splits(args: argparse.Namespace, plan) -> bool:
    """Whether every batch of the ramp splits into micro-batches over `plan`'s data-parallel replicas."""
    from megatron_auto.runtime.layout import layout_from_plan

    if plan.space != "megatron":
        return True
    layout = layout_from_plan(plan)
    unit = layout.micro_batch_size * layout.dims.dp
    return all(batch % unit == 0 for batch in args.batch_ramp.batch_sizes(args.global_batch_size))


def with_plan_recompute_modules(args: argparse.Namespace, settings: TrainSettings, plan) -> TrainSettings:
    """`settings` re-running what the plan's selective recomputation was priced with, when --recompute-modules
    was not given (the planner chose it, or the plan file records it)."""
    if args.recompute_modules is not None or plan.prediction is None:
        return settings
    return dataclasses.replace(settings, recompute_modules=tuple(plan.prediction.recompute_modules))


def check_plan_runs(plan, settings: TrainSettings, model: ModelSpec) -> None:
    """Before any work: what the chosen plan's global batch or its runtime cannot run (UserError)."""
    from megatron_auto.runtime.validation import check_global_batch

    check_global_batch(settings, plan.global_batch_size)
    if settings.rotary_interleaved and any(layer.mla is not None for layer in model.layers):
        raise UserError("--rotary-interleaved does not work with --multi-latent-attention (megatron-core's "
                        "TransformerConfig)")
    problem = recompute_modules_problem(model.layers, settings.recompute_modules)
    if problem:
        raise UserError(problem)
    for strategy in plan.distinct_strategies | {plan.embedding}:
        if strategy.sp and strategy.tp > 1 and model.seq_length % strategy.tp:
            raise UserError(f"--sequence-parallel splits the sequence over tensor parallel {strategy.tp}: "
                            f"--seq-length {model.seq_length} must be divisible by it")
    if plan.space == "hybrid":
        from megatron_auto.runtime.hybrid.hybrid_runtime import check_supported

        check_supported(plan, model)
    priced = plan.prediction.recompute_modules if plan.prediction is not None else settings.recompute_modules
    if tuple(priced) != settings.recompute_modules and plan.recomputes_selectively:
        raise UserError(f"the plan's selective recompute was priced re-running {' '.join(priced)}; this run's "
                        f"--recompute-modules is {' '.join(settings.recompute_modules)}: give --recompute-modules "
                        f"{' '.join(priced)} to run the plan as priced")


def plan_basis(args: argparse.Namespace, plan, model: ModelSpec, world_size: int, settings: TrainSettings,
               gpus_per_node: Optional[int] = None):
    """The cluster (in nodes of `gpus_per_node` GPUs when given) and training spec the plan is priced under
    (runtime.memory_check.PlanBasis); None when no cluster preset matches the device of a run that did not search."""
    from megatron_auto.runtime import planning
    from megatron_auto.runtime.memory_check import PlanBasis

    try:
        cluster = planning.job_cluster(world_size, args.auto_parallel_cluster, args.auto_parallel_profile,
                                       gpus_per_node)
    except UserError:
        if args.auto_parallel:
            raise
        logger.info("no cluster preset for this device: the plan's memory is not checked")
        return None
    training = dataclasses.replace(training_for_job(args, settings, world_size),
                                   global_batch_size=plan.global_batch_size)
    return PlanBasis(plan.model or model, cluster, training)


def replanner(args: argparse.Namespace, basis):
    """The search's plan for the job on a cluster (the job's own, or with measured node speeds) under a memory
    budget in bytes (0: the cluster's), with --auto-parallel's constraints (none when the plan came from flags or
    a file: the planner's free choice is the suggestion)."""
    from megatron_auto.search import search_plan

    constraints = search_constraints(args, basis.model) if args.auto_parallel else SearchConstraints()
    return lambda cluster, budget: search_plan(
        basis.model, cluster, dataclasses.replace(basis.training, memory_budget_bytes=budget),
        args.auto_parallel_space, constraints).plan
