"""Bounds under a megatron-space candidate before it is priced: pipeline_lower_bound (the layers' work spread
evenly over the stages) and, sharper, the floors of its own stages (search/stage_bound.py, issue 37), with the
verdict the search skips a candidate on (screen: slower than the best so far, or cannot fit)."""
from __future__ import annotations

import math
from functools import lru_cache
from typing import Optional

from ..cost.layer_cost import layer_cost
from ..cost.models import core_share, profiled_cpu_cores
from ..cost.peak_memory import communicator_count, device_budget_bytes, device_bytes
from ..plan import LayerStrategy
from ..serde import memoised_on
from ..specs.cluster import ClusterSpec
from ..specs.model import ModelSpec
from ..specs.training import TrainingSpec
from .experts import with_experts
from .pruning import enabled as pruning_enabled, search_cache, search_memo
from .stage_bound import StageFloors, least_selective_peak, set_free, stage_floors
from .uniform_config import UniformConfig, chunk_sizes, config_dp


def pipeline_lower_bound(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, config: UniformConfig,
                         micro_batch_size: int, max_virtual_stages: int) -> float:
    """No schedule of these flags beats (m + (p - 1) / v) x (the layers' micro-batch work) / p.

    cost.pipeline.pipeline_time is m T_max + (sum T - T_max) / v = (m - 1/v) T_max + sum T / v,
    and T_max >= sum T / p, so it is at least (m + (p - 1) / v) sum T / p; v is at most
    `max_virtual_stages`. Each stage's slot holds at least its layers' micro_batch_s
    (compute, TP traffic, selective recomputation); full recomputation is left out
    because its layer count is still open, so the bound stays below every choice of it.
    Where ranks time-slice CPU cores the compute counts at a whole core, its least
    (cost.timeslice); and since the cores serve at most their number of ranks at a
    time, the iteration is also at least all ranks' compute at a whole core over the cores.
    """
    dp = config_dp(cluster, config)
    recompute = config.recompute if config.recompute != "full" else "none"
    strategy = layer_strategy(config.tp, dp, config.zero,
                               config.sequence_parallel and config.tp > 1, recompute, config.cp)
    m = training.global_batch_size // (micro_batch_size * dp)
    experts = (config.ep, config.etp)
    if recompute != "selective":
        training = set_free(training)  # what selective recomputation re-runs changes none of these layers
    work, compute_total = _bound_work(model, cluster, training, strategy, experts, micro_batch_size)
    bound = (m + (config.pp - 1) / max_virtual_stages) * work / config.pp
    cores = profiled_cpu_cores(cluster)
    if cores:
        ranks_per_stage = cluster.world_size // config.pp
        bound = max(bound, m * compute_total * core_share(cluster) * ranks_per_stage / cores)
    return bound


def candidate_floors(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, config: UniformConfig,
                     virtual_stages: int, limit: float = math.inf, memory: bool = False) -> Optional[StageFloors]:
    """The stage floors of `config` at `virtual_stages` chunks (search/stage_bound.py; with `memory`, the
    peak's too, once the time floor is below `limit`); None where they do not apply (CPU time-slicing, numbers
    Megatron refuses, the switch off). The floor without recomputation comes first (recomputation only adds
    time, as pipeline_lower_bound assumes; every --recompute-modules set shares it): when it reaches `limit`
    it is returned without pricing the recomputed layers."""
    if not pruning_enabled():
        return None
    plain, layout = _plain_floors_and_layout(model, cluster, set_free(training), config, virtual_stages,
                                             memory and config.recompute == "none")
    if plain is None or plain.time_s >= limit or config.recompute == "none":
        return plain
    strategy, experts, sizes, m = layout
    return stage_floors(model, cluster, training, strategy, (config.recompute, config.recompute_num_layers), experts,
                        sizes, config.pp, config.micro_batch_size, m, memory)


_PLAIN_FLOORS = search_memo()
"""_plain_floors_and_layout's memo: (model, cluster, training, layout_key, v, memory) -> (floors, layout)."""


def _plain_floors_and_layout(model, cluster, training, config, virtual_stages, memory,
                             micro_batch_size: Optional[int] = None) -> tuple:
    """(the stage floors of `config` without recomputation, _floor_layout); `micro_batch_size` replaces the
    config's. Memoised on the layout (not the recomputation) and on `training` as stage_bound.set_free gives
    it: every recompute kind and --recompute-modules set shares them."""
    mbs = micro_batch_size or config.micro_batch_size
    key = (model, cluster, training, layout_key(config, mbs), virtual_stages, memory)
    found = _PLAIN_FLOORS.get(key)
    if found is not None:
        return found
    layout = _floor_layout(model, cluster, training, config, virtual_stages, mbs)
    floors = None
    if layout is not None:
        strategy, experts, sizes, m = layout
        floors = stage_floors(model, cluster, training, strategy, ("none", None), experts, sizes, config.pp, mbs, m,
                              memory)
    if len(_PLAIN_FLOORS) >= 1 << 18:
        _PLAIN_FLOORS.clear()
    _PLAIN_FLOORS[key] = floors, layout
    return floors, layout


def layout_key(config: UniformConfig, micro_batch_size: int) -> tuple:
    """Every field of `config` but its recomputation and chunk count, at `micro_batch_size`: what a floor
    without recomputation reads beside the chunk count."""
    return (config.tp, config.pp, micro_batch_size, config.sequence_parallel, config.zero,
            config.stage_layers, config.account_for, config.chunk_layers, config.ep,
            config.etp, config.cp)


def _floor_layout(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, config: UniformConfig,
                  virtual_stages: int, mbs: int) -> Optional[tuple]:
    """(layer layout without recomputation, expert degrees, chunk sizes, micro-batches) that stage_floors
    reads at `mbs` samples per micro-batch; None where the floors do not apply (CPU time-slicing, numbers
    Megatron refuses)."""
    sizes = _split(model.num_layers, config.pp, config.stage_layers, config.account_for, config.chunk_layers,
                   virtual_stages)
    dp = config_dp(cluster, config)
    if profiled_cpu_cores(cluster) or sizes is None or training.global_batch_size % (mbs * dp):
        return None
    strategy = layer_strategy(config.tp, dp, config.zero,
                               config.sequence_parallel and config.tp > 1, "none", config.cp)
    return (strategy, (config.ep, config.etp), sizes,
            training.global_batch_size // (mbs * dp))


def plain_floor(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, config: UniformConfig,
                micro_batch_size: int, virtual_stages: int) -> float:
    """The stage floor of `config` at this micro-batch size and chunk count without recomputation (-inf where the
    floors do not apply or the switch is off): no recomputed layer count beats it, since recomputation only adds
    time (candidate_floors)."""
    if not pruning_enabled():
        return -math.inf
    floors = _plain_floors_and_layout(model, cluster, set_free(training), config, virtual_stages, False,
                                      micro_batch_size)[0]
    return -math.inf if floors is None else floors.time_s


def micro_batch_floors(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, config: UniformConfig,
                       micro_batches: tuple[int, ...], virtual: tuple[int, ...]) -> Optional[tuple[float, ...]]:
    """Per micro-batch size, the least floor without recomputation over the chunk counts `virtual` (-inf
    where one has no floor): where it reaches the limit, _best_virtual would find every v slower and change
    nothing, so best_uniform_plan skips the size. None with the switch off."""
    if not pruning_enabled():
        return None
    return _micro_batch_floors(model, cluster, set_free(training), config, micro_batches, virtual)


@search_cache(maxsize=1 << 15)
def _micro_batch_floors(model, cluster, training, config, micro_batches, virtual) -> tuple[float, ...]:
    """micro_batch_floors, memoised on `training` as stage_bound.set_free gives it."""
    floors = []
    for mbs in micro_batches:
        each = [_plain_floors_and_layout(model, cluster, training, config, v, False, mbs)[0] for v in virtual]
        floors.append(-math.inf if any(f is None for f in each) else min(f.time_s for f in each))
    return tuple(floors)


def cannot_fit(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, config: UniformConfig,
               floors: StageFloors) -> bool:
    """Whether a plan of `config` whose allocated peak is at least `floors.peak_bytes` overflows the device:
    estimate_plan's fits test (cost.peak_memory.device_bytes <= device_budget_bytes) with the plan's
    communicators (cost.estimate.plan_communicators), which read only the TP and DP degrees that every layer
    and the embedding of these flags share."""
    strategy = layer_strategy(config.tp, config_dp(cluster, config), 0, False, "none", config.cp)
    communicators = communicator_count({strategy}, config.pp, not model.untie_embeddings_and_output_weights)
    return device_bytes(floors.peak_bytes, cluster, communicators) > device_budget_bytes(cluster, training)


@lru_cache(maxsize=1 << 14)
def _split(num_layers: int, pp: int, stage_layers, account_for, chunk_layers, virtual_stages: int):
    """uniform_config.chunk_sizes of the split these fields give, memoised."""
    return chunk_sizes(num_layers, UniformConfig(tp=1, pp=pp, micro_batch_size=1, vp=virtual_stages,
                                                 stage_layers=stage_layers, account_for=account_for,
                                                 chunk_layers=chunk_layers))


@lru_cache(maxsize=4096)
def layer_strategy(tp: int, dp: int, zero: int, sp: bool, recompute: str, cp: int = 1) -> LayerStrategy:
    """One object per layout: the bound runs per (micro-batch, chunks) and its cost lookups hash it."""
    return LayerStrategy(tp=tp, dp=dp, zero=zero, sp=sp, recompute=recompute, cp=cp)


@memoised_on(lambda model, cluster, training, strategy, experts, micro_batch_size:
             (model, cluster, training, strategy.per_micro_batch_key, experts, micro_batch_size), 1 << 16)
def _bound_work(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, strategy: LayerStrategy,
                experts: tuple[int, Optional[int]], micro_batch_size: int) -> tuple[float, float]:
    """pipeline_lower_bound's (work, compute) sums over the model's layers, memoised: every split, chunk
    count and --recompute-modules set of a layout shares them (issue 37). A layer's micro-batch seconds read the
    data-parallel degree and the ZeRO stage only through ZeRO-3's gathers, so the memo keys on
    LayerStrategy.per_micro_batch_key: one pricing serves every pipeline depth and optimizer choice."""
    work, compute_total, idle = 0.0, 0.0, 1.0 - core_share(cluster)
    for spec, count in layer_counts(model):
        cost = layer_cost(spec, with_experts(spec, strategy, *experts), micro_batch_size, model.seq_length, cluster,
                          training)
        compute = cost.forward_s + cost.backward_s + cost.recompute_s
        work += count * (cost.micro_batch_s - idle * compute)
        compute_total += count * compute
    return work, compute_total


@lru_cache(maxsize=64)
def layer_counts(model: ModelSpec) -> tuple[tuple, ...]:
    """(layer shape, how many layers have it) for each distinct shape of the model."""
    counts: dict = {}
    for layer in model.layers:
        counts[layer] = counts.get(layer, 0) + 1
    return tuple(counts.items())


SLOWER, UNFIT = "slower", "unfit"
"""screen's verdicts: no faster than the limit; overflows the device."""


def screen(model, cluster, training, config: UniformConfig, v: int, limit: float) -> Optional[str]:
    """SLOWER when no plan of `config` at v chunks beats `limit` seconds; UNFIT when its memory floor
    overflows the device (asked only where a plan that does not fit may be dropped: with a finite limit or
    drop_unfit only fitting plans can win, and not under the bisection on recomputed layers, which reads a
    non-fitting plan as 'recompute more'); None when it must be priced."""
    memory = config.recompute_num_layers is None
    if memory and config.recompute == "selective" and no_module_set_fits(model, cluster, training, config, v):
        return UNFIT
    floors = candidate_floors(model, cluster, training, config, v, limit, memory)
    if floors is None:
        bound = pipeline_lower_bound(model, cluster, training, config, config.micro_batch_size, v)
        return SLOWER if bound >= limit else None
    # Memory first: a proof that no v fits lets best_uniform_plan skip the larger micro-batches too.
    if memory and floors.peak_bytes > 0 and cannot_fit(model, cluster, training, config, floors):
        return UNFIT
    return SLOWER if floors.time_s >= limit else None


_NO_SET_FITS = search_memo()
"""no_module_set_fits' memo: (model, cluster, training as set_free gives it, layout_key, v) -> verdict."""


def no_module_set_fits(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, config: UniformConfig,
                       v: int) -> bool:
    """Whether `config` at v chunks, its layers selectively recomputed, overflows the device under every
    --recompute-modules set (stage_bound.least_selective_peak); False where the floors do not apply. One
    verdict serves the searches of all sets."""
    if not pruning_enabled():
        return False
    free = set_free(training)
    key = (model, cluster, free, layout_key(config, config.micro_batch_size), v)
    verdict = _NO_SET_FITS.get(key)
    if verdict is None:
        layout = _plain_floors_and_layout(model, cluster, free, config, v, False)[1]
        verdict = layout is not None and cannot_fit(
            model, cluster, free, config,
            StageFloors(0.0, least_selective_peak(model, cluster, free, *layout[:3], config.pp,
                                                  config.micro_batch_size, layout[3])))
        _NO_SET_FITS[key] = verdict
    return verdict
