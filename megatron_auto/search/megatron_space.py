"""Search over what stock Megatron-Core runs: one TP/DP/SP/ZeRO layout for all layers.

The outer loop walks (tp, pp, cp) and the recomputation choice; for each it picks
the fastest micro-batch size, virtual-stage count and pipeline split
(`best_uniform_plan`). For full recomputation, memory falls and time rises with
the number of recomputed layers per chunk, so the fewest layers that fit are
found by bisection.
"""
from __future__ import annotations

import itertools
import math
import time
from contextlib import contextmanager
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Callable, Iterator, Optional

from ..cost.communication import dp_comm_time, tp_comm_time
from ..cost.context_parallel import cp_comm_problem
from ..errors import UserError
from ..plan import LayerStrategy, Plan
from ..specs.cluster import ClusterSpec
from ..specs.model import ModelSpec
from ..specs.training import TrainingSpec
from .balanced_layouts import balanced_layouts
from .constraints import SearchConstraints
from .experts import expert_degree_choices, moe_layers
from .integers import divisors
from .mixed_splits import interleaved_layouts, mixed_stage_splits
from .pruning import enabled as pruning_enabled, search_cache
from .stage_bound import set_free
from .uniform import (ACCOUNTED, UniformConfig, best_uniform_plan, chunk_sizes, config_dp, even_split,
                      megatron_uneven_splits, states_overflow, virtual_stage_choices)
from .uniform_floors import (candidate_floors, cannot_fit, micro_batch_floors, no_module_set_fits,
                             pipeline_lower_bound, plain_floor)

MIN_CP_TOKENS = 2048
"""Context parallelism is searched where each CP rank keeps at least this many tokens of a sequence: below
it the rank's GEMMs shrink while the K/V exchange does not (cost/context_parallel.py); this keeps the
2048-token GPT-3 shapes at cp 1 and offers cp 2 to 4096-token and cp 2-4 to 8192-token models."""
CP_DEGREES = (2, 4, 8, 16, 32)
"""Up to the 32 ranks NVIDIA's long-sequence runs split a million tokens over (NeMo's long-sequence table:
Llama 2 7B at 1M tokens, TP8 x CP32)."""


@dataclass
class SpaceStats:
    """Counters the search reports."""

    evaluated: int = 0
    pruning: dict = None
    timings: dict = None
    """Wall-clock seconds per phase of the search (phase name -> seconds), in first-seen order."""

    def __post_init__(self) -> None:
        self.pruning = self.pruning or {}
        self.timings = self.timings or {}

    def drop(self, rule: str, count: int = 1) -> None:
        self.pruning[rule] = self.pruning.get(rule, 0) + count

    @contextmanager
    def timed(self, phase: str) -> Iterator[None]:
        """Add the wall-clock time of the `with` body to `timings[phase]`."""
        started = time.perf_counter()
        try:
            yield
        finally:
            self.timings[phase] = self.timings.get(phase, 0.0) + time.perf_counter() - started


def parallel_degrees(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec,
                     constraints: SearchConstraints, stats: SpaceStats) -> Iterator[tuple[int, int]]:
    """(tp, pp) pairs that survive the decision tree's global rules."""
    world = cluster.world_size
    layer = model.layers[0]
    for tp in divisors(world):
        for pp in divisors(world // tp):
            dp = world // (tp * pp)
            if (constraints.tp not in (None, tp) or constraints.pp not in (None, pp)
                    or constraints.dp not in (None, dp)):
                stats.drop("constraints")
            elif layer.tensor_parallel_error(tp) is not None:
                stats.drop("tp-divides-heads")
            elif tp > cluster.common_node_gpus:
                stats.drop("tp-within-node")
            elif pp > model.num_layers:
                stats.drop("pp-at-most-layers")
            elif not any(dp % cp == 0 and training.global_batch_size % (dp // cp) == 0 for cp in (1, *CP_DEGREES)):
                stats.drop("batch-splits-over-dp")  # with CP the replicas are dp / cp: context_parallel_choices
            else:
                yield tp, pp


def context_parallel_choices(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec,
                             constraints: SearchConstraints, tp: int, pp: int, stats: SpaceStats) -> list[int]:
    """CP degrees searched with (tp, pp): 1, and the decision tree's CP rules on the others: what the cost
    model prices under CP (plan.context_parallel_problem: layers without multi-latent attention, no
    multi-token prediction) on the flash core (what the runtime runs CP with), what Transformer Engine's CP
    attention runs with --cp-comm-type (cost.context_parallel.cp_comm_problem), sequences long enough
    (MIN_CP_TOKENS), a data-parallel degree that splits the batch. The tp x cp ranks may span nodes, as
    NVIDIA's recipes run them (Llama 3.1 405B at TP8 x CP2, 1M tokens at TP8 x CP32): the K/V ring's
    cross-node hops are priced at the NICs of the group's ranks per node (cost/context_parallel.py)."""
    rest = cluster.world_size // (tp * pp)
    if constraints.cp is not None:
        cp = constraints.cp
        problem = cp_comm_problem(model, 1, cp, training)  # at tp 1, what no tp can mend
        if problem:
            raise UserError(problem)
        fits_batch = rest % cp == 0 and training.global_batch_size % (rest // cp) == 0
        return [cp] if fits_batch and not cp_comm_problem(model, tp, cp, training) else []
    choices = [1] if training.global_batch_size % rest == 0 else []
    mla = any(layer.mla is not None for layer in model.distinct_layers)
    if mla or model.mtp_num_layers or training.attention_backend != "flash":
        return choices
    for cp in CP_DEGREES:
        if rest % cp or training.global_batch_size % (rest // cp):
            continue
        if model.seq_length // cp < MIN_CP_TOKENS or model.seq_length % (2 * cp):
            stats.drop("cp-long-sequences")
        elif cp_comm_problem(model, tp, cp, training):
            stats.drop("cp-comm-type")
        else:
            choices.append(cp)
    return choices


def recompute_choices(constraints: SearchConstraints) -> list[str]:
    return [constraints.recompute] if constraints.recompute else ["none", "selective", "full"]


def stage_splits(model: ModelSpec, pp: int) -> list[Optional[tuple[int, ...]]]:
    """The even split (when it exists) and Megatron's uneven first/last splits near it."""
    splits: list[Optional[tuple[int, ...]]] = []
    if even_split(model.num_layers, pp):
        splits.append(None)
    average = model.num_layers / pp
    for split in megatron_uneven_splits(model.num_layers, pp):
        if split != even_split(model.num_layers, pp) and abs(split[0] - average) <= 2 and abs(split[-1] - average) <= 2:
            splits.append(split)
    return splits


def pipeline_splits(model: ModelSpec, pp: int) -> list[tuple[Optional[tuple[int, ...]], tuple[bool, bool]]]:
    """(stage_layers, account_for) of every split searched: stage_splits, and the even splits that count the
    embedding and/or the loss as layers where they give interleaved chunks (virtual_stage_choices)."""
    splits = [(split, (False, False)) for split in stage_splits(model, pp)]
    for account_for in ACCOUNTED if pp > 1 else ():
        if virtual_stage_choices(model, UniformConfig(tp=1, pp=pp, micro_batch_size=1, account_for=account_for)):
            splits.append((None, account_for))
    return splits


def _balanced_layouts(model: ModelSpec, pp: int, stock: list, training: TrainingSpec,
                      constraints: SearchConstraints) -> list[tuple[int, ...]]:
    """search/balanced_layouts.py's chunk layouts where no stock split (`stock`: pipeline_splits(model, pp))
    interleaves at this pp and chunks are wanted: the user's --virtual-stages above one (at that count), or the EP
    overlap, which Megatron-Core refuses at pp > 1 without them. Not otherwise: they would double the search of
    DeepSeek-V3 on 1,024 GPUs (issue 37's 2 s) for the bubble alone, where its one-chunk plans win."""
    wanted = (constraints.vp or 1) > 1 or (training.moe_ep_overlap and moe_layers(model))
    if pp < 2 or not wanted:
        return []
    if any(v > 1 for split, account_for in stock for v in virtual_stage_choices(
            model, UniformConfig(tp=1, pp=pp, micro_batch_size=1, stage_layers=split, account_for=account_for))):
        return []
    layouts = balanced_layouts(model.num_layers, pp)
    return [layout for layout in layouts if not constraints.vp or len(layout) == pp * constraints.vp]


def _key(plan: Plan) -> tuple[bool, float]:
    return (not plan.prediction.fits, plan.prediction.iteration_time_s)


def search_megatron(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec,
                    constraints: SearchConstraints, progress: Callable[[float], None] | None = None,
                    stats: SpaceStats | None = None, incumbent: float = math.inf) -> tuple[Optional[Plan], SpaceStats]:
    """The fastest megatron-space plan (or the smallest non-fitting one if none fits); with a finite
    `incumbent`, candidates its bounds show no faster than `incumbent` seconds may be left out."""
    stats = stats or SpaceStats()
    degrees = [(tp, pp, cp) for tp, pp in parallel_degrees(model, cluster, training, constraints, stats)
               for cp in context_parallel_choices(model, cluster, training, constraints, tp, pp, stats)]
    pairs = _most_promising_first(model, cluster, _shared_key(training), tuple(degrees))
    best: Optional[Plan] = None
    known = incumbent
    for index, (tp, pp, cp) in enumerate(pairs):
        incumbent = min(known, best.prediction.iteration_time_s if best is not None and best.prediction.fits
                        else math.inf)
        for plan in _plans_for_degrees(model, cluster, training, constraints, (tp, pp, cp), stats, incumbent):
            if best is None or _key(plan) < _key(best):
                best = plan
        if progress:
            progress((index + 1) / len(pairs))
    return best, stats


def _shared_key(training: TrainingSpec) -> TrainingSpec:
    """`training` as stage_bound.set_free gives it where the shared caches are on (search/pruning.py): the key
    under which every --recompute-modules set's search shares a result that reads no selectively recomputed
    layer."""
    return set_free(training) if pruning_enabled() else training


@search_cache(maxsize=256)
def _most_promising_first(model, cluster, training, degrees: tuple) -> tuple:
    """`degrees` sorted by _promise, memoised: no selectively recomputed layer enters it."""
    return tuple(sorted(degrees, key=lambda degree: _promise(model, cluster, training, *degree)))


def _promise(model, cluster, training, tp: int, pp: int, cp: int = 1) -> float:
    """The least pipeline_lower_bound of (tp, pp, cp) over micro-batch sizes, memory ignored: walking
    the degrees in this order finds a fast plan early, so the bound prunes more of the rest."""
    config = UniformConfig(tp=tp, pp=pp, micro_batch_size=1, sequence_parallel=True, cp=cp)
    dp = config_dp(cluster, config)
    most_virtual = model.num_layers // pp if model.num_layers % pp == 0 else 1
    return min(pipeline_lower_bound(model, cluster, training, config, mbs, most_virtual)
               for mbs in divisors(training.global_batch_size // dp))


def _sp_choices(model, cluster, training, constraints, tp: int, dp: int) -> tuple[bool, ...]:
    """Sequence parallelism whenever tp > 1, unless pinned; without it as well where the cost model
    prices SP's all-gather + reduce-scatter above the all-reduce at some micro-batch size
    (measured gloo curves), since the sp-with-tp rule then does not hold."""
    if constraints.sequence_parallel is not None or tp == 1:
        return (bool(constraints.sequence_parallel) and tp > 1,)
    if moe_layers(model):
        return (True,)  # Megatron-Core's MoELayer refuses TP without SP in training
    layer, word = model.layers[0], training.activation_bytes
    for samples in {1, max(1, training.global_batch_size // dp)}:
        with_sp = tp_comm_time(layer.hidden_size, model.seq_length, samples, LayerStrategy(tp=tp, dp=dp, sp=True),
                               cluster, word)
        without = tp_comm_time(layer.hidden_size, model.seq_length, samples, LayerStrategy(tp=tp, dp=dp),
                               cluster, word)
        if with_sp > without:
            return (True, False)
    return (True,)


def _distributed_choices(model, cluster, training, constraints, tp: int, dp: int) -> tuple[bool, ...]:
    """The distributed optimizer (ZeRO-1) whenever dp > 1, unless pinned; plain DP as well where
    the cost model prices ZeRO-1's reduce-scatter + all-gather above the all-reduce (measured
    gloo curves), since the distributed-optimizer-over-dp rule then does not hold."""
    if constraints.distributed_optimizer is not None:
        return (constraints.distributed_optimizer,)
    if dp == 1:
        return (False,)
    params = model.layers[0].num_parameters
    plain = dp_comm_time(params, LayerStrategy(tp=tp, dp=dp), cluster, training)
    zero1 = dp_comm_time(params, LayerStrategy(tp=tp, dp=dp, zero=1), cluster, training)
    return (True,) if zero1 <= plain else (True, False)


def _plans_for_degrees(model, cluster, training, constraints, degrees, stats, incumbent) -> Iterator[Plan]:
    for bound, base in _base_configs(model, cluster, training, constraints, degrees, stats):
        if incumbent < math.inf and bound is None:
            bound = _config_bound(model, cluster, _shared_key(training), _any_recompute(constraints), base)
        if incumbent < math.inf and bound < incumbent and pruning_enabled():
            bound = max(bound, _flags_floor(model, cluster, set_free(training), _any_recompute(constraints), base))
        if incumbent < math.inf and bound >= incumbent:
            stats.drop("lower-bound", len(recompute_choices(constraints)))
            continue
        for recompute in recompute_choices(constraints):
            if recompute == "full" and training.moe_ep_overlap and base.ep > 1:
                stats.drop("ep-overlap-without-full-recompute")  # Megatron-Core refuses it (cost/ep_overlap.py)
                continue
            if recompute == "selective" and _no_selective_fits(model, cluster, set_free(training),
                                                               _any_recompute(constraints), base):
                stats.drop(SELECTIVE_NEVER_FITS)
                continue
            with stats.timed(f"megatron space: recompute {recompute}"):
                plan = _best_for_recompute(model, cluster, training, constraints,
                                           base.but(recompute=recompute), stats, incumbent)
            if plan is not None:
                if plan.prediction.fits:
                    incumbent = min(incumbent, plan.prediction.iteration_time_s)
                yield plan


def _base_configs(model, cluster, training, constraints, degrees, stats) -> list[tuple[Optional[float], UniformConfig]]:
    """(lower bound, flags) for the flag combinations of (tp, pp) without recomputation whose states fit,
    most promising first (the order lets the incumbent prune more of the rest; with MoE layers the expert
    degrees multiply them). The bound is computed here only to sort by it (None otherwise: the caller
    computes it once an incumbent makes it useful). `degrees`: (tp, pp, cp). None of it reads what selective
    recomputation re-runs, so with the shared caches on (search/pruning.py) every --recompute-modules set's
    search takes it from one memoised call."""
    if pruning_enabled():
        configs, drops = _shared_base_configs(model, cluster, set_free(training), _any_recompute(constraints),
                                              degrees)
    else:
        configs, drops = _base_configs_and_drops(model, cluster, training, constraints, degrees)
    for rule, count in drops:
        stats.drop(rule, count * (len(recompute_choices(constraints)) if rule == STATES_EXCEED else 1))
    return list(configs)


def _base_configs_and_drops(model, cluster, training, constraints, degrees):
    """_base_configs' list, and the (rule, count) it dropped in order."""
    tp, pp, cp = degrees
    dp = cluster.world_size // (tp * pp * cp)
    drops = []
    experts = expert_degree_choices(model, tp, tp * cp * dp, cluster.common_node_gpus, constraints.ep,
                                    constraints.etp)
    if not experts:
        drops.append(("expert-degrees", 1))
    stock = pipeline_splits(model, pp)
    splits = [(split, account_for, None) for split, account_for in stock]
    splits += [(None, (False, False), layout) for layout in _balanced_layouts(model, pp, stock, training, constraints)]
    splits += _mixed_splits(model, cluster, training, constraints, degrees)
    distributed = (False,) if constraints.fsdp_sharding else \
        _distributed_choices(model, cluster, training, constraints, tp, dp * cp)
    choices = itertools.product(dict.fromkeys(splits), _sp_choices(model, cluster, training, constraints, tp, dp),
                                distributed, experts)
    configs = []
    for (split, account_for, layout), sp, distributed, (ep, etp) in choices:
        virtual = len(layout) // pp if layout else constraints.vp or 1
        base = UniformConfig(tp=tp, pp=pp, micro_batch_size=constraints.micro_batch_size or 1,
                             vp=virtual, sequence_parallel=sp, distributed_optimizer=distributed,
                             stage_layers=split, account_for=account_for, chunk_layers=layout,
                             ep=ep, etp=etp, cp=cp,
                             fsdp_sharding=constraints.fsdp_sharding or 0)
        if states_overflow(model, cluster, training, base):
            drops.append((STATES_EXCEED, 1))  # once per recompute choice: _base_configs counts them
        else:
            configs.append(base)
    if len(experts) == 1:
        return tuple((None, config) for config in configs), tuple(drops)
    bounded = [(_config_bound(model, cluster, training, constraints, config), config) for config in configs]
    return tuple(sorted(bounded, key=lambda pair: pair[0])), tuple(drops)


def _mixed_splits(model, cluster, training, constraints, degrees) -> list[tuple]:
    """(stage_layers, account_for, chunk_layers) of a mixed cluster's splits (search/mixed_splits.py): each at one
    chunk per stage, and as interleaved chunk layouts only where the user pinned a chunk count above one. Uneven
    interleaved layouts are not offered unasked because they ran far slower than predicted: the straggler re-plan's
    5, 5, 2, 4 in 2 chunks per stage was predicted 32.6% faster than the running plan and measured 11% faster
    (tests/runtime/test_straggler_replan.py) and 3.6% slower (benchmarks/bench_stragglers.py), where the same split
    in one chunk per stage was predicted 27.6% and measured 29.6% faster. Replaying unequal chunks one by one
    (cost.estimate.interleaved_iteration) does not explain the gap (docs/cost_model.md, section 15)."""
    tp, pp, cp = degrees
    splits = mixed_stage_splits(model, cluster, training, tp, pp, cp)
    chunks = constraints.vp if constraints.vp and constraints.vp > 1 else None
    return [(split, (False, False), None) for split in splits] + [
        (split, (False, False), layout) for split in splits for layout in
        (interleaved_layouts(split, chunks) if chunks else [])]


STATES_EXCEED = "states-exceed-memory"


@lru_cache(maxsize=64)
def _any_recompute(constraints: SearchConstraints) -> SearchConstraints:
    """`constraints` with the recomputation left open: the key under which the searches of every --recompute-modules
    set share what reads no recomputation (after the first set they search selective recomputation alone)."""
    return replace(constraints, recompute=None) if constraints.recompute else constraints


@search_cache(maxsize=4096)
def _shared_base_configs(model, cluster, training, constraints, degrees):
    """_base_configs_and_drops, memoised for the searches of every --recompute-modules set."""
    return _base_configs_and_drops(model, cluster, training, constraints, degrees)


@search_cache(maxsize=1 << 14)
def _config_bound(model, cluster, training, constraints, config: UniformConfig) -> float:
    """No plan of these flags beats this, whatever its micro-batch, chunks or recomputation: the least
    pipeline_lower_bound over the micro-batch sizes at the most chunks (recomputation only adds work).
    Memoised: `config` has no recomputation, so the bound reads no --recompute-modules set."""
    dp = config_dp(cluster, config)
    sizes = [constraints.micro_batch_size] if constraints.micro_batch_size else \
        divisors(training.global_batch_size // dp)
    virtual = max(_virtual_choices(model, config, constraints))
    return min(pipeline_lower_bound(model, cluster, training, config, size, virtual) for size in sizes)


@search_cache(maxsize=1 << 14)
def _flags_floor(model, cluster, training, constraints, config: UniformConfig) -> float:
    """_config_bound from the stages' floors (uniform.micro_batch_floors, issue 37): the least floor without
    recomputation over the micro-batch sizes and chunk counts the flags may take. Memoised on `training`
    as stage_bound.set_free gives it: every --recompute-modules set's search shares it."""
    dp = config_dp(cluster, config)
    sizes = (constraints.micro_batch_size,) if constraints.micro_batch_size else \
        tuple(divisors(training.global_batch_size // dp))
    floors = micro_batch_floors(model, cluster, training, config, sizes,
                                tuple(_virtual_choices(model, config, constraints)))
    return min(floors) if floors else -math.inf


def _best_for_recompute(model, cluster, training, constraints, config: UniformConfig, stats,
                        incumbent: float) -> Optional[Plan]:
    def evaluate(num_layers: Optional[int], micro_batch: Optional[int] = None, virtual: Optional[int] = None,
                 bound: float = incumbent) -> Optional[Plan]:
        stats.evaluated += 1
        fixed = micro_batch or constraints.micro_batch_size
        chunks = virtual or constraints.vp
        try:
            return best_uniform_plan(model, cluster, training,
                                     config.but(recompute_num_layers=num_layers,
                                                micro_batch_size=fixed or config.micro_batch_size,
                                                vp=chunks or config.vp),
                                     choose_micro_batch=fixed is None, choose_virtual_stages=chunks is None,
                                     incumbent=bound, drop_unfit=num_layers is None)
        except UserError:
            stats.drop("invalid-flags")
            return None

    if config.recompute != "full":
        return evaluate(None)
    # Without an incumbent, whether recomputing every layer fits decides whether any fewer layers can.
    # With one, the incumbent prunes it too (fewer recomputed layers are faster, so an `every` pruned as
    # slower says nothing about them): the per-pair memory floors below then skip where none fits.
    every = evaluate(None)
    if incumbent == math.inf and (every is None or not every.prediction.fits):
        return every
    # Memory falls with the layers recomputed per chunk only at a fixed micro-batch and chunk count
    # (recompute_num_layers counts per chunk: more chunks recompute more layers), so bisect per pair.
    dp = config_dp(cluster, config)
    sizes = [constraints.micro_batch_size] if constraints.micro_batch_size else \
        divisors(training.global_batch_size // dp)
    best = every
    for size, virtual in itertools.product(sizes, _virtual_choices(model, config, constraints)):
        known = min(incumbent, best.prediction.iteration_time_s if best is not None else math.inf)
        if pipeline_lower_bound(model, cluster, training, config, size, virtual) >= known or \
                plain_floor(model, cluster, training, config, size, virtual) >= known:
            continue   # no layer count recomputed at this pair beats what is known (the bounds omit recompute)
        sized = config.but(micro_batch_size=size, vp=virtual)
        if _floor_overflows(model, cluster, training, sized, None):
            continue   # not even every layer recomputed fits at this pair
        longest = max(chunk_sizes(model.num_layers, sized) or (0,))
        plan = _fewest_recomputed_layers(lambda n: evaluate(n, size, virtual), longest,
                                         lambda n: _floor_overflows(model, cluster, training, sized, n))
        if plan is not None and (best is None or _key(plan) < _key(best)):
            best = plan
    return best


SELECTIVE_NEVER_FITS = "selective-never-fits"


@search_cache(maxsize=1 << 14)
def _no_selective_fits(model, cluster, training, constraints, config: UniformConfig) -> bool:
    """Whether these flags overflow the device at every micro-batch size and chunk count they may take, every layer
    selectively recomputed, under every --recompute-modules set (uniform_floors.no_module_set_fits): then
    best_uniform_plan would screen each one out as unfit, and no set's search need walk them. Memoised on
    `training` as stage_bound.set_free gives it; False where the floors do not apply."""
    dp = config_dp(cluster, config)
    sizes = [constraints.micro_batch_size] if constraints.micro_batch_size else \
        divisors(training.global_batch_size // dp)
    selective, choices = config.but(recompute="selective"), _virtual_choices(model, config, constraints)
    overflowed = False
    for size in sizes:
        steady = training.global_batch_size // (size * dp) >= config.pp
        if overflowed and steady:
            continue  # best_uniform_plan's rule: past a size that fits under no v, no larger one with m >= p fits
        sized = selective.but(micro_batch_size=size)
        if not all(no_module_set_fits(model, cluster, training, sized, virtual) for virtual in choices):
            return False
        overflowed = overflowed or steady
    return True


def _virtual_choices(model: ModelSpec, config: UniformConfig, constraints: SearchConstraints) -> list[int]:
    """The chunk counts best_uniform_plan would choose among (every divisor of an even stage)."""
    if constraints.vp:
        return [constraints.vp]
    return virtual_stage_choices(model, config) or [1]


def _floor_overflows(model, cluster, training, config: UniformConfig, layers: Optional[int]) -> bool:
    """Whether the memory floor of `config` (search/stage_bound.py), the first `layers` layers of every chunk
    fully recomputed (None: all of them), overflows the device: then no plan of these numbers fits."""
    counted = config.but(recompute_num_layers=layers)
    floors = candidate_floors(model, cluster, training, counted, config.vp, memory=True)
    return floors is not None and floors.peak_bytes > 0 and cannot_fit(model, cluster, training, counted, floors)


def _fewest_recomputed_layers(evaluate, chunk_layers: int, overflows=lambda layers: False) -> Optional[Plan]:
    """Bisection for the fewest layers per chunk that, recomputed, make the plan fit (recomputing
    all `chunk_layers` is the caller's `every`); `overflows(n)`: the memory floor already shows that n do not
    fit, without pricing the plan."""
    low, high, best = 0, chunk_layers, None   # fewer than `low` layers do not fit; `high` fit or cannot win
    while low + 1 < high:
        middle = (low + high) // 2
        if overflows(middle):
            low = middle
            continue
        plan = evaluate(middle)
        if plan is None:
            # Pruned: recomputing `middle` or more layers cannot beat the incumbent (the bound grows
            # with the layers recomputed), so only fewer layers can win, if they fit.
            high = middle
        elif plan.prediction.fits:
            high, best = middle, plan
        else:
            low = middle
    return best
