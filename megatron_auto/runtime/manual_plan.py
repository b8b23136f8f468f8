"""The Plan that Megatron-LM's explicit parallelism flags describe (no torch).

Without `--auto-parallel`, pretrain_gpt.py turns the user's flags into this
Plan, so both paths run through the same Plan -> Megatron-Core code.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ..errors import UserError
from ..parallel_dims import ParallelDims
from ..pipeline_layout import (LAYOUT_FLAG, chunk_layers_of_layout, mtp_chunk_of_layout, runtime_chunk_problem,
                               runtime_mtp_problem)
from ..plan import Chunk, LayerStrategy, Plan
from ..search.uniform import UniformConfig, chunk_sizes, stage_layer_counts
from ..specs.model import ModelSpec


@dataclass(frozen=True)
class ManualParallelism:
    """Megatron-LM's parallelism flags; the data-parallel degree is what the world leaves (`dims`)."""

    tp: int = 1
    """--tensor-model-parallel-size."""
    pp: int = 1
    """--pipeline-model-parallel-size."""
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
    ep: int = 1
    """--expert-model-parallel-size (MoE layers only)."""
    etp: Optional[int] = None
    """--expert-tensor-parallel-size; None = tp (Megatron's default)."""
    cp: int = 1
    """--context-parallel-size: each sequence split over this many ranks."""

    def dims(self, world_size: int) -> ParallelDims:
        """The degrees on `world_size` ranks (one chunk per stage: the split flags decide the chunks);
        UserError when they do not fit it."""
        return ParallelDims.for_world(world_size, tp=self.tp, cp=self.cp, pp=self.pp, ep=self.ep, etp=self.etp)


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
    config = UniformConfig(tp=1, pp=pp, micro_batch_size=1, vp=counted // (per_chunk * pp), account_for=account_for)
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
    problem = runtime_mtp_problem(mtp_chunk_of_layout(flags.pipeline_layout or "")) or runtime_chunk_problem(counts)
    if problem:
        raise UserError(f"{LAYOUT_FLAG} {flags.pipeline_layout!r}: {problem}")
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


def check_expert_flags(model: ModelSpec, flags: ManualParallelism) -> None:
    """UserError for expert flags on a dense model; how ep x etp fits the ranks is ParallelDims' check."""
    if (flags.ep, flags.etp) != (1, None) and not any(layer.moe is not None for layer in model.layers):
        raise UserError("--expert-model-parallel-size/--expert-tensor-parallel-size need a MoE model (--num-experts)")


def _layer_strategy(layer, dims: ParallelDims, zero: int, flags: ManualParallelism, recompute: str) -> LayerStrategy:
    experts = dict(ep=dims.ep, etp=dims.etp) if layer.moe is not None else {}
    return LayerStrategy(tp=dims.tp, dp=dims.dp, zero=zero, sp=flags.sequence_parallel, recompute=recompute,
                         cp=dims.cp, **experts)


def plan_from_flags(model: ModelSpec, world_size: int, flags: ManualParallelism) -> Plan:
    """The megatron-space Plan of these flags on `world_size` ranks."""
    check_expert_flags(model, flags)
    dims = flags.dims(world_size)
    global_batch = flags.global_batch_size or flags.micro_batch_size * dims.dp
    num_micro_batches = dims.micro_batches(global_batch, flags.micro_batch_size)
    chunk_sizes = chunk_layer_counts(model.num_layers, dims.pp, flags)
    zero = 1 if flags.distributed_optimizer else 0
    try:
        layers = iter(model.layers)
        chunks = tuple(Chunk(tuple(_layer_strategy(next(layers), dims, zero, flags, kind) for kind in kinds))
                       for kinds in _recompute_kinds(flags, chunk_sizes))
        return Plan(space="megatron", world_size=world_size, pipeline_parallel=dims.pp, global_batch_size=global_batch,
                    num_micro_batches=num_micro_batches, chunks=chunks,
                    embedding=LayerStrategy(tp=dims.tp, dp=dims.dp, zero=zero, sp=flags.sequence_parallel, cp=dims.cp),
                    virtual_stages=len(chunk_sizes) // dims.pp, model=model, cluster="manual")
    except ValueError as error:
        raise UserError(f"the parallelism flags do not form a valid plan: {error}") from None
