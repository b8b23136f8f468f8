"""Galvatron's space: a strategy per layer, searched by DP under the memory budget.

Outer loop: pipeline degree p and micro-batch size (samples per micro-batch).
Per stage: the decision tree prunes the strategies, the layer DP (dp_kernel)
finds the fastest strategies for every stage length within the memory left after
the stage's fixed parts, once per ceiling on the transient memory. Then the
partition step balances the stages (partition.py). Virtual stages are searched
in the megatron space, whose best plan the hybrid search also considers.
Candidates run in order of a memory-free bound; before its DP, each must also
beat the best plan so far under the Lagrangian memory relaxation (relaxation.py).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np

from ..cost.estimate import estimate_plan
from ..cost.models import core_share
from ..cost.peak_memory import allocated_limit_bytes, communicator_count
from ..errors import UserError
from ..plan import Chunk, LayerStrategy, Plan, boundary_layout_for
from ..specs.cluster import ClusterSpec
from ..specs.model import ModelSpec
from ..specs.training import TrainingSpec
from .constraints import SearchConstraints
from .dp_kernel import backtrack, layer_dp, layer_dp_batch
from .megatron_space import SpaceStats
from .partition import best_partition, partition_lower_bound
from .relaxation import relaxed_spans
from .space import StageContext, prune_strategies
from .tables import LayerTables, StageFixed, layer_tables, stage_fixed
from .integers import divisors

DEFAULT_MEMORY_UNITS = 128


@dataclass(frozen=True)
class HybridOptions:
    memory_units: int = DEFAULT_MEMORY_UNITS
    """Granularity of the DP's memory axis: the budget is split into this many units."""
    max_stage_factor: float = 2.0
    """A stage holds at most this many times the average layers per stage (plus one)."""
    tune_embedding: bool = True
    """Try every TP degree of the space for the embedding and head, each (pipeline degree, micro-batch) pair
    once per degree with the same layer tables; else only the widest (`embedding_layout`)."""


def pipeline_degrees(model: ModelSpec, cluster: ClusterSpec, constraints: SearchConstraints) -> list[int]:
    return [p for p in divisors(cluster.world_size)
            if p <= model.num_layers and constraints.pp in (None, p)]


def micro_batch_sizes(training: TrainingSpec, pp: int, gpus: int) -> list[int]:
    """Samples per micro-batch (across a stage): at least p micro-batches, so that
    no stage idles for more than half the iteration, when the batch allows it."""
    sizes = [q for q in divisors(training.global_batch_size) if training.global_batch_size // q >= pp]
    return sizes or [1]


def embedding_layout(strategies: list[LayerStrategy], tp: Optional[int] = None) -> LayerStrategy:
    """Embedding and LM head layout: by default the widest TP of the space (vocab-parallel;
    logits take 4sbV/t), else the given TP; ZeRO-1 when the space uses it."""
    pool = [s for s in strategies if tp is None or s.tp == tp] or strategies
    chosen = max(pool, key=lambda s: (s.tp, s.zero == 1, -s.zero))
    return LayerStrategy(tp=chosen.tp, dp=chosen.dp, zero=min(chosen.zero, 1), sp=chosen.sp)


def _span_times(tables: LayerTables, fixed: list[StageFixed], budget: float, max_len: int, unit: float,
                uniform: bool, num_layers: int):
    """Per stage: [L, max_len+1] best seconds per micro-batch at each start and length
    (inf where nothing fits), and the transient ceiling (in memory units) that achieved it.

    A stage's peak adds the largest transient of its layers to the sum of their
    resident memory, so each ceiling k admits the strategies whose transient
    rounds up to at most k units and leaves k units fewer for the rest; the best
    over all ceilings is the stage's optimum (conservative by the rounding).
    Every (stage, ceiling) problem of one start runs in one batched DP pass.
    """
    spans = [np.full((num_layers, max_len + 1), np.inf) for _ in fixed]
    ceilings = [np.zeros((num_layers, max_len + 1)) for _ in fixed]
    for start in ([0] if uniform else range(num_layers)):
        rows = slice(start, min(num_layers, start + max_len))
        levels = np.unique(_transient_units(tables, rows, unit))
        problems = [(s, int(level)) for s in range(len(fixed)) for level in levels
                    if _budget_units(budget, fixed[s], unit, level) >= 0]
        for batch in _batches(problems, 256):
            arrays = [_stage_arrays(tables, fixed[s], rows, unit, level) for s, level in batch]
            budgets = np.array([_budget_units(budget, fixed[s], unit, level) for s, level in batch])
            best = layer_dp_batch(np.stack([a[0] for a in arrays]), np.stack([a[1] for a in arrays]),
                                  tables.transition, budgets, tables.groups,
                                  np.stack([fixed[s].exit_transition for s, _ in batch]))
            for (s, ceiling), times in zip(batch, best):
                lengths = np.arange(1, times.size + 1)
                candidate = times + fixed[s].time
                better = candidate < spans[s][start, lengths]
                spans[s][start, lengths[better]] = candidate[better]
                ceilings[s][start, lengths[better]] = ceiling
    if uniform:
        for s in range(len(fixed)):
            for start in range(1, num_layers):
                width = min(max_len, num_layers - start)
                spans[s][start, :width + 1] = spans[s][0, :width + 1]
                ceilings[s][start, :width + 1] = ceilings[s][0, :width + 1]
    return spans, ceilings


def _batches(items: list, size: int):
    for index in range(0, len(items), size):
        yield items[index:index + size]


def _transient_units(tables: LayerTables, rows: slice, unit: float) -> np.ndarray:
    return np.ceil(tables.transient[rows] / unit)


def _budget_units(budget: float, fixed: StageFixed, unit: float, ceiling_units: int) -> int:
    """Memory units left for the layers' resident memory under a transient ceiling."""
    return int((budget - fixed.memory) // unit) - fixed.extra_units(ceiling_units, unit)


def _stage_arrays(tables: LayerTables, fixed: StageFixed, rows: slice, unit: float, ceiling_units: int):
    allowed = _transient_units(tables, rows, unit) <= ceiling_units
    time = np.where(allowed, tables.time[rows], np.inf)
    time[0] += fixed.entry_transition
    if fixed.first_layer_is_first_unit:
        time[0] += tables.first_extra[rows][0]
    memory = tables.state[rows] + fixed.in_flight * tables.activation[rows]
    return time, np.ceil(memory / unit).astype(np.int64)


def _run_stage_dp(tables, fixed, budget, rows, unit, ceiling_units):
    """The stage's layer DP with choices kept, for backtracking the chosen span."""
    time, units = _stage_arrays(tables, fixed, rows, unit, int(ceiling_units))
    budget_units = _budget_units(budget, fixed, unit, int(ceiling_units))
    return layer_dp(time, units, tables.transition, budget_units, groups=tables.groups,
                    last_extra=fixed.exit_transition), units


def _lower_bound(tables: tuple[LayerTables, ...], fixed: list[StageFixed], m: int) -> float:
    """No plan with these tables beats this: (m - 1) max T + sum T >= sum T (m - 1 + p) / p,
    and sum T >= each layer's fastest strategy on any stage plus the stages' fixed parts (memory ignored)."""
    fastest = np.min([table.time.min(axis=1) for table in _distinct(tables)], axis=0)
    total = float(fastest.sum()) + sum(f.time for f in fixed)
    return total * (m - 1 + len(fixed)) / len(fixed)


@dataclass(frozen=True)
class Candidate:
    """One (pipeline degree, micro-batch) pair with its tables, before the DP runs."""

    pp: int
    samples: int
    tables: tuple[LayerTables, ...]
    """Per stage: its layers' cost tables, on its node group's GPUs (one object for every stage of a uniform
    cluster)."""
    embedding: LayerStrategy
    fixed: tuple[StageFixed, ...]
    lower_bound: float


def _prepare(model, cluster, training, constraints, pp, samples, stats, options: HybridOptions) -> list[Candidate]:
    """The candidates of one (pipeline degree, micro-batch): one per TP degree of the embedding and head
    (with `options.tune_embedding`; else the widest), sharing the layers' cost tables."""
    gpus = cluster.world_size // pp
    strategies, removed = prune_strategies(StageContext(gpus, cluster, model, constraints, samples))
    for rule, count in removed:
        stats.drop(rule, count)
    if not strategies:
        return []
    try:
        boundary = boundary_layout_for(gpus, samples, model.seq_length) if pp > 1 else None
    except UserError:
        stats.drop("boundary-splits", len(strategies))
        return []
    m = training.global_batch_size // samples
    views = cluster.stage_clusters(pp)  # a mixed cluster's stages each priced on their own node group
    pins = (constraints.ep, constraints.etp)
    priced = {view: layer_tables(model, view, training, strategies, samples, m, pins) for view in dict.fromkeys(views)}
    tables = tuple(priced[view] for view in views)
    candidates = []
    for tp in sorted({s.tp for s in strategies}) if options.tune_embedding else [None]:
        embedding = embedding_layout(strategies, tp)
        fixed = tuple(stage_fixed(model, views[s], training, embedding, s, pp, samples, m, tables[s].strategies,
                                  boundary or embedding, job=cluster) for s in range(pp))
        candidates.append(Candidate(pp, samples, tables, embedding, fixed, _lower_bound(tables, list(fixed), m)))
    return candidates


def _distinct(items: tuple) -> list:
    """`items` without repeats of one object, in order (the stages of one node group share their tables)."""
    return list({id(item): item for item in items}.values())


def _relaxed_bound(candidate: Candidate, model, budget: float, max_len: int, m: int, enough: float) -> float:
    """No plan of this candidate beats the partition bound of its relaxed spans (relaxation.py):
    every exact span is at least its relaxed one, and the schedule's (m - 1) max + sum grows
    with each span (partition.py)."""
    spans = relaxed_spans(candidate.tables[0], list(candidate.fixed), budget, max_len, model.num_layers,
                          model.is_uniform())
    return partition_lower_bound(spans, model.num_layers, m, enough)


def _solve(candidate: Candidate, model, cluster, training, options, stats,
           incumbent: float = math.inf) -> Optional[Plan]:
    """The DP and partition for one candidate: its best plan, or None if nothing fits or if
    its relaxed bound shows it cannot beat `incumbent` seconds."""
    pp, tables, fixed = candidate.pp, candidate.tables, list(candidate.fixed)
    m = training.global_batch_size // candidate.samples
    # The fewest communicators any plan of this depth creates: estimate_plan checks the plan found.
    tied = not model.untie_embeddings_and_output_weights
    budgets = [allocated_limit_bytes(view, training, communicator_count((), pp, tied))
               for view in cluster.stage_clusters(pp)]  # each stage within its own GPU's memory
    if min(budgets) <= 0:
        return None
    units = [budget / options.memory_units for budget in budgets]
    max_len = min(model.num_layers - pp + 1, int(options.max_stage_factor * math.ceil(model.num_layers / pp)) + 1)
    if incumbent < math.inf and core_share(cluster) == 1.0 and not cluster.is_mixed:
        with stats.timed("hybrid space: relaxed bound"):
            if _relaxed_bound(candidate, model, budgets[0], max_len, m, incumbent) >= incumbent:
                stats.drop("memory-relaxed-bound")
                return None
    with stats.timed("hybrid space: layer DP"):
        spans, ceilings = _stage_span_times(tables, fixed, budgets, max_len, units, model.is_uniform(),
                                            model.num_layers)
    stats.evaluated += sum(len(table.strategies) for table in tables)
    with stats.timed("hybrid space: pipeline partition"):
        partition = best_partition(spans, model.num_layers, m)
    if partition is None:
        return None
    chunks = []
    for s, (start, length) in enumerate(zip(partition.starts, partition.lengths)):
        rows = slice(start, start + length)
        result, used = _run_stage_dp(tables[s], fixed[s], budgets[s], rows, units[s], ceilings[s][start, length])
        chunks.append(Chunk(tuple(tables[s].strategies[j] for j in backtrack(result, used, length))))
    plan = Plan(space="hybrid", world_size=cluster.world_size, pipeline_parallel=pp,
                global_batch_size=training.global_batch_size, num_micro_batches=m, chunks=tuple(chunks),
                embedding=candidate.embedding, model=model, cluster=cluster.name)
    plan = plan.with_prediction(estimate_plan(plan, model, cluster, training))
    return plan if plan.prediction.fits else None


def _stage_span_times(tables: tuple[LayerTables, ...], fixed: list[StageFixed], budgets: list[float], max_len: int,
                      units: list[float], uniform: bool, num_layers: int):
    """_span_times of every stage, run once for the stages that share their tables and budget (all of them on a
    uniform cluster; a mixed cluster's node group each)."""
    spans, ceilings = [None] * len(fixed), [None] * len(fixed)
    shared: dict[tuple[int, float], list[int]] = {}
    for stage in range(len(fixed)):
        shared.setdefault((id(tables[stage]), budgets[stage]), []).append(stage)
    for stages in shared.values():
        first = stages[0]
        found = _span_times(tables[first], [fixed[s] for s in stages], budgets[first], max_len, units[first],
                            uniform, num_layers)
        for stage, span, ceiling in zip(stages, *found):
            spans[stage], ceilings[stage] = span, ceiling
    return spans, ceilings


def search_hybrid(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, constraints: SearchConstraints,
                  progress: Callable[[float], None] | None = None, stats: SpaceStats | None = None,
                  options: HybridOptions = HybridOptions(),
                  incumbent: float = math.inf) -> tuple[Optional[Plan], SpaceStats]:
    """The fastest fitting per-layer plan with v = 1 that beats `incumbent` seconds (None if none).

    Candidates run in order of their lower bound, so the incumbent tightens early
    and every candidate whose bound cannot beat it is skipped unsolved.
    """
    stats = stats or SpaceStats()
    # Where ranks time-slice CPU cores, estimate_plan (cost.timeslice)
    # can undercut the DP's sums, which then bound nothing: no candidate is skipped on a bound.
    bounded = core_share(cluster) == 1.0
    candidates = []
    for pp in pipeline_degrees(model, cluster, constraints):
        sizes = micro_batch_sizes(training, pp, cluster.world_size // pp)
        stats.drop("micro-batches-at-least-pp", len(divisors(training.global_batch_size)) - len(sizes))
        with stats.timed("hybrid space: cost tables"):
            candidates += [c for q in sizes for c in _prepare(model, cluster, training, constraints, pp, q, stats,
                                                              options)]
    candidates.sort(key=lambda c: (c.lower_bound, c.pp, c.samples))
    best: Optional[Plan] = None
    for index, candidate in enumerate(candidates):
        bound = min(incumbent, best.prediction.iteration_time_s if best else math.inf)
        if bounded and candidate.lower_bound >= bound:
            stats.drop("lower-bound", len(candidates) - index)
            break
        plan = _solve(candidate, model, cluster, training, options, stats, bound)
        if plan is not None and plan.prediction.iteration_time_s < bound:
            best = plan
        if progress:
            progress((index + 1) / len(candidates))
    return best, stats
