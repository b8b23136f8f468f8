"""Plans with one layout for every layer: what Megatron's own flags describe."""
from __future__ import annotations

import math
from dataclasses import replace
from functools import lru_cache
from typing import Optional

from ..cost.ep_overlap import ep_overlap_layout_problem
from ..cost.estimate import estimate_plan
from ..cost.layer_cost import layer_cost
from ..cost.peak_memory import allocated_limit_bytes, communicator_count
from ..errors import UserError
from ..plan import Chunk, LayerStrategy, Plan
from ..specs.cluster import ClusterSpec
from ..specs.model import ModelSpec
from ..specs.training import TrainingSpec
from .experts import moe_layers
from .integers import divisors
from .uniform_config import (ACCOUNTED, UniformConfig, chunk_sizes, config_dp, config_stage_layers,
                             counted_stage_layers, even_split, megatron_uneven_splits, stage_layer_counts,
                             virtual_stage_choices)
from .uniform_floors import SLOWER, UNFIT, layer_strategy, micro_batch_floors, pipeline_lower_bound, screen

__all__ = ["ACCOUNTED", "UniformConfig", "best_uniform_plan", "build_uniform_plan", "chunk_sizes", "config_dp",
           "config_stage_layers", "counted_stage_layers", "divisors", "even_split", "megatron_uneven_splits",
           "pipeline_lower_bound", "stage_layer_counts", "states_overflow", "virtual_stage_choices"]


def build_uniform_plan(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec,
                       config: UniformConfig) -> Plan:
    """The Plan that Megatron runs for these flags; UserError when they cannot work."""
    world = cluster.world_size
    tp, pp, v, cp = config.tp, config.pp, config.vp, config.cp
    dims = config.dims(world)
    num_micro_batches = dims.micro_batches(training.global_batch_size, config.micro_batch_size)
    dp = dims.dp
    sizes = chunk_sizes(model.num_layers, config)
    if sizes is None:
        counted = f" (and {sum(config.account_for)} counted for the embedding/loss)" if any(config.account_for) else ""
        raise UserError(f"{model.num_layers} layers{counted} do not split over {pp} pipeline stages x {v} chunks "
                        "as given")
    strategy = LayerStrategy(tp=tp, dp=dp, zero=config.zero,
                             sp=config.sequence_parallel and tp > 1, cp=cp)
    experts = _expert_strategy(model, strategy, config)
    problem = ep_overlap_layout_problem(pp, v, config.recompute) if (
        training.moe_ep_overlap and experts is not None and experts.ep > 1) else ""
    if problem:
        raise UserError(problem)
    chunks = _chunks(sizes, strategy, config.recompute, config.recompute_num_layers,
                     experts, _moe_pattern(model) if experts is not None else None)
    try:
        return Plan(space="megatron", world_size=world, pipeline_parallel=pp,
                    global_batch_size=training.global_batch_size,
                    num_micro_batches=num_micro_batches, chunks=chunks,
                    embedding=strategy, virtual_stages=v, mtp_chunk=config.mtp_chunk, model=model,
                    cluster=cluster.name)
    except ValueError as error:
        raise UserError(str(error)) from None


def _expert_strategy(model: ModelSpec, strategy: LayerStrategy, config: UniformConfig) -> Optional[LayerStrategy]:
    """The MoE layers' strategy (None for a dense model); UserError for expert flags Megatron rejects."""
    if not moe_layers(model):
        if config.ep != 1 or config.etp is not None:
            raise UserError(f"model '{model.name}' has no MoE layers: expert parallelism does not apply")
        return None
    try:
        return replace(strategy, ep=config.ep, etp=config.etp)
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


def states_overflow(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, config: UniformConfig) -> bool:
    """True when some stage's layer weights, gradients and optimizer states alone, plus the
    framework overhead, exceed the memory budget: then no micro-batch size, virtual-stage
    count or recomputation makes these flags fit (activations only add to it)."""
    strategy = layer_strategy(config.tp, config_dp(cluster, config), config.zero,
                              config.sequence_parallel and config.tp > 1, "none", config.cp)
    state = min(layer_cost(spec, config.layer_strategy(spec, strategy), 1, model.seq_length, cluster,
                           training).state_bytes for spec in model.distinct_layers)
    most_layers = max(config_stage_layers(model.num_layers, config) or (0,))
    tied = not model.untie_embeddings_and_output_weights
    budget = allocated_limit_bytes(cluster, training, communicator_count((), config.pp, tied))
    return most_layers * state + cluster.framework_overhead_bytes > budget


def best_uniform_plan(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, config: UniformConfig,
                      choose_micro_batch: bool, choose_virtual_stages: bool, incumbent: float = math.inf,
                      virtual_choices: Optional[list[int]] = None, drop_unfit: bool = False) -> Plan:
    """`config` with its micro-batch size and/or virtual stages replaced by the fastest valid choice
    (of `virtual_choices`, by default virtual_stage_choices).

    Fitting plans beat non-fitting ones; among each, the lower predicted time wins.
    A (micro-batch, v) whose bound (uniform_floors.screen) cannot beat `incumbent` seconds, or
    the best fitting choice found so far, is skipped; so is one whose memory floor cannot fit, once a limit
    is known or with `drop_unfit` (a search that keeps only fitting plans: then UserError where none fits).
    """
    dp = config_dp(cluster, config)
    micro_batches = divisors(training.global_batch_size // dp) if choose_micro_batch else [config.micro_batch_size]
    if not choose_virtual_stages:
        virtual = [config.vp]
    else:
        virtual = virtual_choices if virtual_choices is not None else virtual_stage_choices(model, config)
    best: Optional[Plan] = None
    overflowed = False
    floors = None
    for index, mbs in enumerate(micro_batches):
        # Activations grow with the micro-batch while the micro-batches in flight
        # (min(p - s, m)) stay put as long as m >= p: once a size fits under no v,
        # no larger size with m >= p can fit either.
        if overflowed and training.global_batch_size // (mbs * dp) >= config.pp:
            continue
        limit = min(incumbent, best.prediction.iteration_time_s if best and best.prediction.fits else math.inf)
        if limit < math.inf and floors is None:
            floors = micro_batch_floors(model, cluster, training, config, tuple(micro_batches), tuple(virtual)) or ()
        if floors and floors[index] >= limit:
            continue  # every v of this size is slower than the limit: _best_virtual would change nothing
        best, fits_none = _best_virtual(model, cluster, training, config.but(micro_batch_size=mbs),
                                        virtual, limit, best, drop_unfit)
        if fits_none and training.global_batch_size // (mbs * dp) >= config.pp:
            overflowed = True
    if best is None:
        raise UserError("no micro-batch size / virtual-stage count makes these flags valid"
                        + (" or beats the best plan so far" if incumbent < math.inf else ""))
    return best


def _best_virtual(model, cluster, training, config: UniformConfig, virtual: list[int], limit: float,
                  best: Optional[Plan], drop_unfit: bool = False) -> tuple[Optional[Plan], bool]:
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
        verdict = screen(model, cluster, training, config, v, limit) if limit < math.inf or drop_unfit else None
        if verdict == SLOWER:
            scored_all = False
            continue
        if verdict == UNFIT:  # scored: it does not fit
            single_overflowed = v == 1
            continue
        try:
            plan = build_uniform_plan(model, cluster, training, config.but(vp=v))
        except UserError:
            continue
        prediction = estimate_plan(plan, model, cluster, training)
        fitted_any |= prediction.fits
        single_overflowed = v == 1 and not prediction.fits
        if best is None or _rank(prediction) < _rank(best.prediction):
            best = plan.with_prediction(prediction)
            if prediction.fits:
                limit = min(limit, prediction.iteration_time_s)
    return best, scored_all and not fitted_any


def _rank(prediction) -> tuple[bool, float]:
    return (not prediction.fits, prediction.iteration_time_s)
