"""The Megatron-LM command-line flags that reproduce a `megatron`-space plan."""
from __future__ import annotations

from .errors import UserError
from .pipeline_layout import LAYOUT_FLAG, layout_of_chunk_layers
from .plan import Plan
from .specs.training import DEFAULT_RECOMPUTE_MODULES


def flag_groups(flags: list[str]) -> list[list[str]]:
    """`flags` split into [--flag, its values...] groups (--recompute-modules takes several values)."""
    groups: list[list[str]] = []
    for token in flags:
        if token.startswith("--") or not groups:
            groups.append([token])
        else:
            groups[-1].append(token)
    return groups


def megatron_flags(plan: Plan) -> list[str]:
    """Flags for Megatron-LM's pretrain_gpt.py, in the order a launch script lists them."""
    if plan.space != "megatron":
        raise UserError("only megatron-space plans map onto stock Megatron-LM flags")
    layout = plan.embedding
    flags = [
        "--tensor-model-parallel-size", str(layout.tp),
        "--pipeline-model-parallel-size", str(plan.pipeline_parallel),
        *(["--context-parallel-size", str(layout.cp)] if layout.cp > 1 else []),
        "--micro-batch-size", str(plan.local_micro_batch(layout)),
        "--global-batch-size", str(plan.global_batch_size),
    ]
    flags += _pipeline_split_flags(plan)
    flags += _recompute_flags(plan)
    if layout.sp:
        flags.append("--sequence-parallel")
    if layout.zero >= 1:
        flags.append("--use-distributed-optimizer")
    if layout.zero >= 2:  # Megatron-FSDP (megatron/core/distributed/fsdp)
        flags += ["--use-megatron-fsdp", "--data-parallel-sharding-strategy", FSDP_SHARDING[layout.zero]]
    recipe = list(plan.prediction.recipe_flags) if plan.prediction is not None else []
    return flags + _overlap_flags(plan) + _expert_flags(plan) + recipe


FSDP_SHARDING = {0: "no_shard", 1: "optim", 2: "optim_grads", 3: "optim_grads_params"}
"""Megatron-LM's --data-parallel-sharding-strategy for each ZeRO stage."""


def expert_degrees(plan: Plan) -> tuple[int, int] | None:
    """(ep, etp) of the plan's MoE layers (one pair in the megatron space), None without MoE layers."""
    if plan.model is None:
        return None
    pairs = {(s.ep, s.expert_tp) for layer, s in zip(plan.model.layers, plan.layer_strategies) if layer.moe}
    return min(pairs) if pairs else None


def _expert_flags(plan: Plan) -> list[str]:
    """Megatron-LM's expert-parallel flags (Megatron defaults --expert-tensor-parallel-size to tp; written
    out always, so the line reads the same whatever the default)."""
    degrees = expert_degrees(plan)
    if degrees is None:
        return []
    ep, etp = degrees
    return ["--expert-model-parallel-size", str(ep), "--expert-tensor-parallel-size", str(etp)]


def _overlap_flags(plan: Plan) -> list[str]:
    """Megatron-LM's DDP reduces gradients after the backward unless told to overlap; a plan priced
    with data-parallel traffic hidden behind compute (Prediction.grad_overlap) needs the flags that
    hide it. --overlap-param-gather needs --use-distributed-optimizer and --overlap-grad-reduce
    (Megatron-LM's megatron/training/arguments.py)."""
    hidden = plan.prediction is not None and plan.prediction.grad_overlap > 0
    if not hidden or max(s.gradient_dp for s in plan.distinct_strategies | {plan.embedding}) == 1:
        return []
    if plan.embedding.zero >= 1:
        return ["--overlap-grad-reduce", "--overlap-param-gather"]
    return ["--overlap-grad-reduce"]


def _pipeline_split_flags(plan: Plan) -> list[str]:
    """Megatron splits the layers left after the first/last overrides evenly over the middle stages; with
    virtual stages, a first (last) chunk one layer short is Megatron's embedding (loss) counted as a layer.
    Any other chunking is written as --pipeline-model-parallel-layout."""
    counts = tuple(len(chunk.layers) for chunk in plan.chunks)
    mtp = plan.model.mtp_num_layers if plan.model is not None else 0
    if plan.mtp_chunk is not None:  # a standalone MTP chunk: no other flag places it
        return [LAYOUT_FLAG, layout_of_chunk_layers(counts, mtp, plan.mtp_chunk)]
    if plan.virtual_stages > 1:
        per_chunk = plan.virtual_chunk_layers
        if len(set(counts[1:-1])) > 1 or not {counts[0], counts[-1]} <= {per_chunk - 1, per_chunk}:
            return [LAYOUT_FLAG, layout_of_chunk_layers(counts, mtp)]
        return (["--num-layers-per-virtual-pipeline-stage", str(per_chunk)]
                + ["--account-for-embedding-in-pipeline-split"] * (counts[0] < per_chunk)
                + ["--account-for-loss-in-pipeline-split"] * (counts[-1] < per_chunk))
    if len(set(counts)) == 1:
        return []
    if len(set(counts[1:-1])) > 1:
        return [LAYOUT_FLAG, layout_of_chunk_layers(counts, mtp)]
    middle = counts[1] if plan.pipeline_parallel > 2 else None
    flags = []
    if counts[0] != middle:
        flags += ["--decoder-first-pipeline-num-layers", str(counts[0])]
    if counts[-1] != middle:
        flags += ["--decoder-last-pipeline-num-layers", str(counts[-1])]
    return flags


def _recompute_flags(plan: Plan) -> list[str]:
    if plan.recomputes_selectively:
        modules = plan.prediction.recompute_modules if plan.prediction is not None else DEFAULT_RECOMPUTE_MODULES
        listed = ["--recompute-modules", *modules] if tuple(modules) != DEFAULT_RECOMPUTE_MODULES else []
        return ["--recompute-granularity", "selective", *listed]
    full_per_chunk = [sum(s.recompute == "full" for s in c.layers) for c in plan.chunks]
    if not any(full_per_chunk):
        return []
    if all(n == len(c.layers) for n, c in zip(full_per_chunk, plan.chunks)):
        return ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"]
    _check_block_recompute(plan, full_per_chunk)
    return ["--recompute-granularity", "full", "--recompute-method", "block",
            "--recompute-num-layers", str(full_per_chunk[0])]


def _check_block_recompute(plan: Plan, full_per_chunk: list[int]) -> None:
    """Megatron's block method recomputes the first N layers of every chunk."""
    n = full_per_chunk[0]
    for chunk, count in zip(plan.chunks, full_per_chunk):
        expected = tuple(["full"] * min(n, len(chunk.layers)) + ["none"] * max(0, len(chunk.layers) - n))
        if tuple(s.recompute for s in chunk.layers) != expected:
            raise UserError("full recomputation must cover the first N layers of every chunk to map onto Megatron's block method")
