"""Megatron-LM's cross-flag checks (its arguments.validate_args asserts) as named validators.

Each `*_error` returns one line naming what is wrong, or None; none of them edits the namespace it reads.
What the older spellings and the growing-batch flags derive is returned (`recompute_from_flags`,
`batch_ramp_from_flags`) for the parser to set.
"""
from __future__ import annotations

import argparse
from typing import NamedTuple, Optional

from megatron_auto.errors import UserError
from megatron_auto.runtime.batch_schedule import BatchRamp, parse_step_schedule
from megatron_auto.specs.training import DEFAULT_RECOMPUTE_MODULES, RECOMPUTE_MODULES

from .arguments_data import PER_SPLIT_DATA_FLAGS, per_split_paths
from .arguments_model import position_embedding_type


def moe_layer_recompute_error(args: argparse.Namespace) -> Optional[str]:
    """--moe-layer-recompute with full granularity, which megatron-core 0.16.1's TransformerConfig refuses."""
    if args.moe_layer_recompute and args.recompute_granularity == "full":
        return "do not set --moe-layer-recompute with full recompute granularity (as in Megatron-Core)"
    return None


def recompute_from_flags(args: argparse.Namespace) -> tuple[Optional[str], Optional[list[str]]]:
    """(granularity, modules) once Megatron-LM's older spellings are read: --recompute-activations is selective
    granularity; --moe-layer-recompute is selective with `moe` added to the modules (the default's core_attn
    kept), as megatron-core 0.16.1's TransformerConfig reads it."""
    granularity, modules = args.recompute_granularity, args.recompute_modules
    if args.recompute_activations and granularity is None:
        granularity = "selective"
    if args.moe_layer_recompute and granularity != "full":
        modules = list(modules or DEFAULT_RECOMPUTE_MODULES)
        return "selective", modules + ["moe"] * ("moe" not in modules)
    return granularity, modules


class BatchRampFlags(NamedTuple):
    """What the growing-batch flags give: the ramp (None: a fixed batch), the global batch it ends at, or why
    the flags are refused."""
    ramp: Optional[BatchRamp]
    global_batch_size: Optional[int]
    error: Optional[str] = None


def batch_ramp_from_flags(args: argparse.Namespace) -> BatchRampFlags:
    """Megatron-LM's checks of the growing-batch flags, and the ramp and global batch they give (a step
    schedule's global batch is its last batch)."""
    refused = lambda error: BatchRampFlags(None, args.global_batch_size, error)  # noqa: E731
    if args.rampup_batch_size and args.step_batch_size_schedule:
        return refused("give --rampup-batch-size or --step-batch-size-schedule, not both")
    if args.rampup_batch_size:
        if args.train_samples is None:
            return refused("--rampup-batch-size needs --train-samples (Megatron-LM: no batch-size ramp-up for "
                           "iteration-based training)")
        if args.global_batch_size is None:
            return refused("--rampup-batch-size needs --global-batch-size (the batch the ramp-up ends at)")
        return BatchRampFlags(BatchRamp(rampup=tuple(args.rampup_batch_size)), args.global_batch_size)
    if not args.step_batch_size_schedule:
        return BatchRampFlags(None, args.global_batch_size)
    try:
        steps = parse_step_schedule(" ".join(args.step_batch_size_schedule), args.seq_length)
    except UserError as error:
        return refused(str(error))
    final = steps[-1][1]
    # Megatron-LM refuses --global-batch-size beside a step schedule; its own gpt3 example gives both,
    # with the schedule's last batch: that agreement is accepted here.
    if args.global_batch_size not in (None, final):
        return refused(f"--global-batch-size {args.global_batch_size} differs from the last batch of "
                       f"--step-batch-size-schedule ({final}): drop --global-batch-size")
    return BatchRampFlags(BatchRamp(steps=steps), final)


def schedule_flags_error(args: argparse.Namespace) -> Optional[str]:
    """Megatron-LM's checks of the iteration- and sample-based schedule flags (arguments.validate_args)."""
    if (args.train_iters is None) == (args.train_samples is None):
        return "give exactly one of --train-iters and --train-samples"
    if args.train_iters is not None:
        mixed = [f for f, v in (("--lr-decay-samples", args.lr_decay_samples),
                                ("--lr-warmup-samples", args.lr_warmup_samples or None)) if v is not None]
        kind, other = "--train-iters", "iteration"
    else:
        mixed = [f for f, v in (("--lr-decay-iters", args.lr_decay_iters),
                                ("--lr-warmup-iters", args.lr_warmup_iters or None)) if v is not None]
        kind, other = "--train-samples", "sample"
    if mixed:
        return f"{' and '.join(mixed)} cannot go with {kind}: use the {other}-based form"
    if args.lr_warmup_fraction is not None and (args.lr_warmup_iters or args.lr_warmup_samples):
        return "give --lr-warmup-fraction or --lr-warmup-iters/--lr-warmup-samples, not both"
    return None


def size_flags_error(args: argparse.Namespace) -> Optional[str]:
    """Batch and parallelism sizes Megatron-LM's validate_args asserts on (micro batch > 0) and sizes that
    would divide by zero here; then the recompute, pipeline-split and data-source checks."""
    at_least_one = (("--micro-batch-size", args.micro_batch_size), ("--global-batch-size", args.global_batch_size),
                    ("--tensor-model-parallel-size", args.tensor_model_parallel_size),
                    ("--pipeline-model-parallel-size", args.pipeline_model_parallel_size),
                    ("--context-parallel-size", args.context_parallel_size),
                    ("--num-layers-per-virtual-pipeline-stage", args.num_layers_per_virtual_pipeline_stage),
                    ("--recompute-num-layers", args.recompute_num_layers))
    for flag, value in at_least_one:
        if value is not None and value < 1:
            return f"{flag} must be at least 1, got {value}"
    for flag, value in (("--decoder-first-pipeline-num-layers", args.decoder_first_pipeline_num_layers),
                        ("--decoder-last-pipeline-num-layers", args.decoder_last_pipeline_num_layers)):
        if value is not None and value < 0:
            return f"{flag} must be non-negative, got {value}"
    if args.context_parallel_size > 1 and args.attention_backend in ("unfused", "local"):
        return (f"--context-parallel-size {args.context_parallel_size} needs the flash core attention "
                f"(--attention-backend flash or auto), not {args.attention_backend}")
    return recompute_flags_error(args) or pipeline_split_error(args) or data_source_error(args)


def recompute_flags_error(args: argparse.Namespace) -> Optional[str]:
    """No --recompute-method with selective recompute (as in Megatron-LM); only modules this runtime re-runs."""
    if args.recompute_granularity == "selective" and args.recompute_method is not None:
        return "--recompute-method is not supported with --recompute-granularity selective (as in Megatron-LM)"
    unknown = [m for m in args.recompute_modules or () if m not in RECOMPUTE_MODULES]
    if args.recompute_modules and (unknown or len(set(args.recompute_modules)) != len(args.recompute_modules)):
        what = f"{' '.join(unknown)} not run by this runtime yet" if unknown else "a module named twice"
        return (f"--recompute-modules {' '.join(args.recompute_modules)}: {what} "
                f"(it runs {', '.join(RECOMPUTE_MODULES)})")
    return None


def pipeline_split_error(args: argparse.Namespace) -> Optional[str]:
    """The pipeline-split flags Megatron-LM refuses together."""
    uneven = args.decoder_first_pipeline_num_layers is not None or args.decoder_last_pipeline_num_layers is not None
    if args.num_layers_per_virtual_pipeline_stage and uneven:
        return ("--num-layers-per-virtual-pipeline-stage cannot go with --decoder-first/last-pipeline-num-layers "
                "(as in Megatron-LM)")
    if uneven and (args.account_for_embedding_in_pipeline_split or args.account_for_loss_in_pipeline_split):
        return ("--account-for-embedding/loss-in-pipeline-split cannot go with "
                "--decoder-first/last-pipeline-num-layers (as in Megatron-LM)")
    return None


def data_source_error(args: argparse.Namespace) -> Optional[str]:
    """One data source, as Megatron-LM takes it: --mock-data, --data-path, or the per-split paths."""
    if args.mock_data and args.data_path:
        return "give --data-path or --mock-data, not both (Megatron-LM takes a single data source)"
    per_split = [flag for flag, words in zip(PER_SPLIT_DATA_FLAGS, per_split_paths(args)) if words]
    if per_split and (args.data_path or args.mock_data):
        return f"give {per_split[0]} or {'--data-path' if args.data_path else '--mock-data'}, not both"
    if per_split and args.split:
        return f"--split divides --data-path's datasets; {per_split[0]}'s are taken whole"
    if per_split and not args.train_data_path:
        return f"{per_split[0]} needs --train-data-path (the training split's datasets)"
    return None


def missing_data_error(args: argparse.Namespace) -> Optional[str]:
    """No data source at all."""
    if not args.mock_data and not args.data_path and not any(per_split_paths(args)):
        return "give --data-path PREFIX or --mock-data"
    return None


def checkpoint_flags_error(args: argparse.Namespace) -> Optional[str]:
    """Megatron-LM's checks of the resume and checkpoint-rotation flags (its arguments.py asserts)."""
    if args.override_opt_param_scheduler and args.use_checkpoint_opt_param_scheduler:
        return ("--override-opt_param-scheduler and --use-checkpoint-opt_param-scheduler cannot both be given "
                "(Megatron-LM: 'both override and use-checkpoint are set')")
    retain = args.save_retain_interval
    if retain is not None and (retain < 1 or not args.save_interval or retain % args.save_interval):
        return (f"--save-retain-interval {retain} must be a positive multiple of --save-interval "
                f"({args.save_interval or 'not given'}), as in Megatron-LM")
    if args.non_persistent_ckpt_type in ("local", "in_memory"):
        return (f"--non-persistent-ckpt-type {args.non_persistent_ckpt_type}: node-local checkpoints need NVIDIA's "
                "resiliency extension (nvidia_resiliency_ext), not run here; use --non-persistent-ckpt-type global")
    interval = args.non_persistent_save_interval
    if interval is not None and (interval < 1 or args.non_persistent_ckpt_type != "global"):
        return (f"--non-persistent-save-interval {interval} needs a positive interval and "
                "--non-persistent-ckpt-type global")
    return None


def moe_router_error(args: argparse.Namespace) -> Optional[str]:
    """The router flags' constraints that TransformerConfig asserts on (megatron-core 0.16.1), as one line."""
    if args.moe_router_enable_expert_bias and args.moe_router_score_function != "sigmoid":
        return ("--moe-router-enable-expert-bias needs --moe-router-score-function sigmoid (as in Megatron-LM), "
                f"not {args.moe_router_score_function}")
    groups, picked = args.moe_router_num_groups, args.moe_router_group_topk
    if groups is None and picked is None:
        return None
    if groups is None or picked is None or not 1 <= picked <= groups:
        return f"--moe-router-num-groups {groups} --moe-router-group-topk {picked}: give both, with 1 <= topk <= groups"
    experts, topk = args.num_experts or 0, args.moe_router_topk
    if experts % groups or not picked <= topk <= picked * (experts // groups):
        return (f"--moe-router-num-groups {groups} --moe-router-group-topk {picked}: the groups must split the "
                f"{experts} experts evenly, and the chosen groups must hold --moe-router-topk {topk} experts, "
                "at least one from each")
    return None


def shared_expert_overlap_error(args: argparse.Namespace) -> Optional[str]:
    """--moe-shared-expert-overlap's constraints that megatron-core 0.16.1's TransformerConfig raises on."""
    if not (args.moe_shared_expert_overlap and args.moe_shared_expert_intermediate_size):
        return None
    if args.moe_token_dispatcher_type != "alltoall":
        return ("--moe-shared-expert-overlap only works with --moe-token-dispatcher-type alltoall "
                f"(as in Megatron-Core), not {args.moe_token_dispatcher_type}")
    if "shared_experts" in (args.recompute_modules or ()):
        return "--recompute-modules shared_experts cannot go with --moe-shared-expert-overlap (as in Megatron-Core)"
    return None


def mla_flags_error(args: argparse.Namespace) -> Optional[str]:
    """What Megatron-LM asserts of the MLA flags (arguments.py: validate_args and
    core_transformer_config_from_args) and what this runtime does not run with MLA, as one line."""
    if args.multi_latent_attention and args.group_query_attention:
        return ("--group-query-attention cannot go with --multi-latent-attention (Megatron-LM: 'Group query "
                "attention is mutually exclusive with multi latent attention')")
    if args.rope_type not in (None, "rope") and not args.multi_latent_attention:
        return (f"--rope-type {args.rope_type} needs --multi-latent-attention (Megatron-LM: common attention only "
                "supports rope_type=\"rope\")")
    if args.multi_latent_attention and args.context_parallel_size > 1:
        from megatron_auto.runtime.config import MLA_CONTEXT_PARALLEL

        return MLA_CONTEXT_PARALLEL
    if "mla_up_proj" in (args.recompute_modules or ()) and not args.multi_latent_attention:
        return ("--recompute-modules mla_up_proj needs --multi-latent-attention (megatron-core: 'mla_up_proj in "
                "recompute_modules is only supported with multi_latent_attention')")
    return None


def mtp_flags_error(args: argparse.Namespace) -> Optional[str]:
    """What Megatron-LM asserts of the MTP flags, and what this runtime does not run with MTP, as one line."""
    if not args.mtp_num_layers:
        return None
    from megatron_auto.runtime.config import mtp_error

    return mtp_error(position_embedding_type(args), args.context_parallel_size, args.recompute_method,
                     args.recompute_num_layers, args.pipeline_model_parallel_layout, args.mtp_num_layers)
