"""Floors under a megatron-space candidate's iteration time and memory from its own stages, before it is priced
(issue 37: most candidates of a large job are thrown away as slower than the best plan so far, or too big).

uniform.pipeline_lower_bound spreads the layers' work evenly over the stages, which is loose where they are
not even: uneven splits, a model whose first layers are dense and the rest MoE (DeepSeek-V3), the embedding on
the first stage and the LM head (and multi-token prediction) on the last. This floor prices the stages the
candidate really has. cost.estimate.stage_costs gives each stage a slot of its layers' micro_batch_s, the
runtime's work per chunk, the embedding (first stage), the LM head and MTP modules (the head's stage), and
more that is never negative (relayouts, exposed p2p, and over m the exposed gradient traffic, the optimizer
step and the per-step work); cost.pipeline.pipeline_time, (m - 1/v) max T + sum T / v, grows with every slot
(m >= 1 >= 1/v). So pipeline_time of the slots without those extra terms is at most the predicted iteration,
wherever estimate_plan returns pipeline_time (not where ranks time-slice CPU cores: cost.timeslice).

Memory: a stage's allocated peak (cost.peak_memory.StageMemory) is at least its backward moment, which holds the
framework's bytes, the stage's states and its in-flight micro-batches (cost.memory.in_flight_micro_batches) times
its layers' activations; the workspaces, transients, the embedding's and MTP's activations and states only add.

The layer costs are summed per distinct layer shape (counts x cost), memoised per layout and micro-batch, so one
pricing serves every split, chunk count and recomputed-layer count. tests/test_search_speed.py checks both
floors against estimate_plan on preset jobs.
"""
from __future__ import annotations

import itertools
from dataclasses import replace
from functools import lru_cache
from operator import mul
from typing import NamedTuple, Optional

from ..cost.context_parallel import gradient_strategy, local_model
from ..cost.embedding import embedding_cost
from ..cost.layer_cost import kept_activation_bytes, layer_cost, without_recompute_modules
from ..cost.memory import in_flight_micro_batches
from ..cost.models import runtime_overhead
from ..cost.mtp import mtp_cost
from ..cost.pipeline import pipeline_time
from ..plan import LayerStrategy
from ..serde import memoised_on
from ..specs.cluster import ClusterSpec
from ..specs.model import ModelSpec
from ..specs.training import RECOMPUTE_MODULES, TrainingSpec
from .experts import with_experts

ROUNDING = 1e-9
"""Relative slack under the floor: its sums run in another order than estimate_plan's."""


class StageFloors(NamedTuple):
    """A candidate's floors, from its layers and ends alone."""

    time_s: float
    """At most its predicted iteration seconds."""
    peak_bytes: float
    """At most the allocated peak of its fullest stage (0 when not asked for)."""


def stage_floors(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, strategy: LayerStrategy,
                 recompute: tuple[str, Optional[int]], experts: tuple[int, Optional[int]], sizes: tuple[int, ...],
                 pp: int, micro_batch_size: int, num_micro_batches: int, memory: bool = False) -> StageFloors:
    """No plan of these numbers is faster, nor (with `memory`) needs less memory: the module docstring.

    `strategy`: every layer's layout without recomputation (the embedding's too); `recompute`: (kind, the
    layers recomputed first in every chunk under full, None for all); `experts`: (ep, etp) of the MoE layers;
    `sizes`: decoder layers per chunk in Megatron's chunk order (chunk c on stage c % pp)."""
    kind, limit = recompute
    limit = limit if kind == "full" else None
    views = cluster.stage_clusters(pp)  # a mixed cluster's stages each on their own group, as estimate_plan's
    if cluster.node_groups:
        priced = {view: _stage_values(model, view, training, strategy, kind, experts, micro_batch_size,
                                      3 if memory else 1) for view in dict.fromkeys(views)}
        per_stage = [priced[view] for view in views]
    else:  # one entry: every stage on this cluster
        per_stage = [_stage_values(model, cluster, training, strategy, kind, experts, micro_batch_size,
                                   3 if memory else 1)]
    vectors = stage_shape_vectors(model, sizes, pp, limit)
    v = len(sizes) // pp
    seconds = _stage_sums(vectors, per_stage, 0)
    if any(per_step or per_micro_batch for _, (per_step, per_micro_batch) in per_stage):
        overheads = [overhead for _, overhead in (per_stage if len(per_stage) == pp else per_stage * pp)]
        seconds = [stage + v * per_micro_batch + per_step / num_micro_batches
                   for stage, (per_step, per_micro_batch) in zip(seconds, overheads)]
    last_kind = kind if limit is None or sizes[-1] <= limit else "none"
    if last_kind == "full" and limit is not None and max(sizes) > limit:
        last_kind = "none"  # cost.mtp.mtp_layer_strategy: the block method skips the MTP layers
    head = (len(sizes) - 1) % pp
    seconds[0] += end_stage_seconds(model, views[0], training, strategy, last_kind, experts, micro_batch_size, pp)[0]
    seconds[head] += end_stage_seconds(model, views[head], training, strategy, last_kind, experts, micro_batch_size,
                                       pp)[1]
    time = pipeline_time(seconds, num_micro_batches, v) * (1.0 - ROUNDING)
    if not memory:
        return StageFloors(time, 0.0)
    states, kept = _stage_sums(vectors, per_stage, 1), _stage_sums(vectors, per_stage, 2)
    peak = max(states[stage] + kept[stage] * in_flight_micro_batches(stage, pp, num_micro_batches, v, "1f1b")
               for stage in range(pp))
    return StageFloors(time, (peak + cluster.framework_overhead_bytes) * (1.0 - ROUNDING))


def _stage_sums(vectors: tuple[tuple[int, ...], ...], per_stage: list, term: int) -> list[float]:
    """Per stage, its (recomputed, plain) shape counts times its shapes' values of `term` (_stage_values);
    `per_stage`: one entry per stage, or one for all."""
    if len(per_stage) == 1:
        values = per_stage[0][0][term]
        return [sum(map(mul, counts, values)) for counts in vectors]
    return [sum(map(mul, counts, values[term])) for counts, (values, _) in zip(vectors, per_stage)]


@lru_cache(maxsize=1 << 14)
def _stage_values(model, cluster, training, strategy, kind: str, experts, micro_batch_size: int, terms: int
                  ) -> tuple[tuple[tuple[float, ...], ...], tuple[float, float]]:
    """(per term, the recomputed shapes' values then the plain shapes': stage_shape_vectors' order; the runtime's
    overhead on `cluster`'s GPUs). Memoised: every split, chunk count and micro-batch count shares it."""
    plain, redone = _kind_terms(model, cluster, training, strategy, kind, experts, micro_batch_size)
    return tuple(redone[term] + plain[term] for term in range(terms)), runtime_overhead(cluster)


def _kind_terms(model, cluster, training, strategy, kind: str, experts, micro_batch_size: int) -> tuple:
    """layer_terms (plain, recomputed as `kind`) of every layer shape on `cluster`'s GPUs."""
    free = set_free(training)  # only selectively recomputed layers read the set: one entry serves every set
    plain = layer_terms(model, cluster, free, strategy, "none", experts, micro_batch_size)
    redone = plain if kind == "none" else layer_terms(model, cluster, training if kind == "selective" else free,
                                                      strategy, kind, experts, micro_batch_size)
    return plain, redone


def least_selective_peak(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, strategy: LayerStrategy,
                         experts: tuple[int, Optional[int]], sizes: tuple[int, ...], pp: int, micro_batch_size: int,
                         num_micro_batches: int) -> float:
    """At most the allocated peak of these numbers with every layer selectively recomputed, whatever the
    --recompute-modules set: stage_floors' memory floor with each layer keeping the least that any set leaves
    it (least_selective_kept_bytes). The states do not depend on recomputation. `training` as set_free gives
    it, so the searches of all sets share one floor, and a candidate it proves unfit is dropped by each of them
    without pricing its layers under that set (issue 37: most of DeepSeek-V3's selective candidates)."""
    states = layer_terms(model, cluster, training, strategy, "none", experts, micro_batch_size)[1]
    kept = least_selective_kept_bytes(model, cluster, training, strategy, experts, micro_batch_size)
    v = len(sizes) // pp
    peak = max(_dot(counts, states) + _dot(counts, kept)
               * in_flight_micro_batches(stage, pp, num_micro_batches, v, "1f1b")
               for stage, (counts, _) in enumerate(stage_shape_counts(model, sizes, pp, None)))
    return (peak + cluster.framework_overhead_bytes) * (1.0 - ROUNDING)


@memoised_on(lambda model, cluster, training, strategy, experts, micro_batch_size:
             (model, cluster, training, strategy.per_micro_batch_key, experts, micro_batch_size), 1 << 14)
def least_selective_kept_bytes(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec,
                               strategy: LayerStrategy, experts: tuple[int, Optional[int]], micro_batch_size: int
                               ) -> tuple[float, ...]:
    """Per distinct layer shape (layer_shapes' order), the least activation bytes it keeps under selective
    recomputation of any set of RECOMPUTE_MODULES: the minimum over what the sets re-run of it, since keeping
    is not monotone in the set (an unfused core with grouped queries keeps more of Q, K and V when
    recomputed: cost.memory.qkv_kept_width). Memoised on LayerStrategy.per_micro_batch_key: one pricing serves
    every pipeline depth."""
    layout = _recomputed(strategy, "selective")
    return tuple(min(kept_activation_bytes(layer, with_experts(layer, layout, *experts), micro_batch_size,
                                           model.seq_length, cluster, spec)
                     for spec in _module_set_representatives(training, layer))
                 for layer in layer_shapes(model))


@lru_cache(maxsize=256)
def _module_set_representatives(training: TrainingSpec, layer) -> tuple[TrainingSpec, ...]:
    """One training spec per distinct set of `layer`'s modules that some non-empty --recompute-modules set
    re-runs (TrainingSpec.selective_modules)."""
    found: dict = {}
    for size in range(1, len(RECOMPUTE_MODULES) + 1):
        for modules in itertools.combinations(RECOMPUTE_MODULES, size):
            spec = replace(training, recompute_modules=modules)
            found.setdefault(spec.selective_modules(layer), spec)
    return tuple(found.values())


def _dot(counts: tuple[int, ...], values: tuple[float, ...]) -> float:
    """Each shape's count times its value, summed (the cost model's values are finite)."""
    return sum(map(mul, counts, values))


@lru_cache(maxsize=1 << 14)
def stage_shape_counts(model: ModelSpec, sizes: tuple[int, ...], pp: int, limit: Optional[int]
                       ) -> tuple[tuple[tuple[int, ...], tuple[int, ...]], ...]:
    """Per stage, (how many of its layers of each shape are recomputed, how many are not): chunk c of `sizes`
    (layers in model order) on stage c % pp, the first `limit` layers of every chunk recomputed (None: all)."""
    counts = layer_kind_counts(model)
    stages = [([0] * len(counts[0]), [0] * len(counts[0])) for _ in range(pp)]
    start = 0
    for index, size in enumerate(sizes):
        cut = start + (size if limit is None else min(limit, size))
        for part, (begin, end) in zip(stages[index % pp], ((start, cut), (cut, start + size))):
            for shape, (after, before) in enumerate(zip(counts[end], counts[begin])):
                part[shape] += after - before
        start += size
    return tuple((tuple(redone), tuple(plain)) for redone, plain in stages)


@lru_cache(maxsize=1 << 14)
def stage_shape_vectors(model: ModelSpec, sizes: tuple[int, ...], pp: int, limit: Optional[int]
                        ) -> tuple[tuple[int, ...], ...]:
    """stage_shape_counts with each stage's two counts joined: (recomputed counts..., plain counts...)."""
    return tuple(redone + plain for redone, plain in stage_shape_counts(model, sizes, pp, limit))


@lru_cache(maxsize=64)
def layer_kind_counts(model: ModelSpec) -> tuple[tuple[int, ...], ...]:
    """Entry i: how many of the first i layers have each distinct shape (layer_shapes' order)."""
    kinds = {layer: index for index, layer in enumerate(layer_shapes(model))}
    counts = [(0,) * len(kinds)]
    for layer in model.layers:
        row = list(counts[-1])
        row[kinds[layer]] += 1
        counts.append(tuple(row))
    return tuple(counts)


@lru_cache(maxsize=1 << 16)
def layer_terms(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, strategy: LayerStrategy,
                recompute: str, experts: tuple[int, Optional[int]], micro_batch_size: int
                ) -> tuple[tuple[float, ...], tuple[float, ...], tuple[float, ...]]:
    """(micro_batch_s, state_bytes, activation_bytes) of each distinct layer shape (layer_shapes' order) under
    `strategy` recomputed as `recompute`, the MoE layers with the expert degrees. Memoised: one entry serves
    every split, chunk count and recomputed-layer count of the layout."""
    training = _as_layers_see_it(training, recompute)
    layout = _recomputed(strategy, recompute)
    costs = [layer_cost(layer, with_experts(layer, layout, *experts), micro_batch_size, model.seq_length, cluster,
                        _same_modules_of(training, layer) if recompute == "selective" else training)
             for layer in layer_shapes(model)]
    return (tuple(cost.micro_batch_s for cost in costs), tuple(cost.state_bytes for cost in costs),
            tuple(cost.activation_bytes for cost in costs))


@lru_cache(maxsize=64)
def layer_shapes(model: ModelSpec) -> tuple:
    """The model's distinct layer shapes in the order they first occur (one order for equal models)."""
    return tuple(dict.fromkeys(model.layers))


@lru_cache(maxsize=1 << 14)
def end_stage_seconds(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, strategy: LayerStrategy,
                      mtp_recompute: str, experts: tuple[int, Optional[int]], micro_batch_size: int, pp: int
                      ) -> tuple[float, float]:
    """(the embedding's seconds per micro-batch on the first stage, the LM head's and the multi-token
    prediction modules' on the head's stage), as cost.estimate.stage_costs adds them; the MTP layers run the
    last layer's layout recomputed as `mtp_recompute`. Memoised: every split and chunk count shares it."""
    embedding, head = _part_seconds(model, cluster, set_free(training), strategy, micro_batch_size, pp)
    if not model.mtp_num_layers:
        return embedding, head
    layout = with_experts(model.layers[-1], _recomputed(strategy, mtp_recompute), *experts)
    layer = model.mtp_layer
    seen = _same_modules_of(training, layer) if mtp_recompute == "selective" else set_free(training)
    mtp_layer = layer_cost(layer, layout, micro_batch_size, model.seq_length, cluster, seen)
    return embedding, head + model.mtp_num_layers * mtp_layer.micro_batch_s


@lru_cache(maxsize=1 << 14)
def _part_seconds(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, strategy: LayerStrategy,
                  micro_batch_size: int, pp: int) -> tuple[float, float]:
    """(the embedding's, the LM head's and the MTP modules' beside their layers) seconds per micro-batch. They
    read no --recompute-modules set: callers pass `training` as set_free gives it."""
    parts = embedding_cost(local_model(model, strategy), gradient_strategy(strategy), micro_batch_size, cluster,
                           training, pp)
    mtp = mtp_cost(local_model(model, strategy), gradient_strategy(strategy), micro_batch_size, cluster, training,
                   pp).micro_batch_s if model.mtp_num_layers else 0.0
    return parts.embedding.micro_batch_s, parts.head.micro_batch_s + mtp


def set_free(training: TrainingSpec) -> TrainingSpec:
    """`training` as every cost that involves no selectively recomputed layer sees it (_as_layers_see_it):
    the key under which the searches of all --recompute-modules sets share such costs. One object for equal specs
    (cost.layer_cost.without_recompute_modules interns it), so the caches keyed on it match by identity."""
    return _as_layers_see_it(training, "none")


@lru_cache(maxsize=256)
def _as_layers_see_it(training: TrainingSpec, recompute: str) -> TrainingSpec:
    """`training` with the default --recompute-modules unless the layers are selectively recomputed: the set
    shapes nothing else of a layer's cost (cost.layer_cost normalises it the same way), so one cache entry
    serves every set."""
    return training if recompute == "selective" else without_recompute_modules(training)


_FIRST_WITH_MODULES: dict = {}
"""(training spec as set_free gives it, layer shape, the modules selective recomputation re-runs of it) -> the
first training spec seen with them: _same_modules_of's representatives."""


@lru_cache(maxsize=4096)
def _same_modules_of(training: TrainingSpec, layer) -> TrainingSpec:
    """The first training spec seen that equals `training` but for a --recompute-modules set that re-runs the
    same modules of `layer` (TrainingSpec.selective_modules). A layer's cost reads the set only through those
    modules, so the cost model's cache prices the layer once for all such sets (issue 37)."""
    if len(_FIRST_WITH_MODULES) > 4096:
        _FIRST_WITH_MODULES.clear()
    key = (set_free(training), layer, training.selective_modules(layer))
    return _FIRST_WITH_MODULES.setdefault(key, training)


@lru_cache(maxsize=4096)
def _recomputed(strategy: LayerStrategy, recompute: str) -> LayerStrategy:
    return strategy if strategy.recompute == recompute else replace(strategy, recompute=recompute)
