"""Pipeline splits for a mixed cluster (issue 39): the stages on faster node groups take more layers.

Megatron-Core puts stage s on the ranks s x world/pp onward, so on a cluster whose node groups hold whole stages
(ClusterSpec.stage_groups) each stage runs on one kind of GPU. Its layers should then be in proportion to how fast
that GPU runs them: the split balances the stages' time, which sets the pipeline's pace. The speeds come from the
cost model's price of the model's layers on each group (ClusterSpec.group_view); memory, which the balance may
overrun on the faster stages, is why the splits also lean less far than the speeds say. Every split is then priced
in full by estimate_plan, and on a model small enough every split is tried (EXHAUSTIVE_SPLITS).

Megatron's first/last-stage flags cannot interleave unequal stages, but its --pipeline-model-parallel-layout can:
each split is also searched with v > 1 chunks per stage (interleaved_layouts), which divides the pipeline's fill
and drain by v as it does for even splits.
"""
from __future__ import annotations

import itertools
import math
from functools import lru_cache

from ..cost.layer_cost import layer_cost
from ..plan import LayerStrategy
from ..specs.cluster import ClusterSpec
from ..specs.model import ModelSpec
from ..specs.training import TrainingSpec

EXHAUSTIVE_SPLITS = 12
"""Where the layers split over the stages in at most this many ways, every split is searched."""
LEANS = (0.5, 0.7, 0.85, 1.0, 1.15)
"""Powers of the speed ratios the splits follow: 1 balances the stages' compute, below 1 leans less far (the
faster stages' memory), above 1 further (their share of the pipeline's fill and drain)."""


def mixed_stage_splits(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, tp: int, pp: int,
                       cp: int = 1) -> list[tuple[int, ...]]:
    """Layers per stage to search for `pp` stages of tp x cp x dp ranks on a mixed cluster; [] where every stage
    runs at one pace (ClusterSpec.stage_groups: the group that paces each)."""
    groups = cluster.stage_groups(pp)
    if len(set(groups)) == 1 or model.num_layers < pp:
        return []
    if math.comb(model.num_layers - 1, pp - 1) <= EXHAUSTIVE_SPLITS:
        return list(_compositions(model.num_layers, pp))
    dp = cluster.world_size // (tp * pp * cp)
    seconds = {group: _layer_seconds(model, cluster.group_view(group), training, tp, dp, cp) for group in set(groups)}
    splits = [_apportion(model.num_layers, [(1.0 / seconds[group]) ** lean for group in groups]) for lean in LEANS]
    return list(dict.fromkeys(splits))


def interleaved_layouts(split: tuple[int, ...], virtual_stages: int | None = None) -> list[tuple[int, ...]]:
    """The chunk layouts (UniformConfig.chunk_layers) searched beside `split` at one chunk per stage: v = 2, 4,
    8, ... chunks per stage and the most that give every chunk a layer (the fewest layers of a stage), or only
    `virtual_stages` where the user pinned it; none for one stage. The fill and drain fall as 1 / v, so the
    counts between these change the pipeline little, and each count is a config of its own to price."""
    most = min(split) if len(split) > 1 else 1
    powers = [2 ** k for k in range(1, most.bit_length()) if 2 ** k < most]
    choices = [virtual_stages] if virtual_stages else [*powers, most]
    return [chunk_layout(split, v) for v in choices if 2 <= v <= most]


def chunk_layout(split: tuple[int, ...], virtual_stages: int) -> tuple[int, ...]:
    """Decoder layers per chunk in Megatron's chunk order (chunk c on stage c % pp) that spread each stage's
    split[s] layers as evenly as they go over its `virtual_stages` chunks, the stage's earlier chunks taking
    the one layer more."""
    pp = len(split)
    return tuple(split[c % pp] // virtual_stages + (c // pp < split[c % pp] % virtual_stages)
                 for c in range(pp * virtual_stages))


@lru_cache(maxsize=1024)
def _layer_seconds(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, tp: int, dp: int,
                   cp: int) -> float:
    """One micro-batch of one sample through all the model's layers on `cluster`'s GPUs (experts unsplit)."""
    strategy = LayerStrategy(tp=tp, dp=dp, sp=tp > 1, cp=cp)
    return sum(layer_cost(layer, strategy, 1, model.seq_length, cluster, training).micro_batch_s
               for layer in model.layers)


def _apportion(layers: int, weights: list[float]) -> tuple[int, ...]:
    """`layers` over the stages in proportion to `weights` (largest remainders), at least one each."""
    shares = [layers * weight / sum(weights) for weight in weights]
    counts = [max(1, math.floor(share)) for share in shares]
    order = sorted(range(len(weights)), key=lambda stage: shares[stage] - counts[stage], reverse=True)
    for stage in itertools.islice(itertools.cycle(order), max(0, layers - sum(counts))):
        counts[stage] += 1
    while sum(counts) > layers:  # the stages raised to one layer took it from the largest
        counts[max(range(len(counts)), key=lambda stage: counts[stage] - shares[stage])] -= 1
    return tuple(counts)


def _compositions(layers: int, parts: int):
    """Every split of `layers` over `parts` stages, each at least one."""
    for cuts in itertools.combinations(range(1, layers), parts - 1):
        bounds = (0, *cuts, layers)
        yield tuple(bounds[i + 1] - bounds[i] for i in range(parts))
