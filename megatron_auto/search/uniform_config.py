"""Megatron's parallelism flags as numbers (UniformConfig), and how they split the layers into stages and chunks."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ..errors import UserError
from ..parallel_dims import ParallelDims
from ..plan import LayerStrategy
from ..serde import replaced_unchecked
from ..specs.cluster import ClusterSpec
from ..specs.model import ModelSpec
from .experts import with_experts
from .integers import divisors


@dataclass(frozen=True)
class UniformConfig:
    """Megatron's parallelism flags, as numbers."""

    tp: int
    """--tensor-model-parallel-size."""
    pp: int
    """--pipeline-model-parallel-size."""
    micro_batch_size: int
    """--micro-batch-size: samples per micro-batch per data-parallel replica."""
    vp: int = 1
    """Chunks per pipeline stage (--num-layers-per-virtual-pipeline-stage = layers / (pp x vp))."""
    sequence_parallel: bool = False
    """--sequence-parallel."""
    distributed_optimizer: bool = False
    """--use-distributed-optimizer (ZeRO-1)."""
    recompute: str = "none"
    """--recompute-granularity: none, selective or full."""
    recompute_num_layers: Optional[int] = None
    """With full recompute: recompute the first N layers of every chunk (block method); None means all."""
    stage_layers: Optional[tuple[int, ...]] = None
    """Layers per stage; None splits evenly."""
    account_for: tuple[bool, bool] = (False, False)
    """--account-for-embedding/loss-in-pipeline-split: the embedding and the loss each count as one layer of
    an even split (stage_layers None), so the first and the last chunk hold one layer fewer; interleaved
    chunks then stay equal where the decoder layers alone do not divide (e.g. 94 layers over 8 stages)."""
    chunk_layers: Optional[tuple[int, ...]] = None
    """--pipeline-model-parallel-layout: decoder layers of every chunk, in chunk order (pp x virtual_stages of
    them); None: the split of stage_layers and account_for."""
    mtp_chunk: Optional[int] = None
    """--pipeline-model-parallel-layout: the chunk of the MTP layers when it is not the last (Plan.mtp_chunk)."""
    ep: int = 1
    """--expert-model-parallel-size: EP degree of every MoE layer."""
    etp: Optional[int] = None
    """--expert-tensor-parallel-size of every MoE layer; None: tp (Megatron's default)."""
    cp: int = 1
    """--context-parallel-size: each sequence split over this many ranks (priced by `estimate`; the
    search keeps 1)."""
    fsdp_sharding: int = 0
    """--use-megatron-fsdp with --data-parallel-sharding-strategy as a ZeRO stage: 2 (optim_grads) or 3
    (optim_grads_params); 0: no Megatron-FSDP (distributed_optimizer says 0 or 1)."""

    def but(self, **changes) -> UniformConfig:
        """dataclasses.replace(self, **changes) at a fifth of its cost (serde.replaced_unchecked): the search
        derives tens of thousands of configs (issue 37's 2 s), and these flags run no checks when they are made."""
        return replaced_unchecked(self, **changes)

    @property
    def zero(self) -> int:
        """The ZeRO stage every layer runs: Megatron-FSDP's, else 1 with the distributed optimizer."""
        return self.fsdp_sharding or (1 if self.distributed_optimizer else 0)

    def dims(self, world_size: int) -> ParallelDims:
        """The degrees on `world_size` ranks, dp what they leave; UserError when they do not fit."""
        return ParallelDims.for_world(world_size, tp=self.tp, cp=self.cp, pp=self.pp, vp=self.vp, ep=self.ep,
                                      etp=self.etp)

    def layer_strategy(self, layer, strategy: LayerStrategy) -> LayerStrategy:
        """`strategy` with this config's expert degrees on a MoE layer."""
        return with_experts(layer, strategy, self.ep, self.etp)


def even_split(num_layers: int, parts: int) -> Optional[tuple[int, ...]]:
    return (num_layers // parts,) * parts if num_layers % parts == 0 else None


def megatron_uneven_splits(num_layers: int, pp: int) -> list[tuple[int, ...]]:
    """Every split stock Megatron expresses: first and last stage free, the middle even."""
    if pp == 1:
        return [(num_layers,)]
    splits = []
    for first in range(1, num_layers):
        for last in range(1, num_layers - first + 1):
            middle = num_layers - first - last
            if pp == 2:
                if middle == 0:
                    splits.append((first, last))
            elif middle > 0 and middle % (pp - 2) == 0:
                splits.append((first,) + (middle // (pp - 2),) * (pp - 2) + (last,))
    return splits


def stage_layer_counts(num_layers: int, pp: int, first: Optional[int], last: Optional[int]) -> list[int]:
    """Megatron's split: first/last overrides, the rest evenly over the remaining stages."""
    counts: list[Optional[int]] = [None] * pp
    if first is not None:
        counts[0] = first
    if last is not None:
        counts[-1] = last if pp > 1 else counts[-1]
    free = [i for i, c in enumerate(counts) if c is None]
    rest = num_layers - sum(c for c in counts if c is not None)
    if free and (rest < 0 or rest % len(free)):
        raise UserError(f"{num_layers} layers do not split evenly over the {len(free)} remaining pipeline stages")
    for i in free:
        counts[i] = rest // len(free)
    if sum(counts) != num_layers:  # type: ignore[arg-type]
        raise UserError(f"pipeline stages hold {sum(counts)} layers, the model has {num_layers}")  # type: ignore[arg-type]
    return counts  # type: ignore[return-value]


ACCOUNTED = ((True, False), (False, True), (True, True))
"""The embedding, the loss, or both counted as layers of the pipeline split (UniformConfig.account_for)."""


def counted_stage_layers(num_layers: int, config: UniformConfig) -> Optional[int]:
    """Layers per stage of an even split that counts the embedding and the loss (config.account_for), as
    Megatron-Core's get_num_layers_to_build does; None when it does not divide."""
    counted = num_layers + sum(config.account_for)
    return counted // config.pp if counted % config.pp == 0 else None


def config_stage_layers(num_layers: int, config: UniformConfig) -> Optional[tuple[int, ...]]:
    """Decoder layers per stage under `config`; None when they do not split as given."""
    if not any(config.account_for):
        return config.stage_layers or even_split(num_layers, config.pp)
    per_stage = counted_stage_layers(num_layers, config)
    if config.stage_layers is not None or per_stage is None:
        return None
    counts = [per_stage] * config.pp
    counts[0] -= config.account_for[0]
    counts[-1] -= config.account_for[1]
    return tuple(counts)


def chunk_sizes(num_layers: int, config: UniformConfig) -> Optional[tuple[int, ...]]:
    """Decoder layers per model chunk in Megatron's chunk order (chunk c on stage c % pp); None where
    Megatron cannot build `config`'s split: unequal stages with virtual stages, or a chunk without layers (a
    layout's chunks, `chunk_layers`, may hold none: the embedding, MTP or loss alone, as its text says)."""
    if config.chunk_layers is not None:
        given = config.chunk_layers
        fits = len(given) == config.pp * config.vp and sum(given) == num_layers and min(given) >= 0
        return given if fits else None
    stages, v = config_stage_layers(num_layers, config), config.vp
    if stages is None or len(stages) != config.pp or sum(stages) != num_layers or min(stages) < 1:
        return None
    if v == 1:
        return stages
    per_stage = counted_stage_layers(num_layers, config) if any(config.account_for) else stages[0]
    if config.pp < 2 or per_stage % v or (not any(config.account_for) and len(set(stages)) > 1):
        return None
    sizes = [per_stage // v] * (config.pp * v)
    sizes[0] -= config.account_for[0]
    sizes[-1] -= config.account_for[1]
    return tuple(sizes) if min(sizes) >= 1 else None


def virtual_stage_choices(model: ModelSpec, config: UniformConfig) -> list[int]:
    """The chunk counts per stage Megatron builds for `config`'s split: every v of an even split (1 when the
    stages differ); with the embedding or loss counted, only v > 1 (v = 1 is a first/last-stage split), and
    none where the counted layers do not split."""
    if config.chunk_layers is not None:
        return [len(config.chunk_layers) // config.pp]
    stages = config_stage_layers(model.num_layers, config)
    if any(config.account_for):
        if config.pp < 2 or stages is None:
            return []
        per_stage = counted_stage_layers(model.num_layers, config)
        layers = model.num_layers
        return [v for v in divisors(per_stage) if v > 1 and chunk_sizes(layers, config.but(vp=v))]
    if config.pp < 2 or stages is None or len(set(stages)) > 1:
        return [1]
    return divisors(stages[0])


def config_dp(cluster: ClusterSpec, config: UniformConfig) -> int:
    """The data-parallel degree the flags leave: world / (tp x pp x cp)."""
    return cluster.world_size // (config.tp * config.pp * config.cp)
