"""Plans with one layout for every layer: what Megatron's own flags describe."""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Optional

from ..cost.estimate import estimate_plan
from ..cost.layer_cost import layer_cost
from ..cost.models import core_share, profiled_cpu_cores
from ..cost.peak_memory import allocated_limit_bytes, communicator_count
from ..errors import UserError
from ..plan import Chunk, LayerStrategy, Plan
from ..specs.cluster import ClusterSpec
from ..specs.model import ModelSpec
from ..specs.training import TrainingSpec
from .experts import moe_layers, with_experts
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
    virtual_stages: int = 1
    """Chunks per pipeline stage (--num-layers-per-virtual-pipeline-stage = layers / (pp x v))."""
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
    expert_parallel: int = 1
    """--expert-model-parallel-size: EP degree of every MoE layer."""
    expert_tensor_parallel: Optional[int] = None
    """--expert-tensor-parallel-size of every MoE layer; None: tp (Megatron's default)."""
    context_parallel: int = 1
    """--context-parallel-size: each sequence split over this many ranks (priced by `estimate`; the
    search keeps 1)."""

    def layer_strategy(self, layer, strategy: LayerStrategy) -> LayerStrategy:
        """`strategy` with this config's expert degrees on a MoE layer."""
        return with_experts(layer, strategy, self.expert_parallel, self.expert_tensor_parallel)


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
    Megatron cannot build `config`'s split: unequal stages with virtual stages, or a chunk without layers."""
    if config.chunk_layers is not None:
        given = config.chunk_layers
        fits = len(given) == config.pp * config.virtual_stages and sum(given) == num_layers and min(given) >= 1
        return given if fits else None
    stages, v = config_stage_layers(num_layers, config), config.virtual_stages
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
        return [v for v in divisors(per_stage) if v > 1 and chunk_sizes(layers, replace(config, virtual_stages=v))]
    if config.pp < 2 or stages is None or len(set(stages)) > 1:
        return [1]
    return divisors(stages[0])


def config_dp(cluster: ClusterSpec, config: UniformConfig) -> int:
    """The data-parallel degree the flags leave: world / (tp x pp x cp)."""
    return cluster.world_size // (config.tp * config.pp * config.context_parallel)


def build_uniform_plan(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec,
                       config: UniformConfig) -> Plan:
    """The Plan that Megatron runs for these flags; UserError when they cannot work."""
    world = cluster.world_size
    tp, pp, v, cp = config.tp, config.pp, config.virtual_stages, config.context_parallel
    if world % (tp * pp * cp):
        raise UserError(f"tp x pp x cp = {tp * pp * cp} does not divide the {world} GPUs")
    dp = config_dp(cluster, config)
    per_step = config.micro_batch_size * dp
    if training.global_batch_size % per_step:
        raise UserError(f"global batch {training.global_batch_size} is not divisible by micro-batch "
                        f"{config.micro_batch_size} x dp {dp}")
    sizes = chunk_sizes(model.num_layers, config)
    if sizes is None:
        counted = f" (and {sum(config.account_for)} counted for the embedding/loss)" if any(config.account_for) else ""
        raise UserError(f"{model.num_layers} layers{counted} do not split over {pp} pipeline stages x {v} chunks "
                        "as given")
    strategy = LayerStrategy(tp=tp, dp=dp, zero=1 if config.distributed_optimizer else 0,
                             sp=config.sequence_parallel and tp > 1, cp=cp)
    experts = _expert_strategy(model, strategy, config)
    chunks = _chunks(sizes, strategy, config.recompute, config.recompute_num_layers,
                     experts, _moe_pattern(model) if experts is not None else None)
    try:
        return Plan(space="megatron", world_size=world, pipeline_parallel=pp,
                    global_batch_size=training.global_batch_size,
                    num_micro_batches=training.global_batch_size // per_step, chunks=chunks,
                    embedding=strategy, virtual_stages=v, model=model, cluster=cluster.name)
    except ValueError as error:
        raise UserError(str(error)) from None


def _expert_strategy(model: ModelSpec, strategy: LayerStrategy, config: UniformConfig) -> Optional[LayerStrategy]:
    """The MoE layers' strategy (None for a dense model); UserError for expert flags Megatron rejects."""
    if not moe_layers(model):
        if config.expert_parallel != 1 or config.expert_tensor_parallel is not None:
            raise UserError(f"model '{model.name}' has no MoE layers: expert parallelism does not apply")
        return None
    try:
        return replace(strategy, ep=config.expert_parallel, etp=config.expert_tensor_parallel)
    except ValueError as error:
        raise UserError(str(error)) from None


@lru_cache(maxsize=64)
def _moe_pattern(model: ModelSpec) -> tuple[bool, ...]:
    return tuple(layer.moe is not None for layer in model.layers)


@lru_cache(maxsize=4096)
def _chunks(order: tuple[int, ...], strategy: LayerStrategy, recompute: str,
            recompute_num_layers: Optional[int], experts: Optional[LayerStrategy] = None,
            moe_pattern: Optional[tuple[bool, ...]] = None) -> tuple[Chunk, ...]:
    """Chunks of `order` layers each (chunk_sizes). Memoised: the search scores the same chunks under many
    micro-batch sizes, and the chunks' cached runs then serve every one of those plans. With `experts`, the
    layers that `moe_pattern` marks (model order) take that strategy."""
    limit = recompute_num_layers if recompute == "full" else None
    # One object per (kind, recomputed): Chunk.runs groups equal neighbours by identity first.
    variants = {(kind, on): replace(base, recompute=recompute if on else "none")
                for kind, base in ((False, strategy), (True, experts or strategy)) for on in (False, True)}
    chunks, layer = [], 0
    for size in order:
        chunks.append(Chunk(tuple(variants[(moe_pattern is not None and moe_pattern[layer + i],
                                            limit is None or i < limit)] for i in range(size))))
        layer += size
    return tuple(chunks)


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
    strategy = _layer_strategy(config.tp, dp, 1 if config.distributed_optimizer else 0,
                               config.sequence_parallel and config.tp > 1, recompute, config.context_parallel)
    m = training.global_batch_size // (micro_batch_size * dp)
    work, compute_total, idle = 0.0, 0.0, 1.0 - core_share(cluster)
    for spec, count in layer_counts(model):
        cost = layer_cost(spec, config.layer_strategy(spec, strategy), micro_batch_size, model.seq_length, cluster,
                          training)
        compute = cost.forward_s + cost.backward_s + cost.recompute_s
        work += count * (cost.micro_batch_s - idle * compute)
        compute_total += count * compute
    bound = (m + (config.pp - 1) / max_virtual_stages) * work / config.pp
    cores = profiled_cpu_cores(cluster)
    if cores:
        ranks_per_stage = cluster.world_size // config.pp
        bound = max(bound, m * compute_total * core_share(cluster) * ranks_per_stage / cores)
    return bound


@lru_cache(maxsize=4096)
def _layer_strategy(tp: int, dp: int, zero: int, sp: bool, recompute: str, cp: int = 1) -> LayerStrategy:
    """One object per layout: the bound runs per (micro-batch, chunks) and its cost lookups hash it."""
    return LayerStrategy(tp=tp, dp=dp, zero=zero, sp=sp, recompute=recompute, cp=cp)


@lru_cache(maxsize=64)
def layer_counts(model: ModelSpec) -> tuple[tuple, ...]:
    """(layer shape, how many layers have it) for each distinct shape of the model."""
    counts: dict = {}
    for layer in model.layers:
        counts[layer] = counts.get(layer, 0) + 1
    return tuple(counts.items())


def states_overflow(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, config: UniformConfig) -> bool:
    """True when some stage's layer weights, gradients and optimizer states alone, plus the
    framework overhead, exceed the memory budget: then no micro-batch size, virtual-stage
    count or recomputation makes these flags fit (activations only add to it)."""
    strategy = LayerStrategy(tp=config.tp, dp=config_dp(cluster, config),
                             zero=1 if config.distributed_optimizer else 0,
                             sp=config.sequence_parallel and config.tp > 1, cp=config.context_parallel)
    state = min(layer_cost(spec, config.layer_strategy(spec, strategy), 1, model.seq_length, cluster,
                           training).state_bytes for spec in model.distinct_layers)
    most_layers = max(config_stage_layers(model.num_layers, config) or (0,))
    tied = not model.untie_embeddings_and_output_weights
    budget = allocated_limit_bytes(cluster, training, communicator_count((), config.pp, tied))
    return most_layers * state + cluster.framework_overhead_bytes > budget


def best_uniform_plan(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, config: UniformConfig,
                      choose_micro_batch: bool, choose_virtual_stages: bool, incumbent: float = math.inf,
                      virtual_choices: Optional[list[int]] = None) -> Plan:
    """`config` with its micro-batch size and/or virtual stages replaced by the fastest valid choice
    (of `virtual_choices`, by default virtual_stage_choices).

    Fitting plans beat non-fitting ones; among each, the lower predicted time wins.
    A (micro-batch, v) whose pipeline_lower_bound cannot beat `incumbent` seconds, or
    the best fitting choice found so far, is skipped.
    """
    dp = config_dp(cluster, config)
    micro_batches = divisors(training.global_batch_size // dp) if choose_micro_batch else [config.micro_batch_size]
    if not choose_virtual_stages:
        virtual = [config.virtual_stages]
    else:
        virtual = virtual_choices if virtual_choices is not None else virtual_stage_choices(model, config)
    best: Optional[Plan] = None
    overflowed = False
    for mbs in micro_batches:
        # Activations grow with the micro-batch while the micro-batches in flight
        # (min(p - s, m)) stay put as long as m >= p: once a size fits under no v,
        # no larger size with m >= p can fit either.
        if overflowed and training.global_batch_size // (mbs * dp) >= config.pp:
            continue
        limit = min(incumbent, best.prediction.iteration_time_s if best and best.prediction.fits else math.inf)
        best, fits_none = _best_virtual(model, cluster, training, replace(config, micro_batch_size=mbs),
                                        virtual, limit, best)
        if fits_none and training.global_batch_size // (mbs * dp) >= config.pp:
            overflowed = True
    if best is None:
        raise UserError("no micro-batch size / virtual-stage count makes these flags valid"
                        + (" or beats the best plan so far" if incumbent < math.inf else ""))
    return best


def _best_virtual(model, cluster, training, config: UniformConfig, virtual: list[int], limit: float,
                  best: Optional[Plan]) -> tuple[Optional[Plan], bool]:
    """The better of `best` and the plans of `config` under each v in `virtual` whose bound
    is below `limit`; and whether every v was scored and none of them fit."""
    scored_all, fitted_any, single_overflowed = True, False, False
    # With m >= p (which v > 1 needs) interleaving holds at least 1F1B's activations on
    # every stage (cost.memory.in_flight_micro_batches: (p - 1 + s (v - 2)) / v more)
    # and the states do not change: when v = 1 overflows, so does every v, unless
    # recompute_num_layers (counted per chunk) recomputes more layers with more chunks.
    more_chunks_save_memory = config.recompute == "full" and config.recompute_num_layers is not None
    for v in virtual:
        if v > 1 and single_overflowed and not more_chunks_save_memory:
            break
        if limit < math.inf and pipeline_lower_bound(model, cluster, training, config, config.micro_batch_size,
                                                     v) >= limit:
            scored_all = False
            continue
        try:
            plan = build_uniform_plan(model, cluster, training, replace(config, virtual_stages=v))
        except UserError:
            continue
        prediction = estimate_plan(plan, model, cluster, training)
        fitted_any |= prediction.fits
        single_overflowed = v == 1 and not prediction.fits
        if best is None or _rank(prediction) < _rank(best.prediction):
            best = replace(plan, prediction=prediction)
            if prediction.fits:
                limit = min(limit, prediction.iteration_time_s)
    return best, scored_all and not fitted_any


def _rank(prediction) -> tuple[bool, float]:
    return (not prediction.fits, prediction.iteration_time_s)
