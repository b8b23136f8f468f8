"""The Plan that Megatron-LM's explicit parallelism flags describe (no torch).

Without `--auto-parallel`, pretrain_gpt.py turns the user's flags into this
Plan, so both paths run through the same Plan -> Megatron-Core code.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ..errors import UserError
from ..pipeline_layout import LAYOUT_FLAG, chunk_layers_of_layout
from ..plan import Chunk, LayerStrategy, Plan
from ..search.uniform import UniformConfig, chunk_sizes, stage_layer_counts
from ..specs.model import ModelSpec


@dataclass(frozen=True)
class ManualParallelism:
    """Megatron-LM's parallelism flags."""

    tensor_parallel: int = 1
    pipeline_parallel: int = 1
    micro_batch_size: int = 1
    global_batch_size: Optional[int] = None
    """None means micro_batch_size x data-parallel size (one micro-batch)."""
    layers_per_virtual_stage: Optional[int] = None
    first_stage_layers: Optional[int] = None
    last_stage_layers: Optional[int] = None
    account_for_embedding: bool = False
    """--account-for-embedding-in-pipeline-split: the embedding counts as a layer in the split."""
    account_for_loss: bool = False
    """--account-for-loss-in-pipeline-split: the output layer and loss count as a layer in the split."""
    pipeline_layout: Optional[str] = None
    """--pipeline-model-parallel-layout: the layers of every model chunk (pipeline_layout.py)."""
    recompute_granularity: Optional[str] = None
    recompute_method: Optional[str] = None
    recompute_num_layers: Optional[int] = None
    sequence_parallel: bool = False
    distributed_optimizer: bool = False
    expert_parallel: int = 1
    """--expert-model-parallel-size (MoE layers only)."""
    expert_tensor_parallel: Optional[int] = None
    """--expert-tensor-parallel-size; None = tensor_parallel (Megatron's default)."""
    context_parallel: int = 1
    """--context-parallel-size: each sequence split over this many ranks."""


def chunk_layer_counts(num_layers: int, pp: int, flags: ManualParallelism) -> list[int]:
    """Decoder layers per model chunk, in Megatron's chunk order (chunk c on stage c % pp), as Megatron-Core's
    get_num_layers_to_build splits them (search.uniform.chunk_sizes): with
    --account-for-embedding/loss-in-pipeline-split the embedding and the loss each count as one layer of the
    first and the last chunk."""
    if flags.pipeline_layout is not None:
        return list(_layout_chunk_layers(num_layers, pp, flags))
    account_for = (flags.account_for_embedding, flags.account_for_loss)
    if any(account_for) and (flags.first_stage_layers is not None or flags.last_stage_layers is not None):
        raise UserError("--account-for-embedding/loss-in-pipeline-split cannot go with "
                        "--decoder-first/last-pipeline-num-layers (as in Megatron-LM)")
    if not any(account_for) and not flags.layers_per_virtual_stage:
        return stage_layer_counts(num_layers, pp, flags.first_stage_layers, flags.last_stage_layers)
    counted = num_layers + sum(account_for)
    per_chunk = flags.layers_per_virtual_stage or max(1, counted // pp)
    what = f"{num_layers} layers" + (f" and {sum(account_for)} counted for the embedding/loss" if any(account_for)
                                     else "")
    if counted % (per_chunk * pp):
        split = f"into chunks of {per_chunk}" if flags.layers_per_virtual_stage else "evenly"
        raise UserError(f"{what} do not split {split} over {pp} pipeline stages")
    config = UniformConfig(tp=1, pp=pp, micro_batch_size=1, virtual_stages=counted // (per_chunk * pp),
                           account_for=account_for)
    sizes = chunk_sizes(num_layers, config)
    if sizes is None and pp < 2:
        raise UserError("--num-layers-per-virtual-pipeline-stage needs --pipeline-model-parallel-size 2 or more "
                        "(Megatron-LM's interleaved schedule)")
    if sizes is None:
        raise UserError(f"{what}: a model chunk of {per_chunk} is left without decoder layers (this runtime "
                        "builds every chunk with at least one)")
    return list(sizes)


def _layout_chunk_layers(num_layers: int, pp: int, flags: ManualParallelism) -> tuple[int, ...]:
    """The chunks of --pipeline-model-parallel-layout, which Megatron-LM takes alone of the split flags."""
    others = [flag for flag, given in (
        ("--num-layers-per-virtual-pipeline-stage", flags.layers_per_virtual_stage is not None),
        ("--decoder-first-pipeline-num-layers", flags.first_stage_layers is not None),
        ("--decoder-last-pipeline-num-layers", flags.last_stage_layers is not None),
        ("--account-for-embedding-in-pipeline-split", flags.account_for_embedding),
        ("--account-for-loss-in-pipeline-split", flags.account_for_loss)) if given]
    if others:
        raise UserError(f"{LAYOUT_FLAG} cannot go with {', '.join(others)} (as in Megatron-LM)")
    counts = chunk_layers_of_layout(flags.pipeline_layout or "", pp, num_layers)
    if len(counts) > pp and pp < 2:
        raise UserError(f"{LAYOUT_FLAG} with {len(counts)} chunks needs --pipeline-model-parallel-size 2 or more "
                        "(Megatron-LM's interleaved schedule)")
    return counts


def _recompute_kinds(flags: ManualParallelism, chunk_sizes: list[int]) -> list[list[str]]:
    """Per-chunk, per-layer recompute kinds; Megatron's block method covers the first N layers of a chunk."""
    granularity = flags.recompute_granularity
    if granularity in (None, "none"):
        return [["none"] * n for n in chunk_sizes]
    if granularity == "selective":
        return [["selective"] * n for n in chunk_sizes]
    if granularity != "full":
        raise UserError(f"--recompute-granularity must be full or selective, got {granularity!r}")
    if flags.recompute_method == "block":
        count = flags.recompute_num_layers or 0
        return [["full"] * min(count, n) + ["none"] * max(0, n - count) for n in chunk_sizes]
    return [["full"] * n for n in chunk_sizes]


def check_expert_flags(model: ModelSpec, tp: int, dp: int, flags: ManualParallelism) -> None:
    """UserError unless Megatron-Core can form the expert groups: a MoE model, and ep x etp dividing
    tp x cp x dp (the expert groups partition the tp x cp x dp ranks of a pipeline stage)."""
    if flags.expert_parallel == 1 and flags.expert_tensor_parallel is None:
        return
    if not any(layer.moe is not None for layer in model.layers):
        raise UserError("--expert-model-parallel-size/--expert-tensor-parallel-size need a MoE model (--num-experts)")
    etp, cp = flags.expert_tensor_parallel or tp, flags.context_parallel
    if (tp * cp * dp) % (flags.expert_parallel * etp):
        named, sizes = ("TP x CP x DP", f"{tp} x {cp} x {dp}") if cp > 1 else ("TP x DP", f"{tp} x {dp}")
        raise UserError(f"world size {tp * cp * dp * flags.pipeline_parallel} does not fit expert parallelism: "
                        f"EP x expert TP = {flags.expert_parallel} x {etp} must divide {named} = {sizes}")


def _layer_strategy(layer, tp: int, dp: int, zero: int, flags: ManualParallelism, recompute: str) -> LayerStrategy:
    experts = (dict(ep=flags.expert_parallel, etp=flags.expert_tensor_parallel) if layer.moe is not None else {})
    return LayerStrategy(tp=tp, dp=dp, zero=zero, sp=flags.sequence_parallel, recompute=recompute,
                         cp=flags.context_parallel, **experts)


def plan_from_flags(model: ModelSpec, world_size: int, flags: ManualParallelism) -> Plan:
    """The megatron-space Plan of these flags on `world_size` ranks."""
    tp, pp, cp = flags.tensor_parallel, flags.pipeline_parallel, flags.context_parallel
    if world_size % (tp * pp * cp):
        named = "TP x PP x CP" if cp > 1 else "TP x PP"
        raise UserError(f"world size {world_size} is not divisible by {named} = {tp * pp * cp}")
    dp = world_size // (tp * pp * cp)
    global_batch = flags.global_batch_size or flags.micro_batch_size * dp
    if global_batch % (flags.micro_batch_size * dp):
        raise UserError(f"global batch {global_batch} is not divisible by micro batch x DP = {flags.micro_batch_size * dp}")
    chunk_sizes = chunk_layer_counts(model.num_layers, pp, flags)
    virtual = len(chunk_sizes) // pp
    zero = 1 if flags.distributed_optimizer else 0
    check_expert_flags(model, tp, dp, flags)
    try:
        layers = iter(model.layers)
        chunks = tuple(Chunk(tuple(_layer_strategy(next(layers), tp, dp, zero, flags, kind) for kind in kinds))
                       for kinds in _recompute_kinds(flags, chunk_sizes))
        return Plan(space="megatron", world_size=world_size, pipeline_parallel=pp, global_batch_size=global_batch,
                    num_micro_batches=global_batch // (flags.micro_batch_size * dp), chunks=chunks,
                    embedding=LayerStrategy(tp=tp, dp=dp, zero=zero, sp=flags.sequence_parallel, cp=cp),
                    virtual_stages=virtual, model=model, cluster="manual")
    except ValueError as error:
        raise UserError(f"the parallelism flags do not form a valid plan: {error}") from None
