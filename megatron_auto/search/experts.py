"""Expert-parallel degrees: which (ep, etp) Megatron-Core accepts for a model's MoE layers.

Megatron-Core partitions a stage's tp*cp*dp ranks into expert groups, etp * ep * expert_dp = tp * cp * dp
(parallel_state.initialize_model_parallel's expert RankGenerator); ep must divide the experts
(--num-experts % --expert-model-parallel-size, TransformerConfig) and MoE layers with biases need
etp 1 (TransformerConfig). Like Megatron's flags, one (ep, etp) serves every MoE layer of a plan
in the megatron space; the hybrid space picks one per layer from the same choices.
"""
from __future__ import annotations

import math
from dataclasses import replace
from functools import lru_cache, reduce
from typing import Optional

from ..errors import UserError
from ..plan import LayerStrategy, check_expert_strategy
from ..specs.model import LayerSpec, ModelSpec
from .integers import divisors


def moe_layers(model: ModelSpec) -> tuple[LayerSpec, ...]:
    """The distinct MoE layer shapes of the model (none for a dense model)."""
    return tuple(layer for layer in model.distinct_layers if layer.moe is not None)


def expert_degree_choices(model: ModelSpec, tp: int, gpus: int, gpus_per_node: Optional[int] = None,
                          ep: Optional[int] = None, etp: Optional[int] = None) -> list[tuple[int, Optional[int]]]:
    """(ep, etp) pairs for the MoE layers on a stage of `gpus` ranks at TP `tp`; etp equal to tp is
    written None (Megatron's default). [(1, None)] for a dense model. `gpus_per_node`, when given, keeps
    the expert-TP group inside a node (its collectives run every MoE layer, like TP's: the
    tp-within-node rule); `ep`/`etp` pin the user's flags."""
    layers = moe_layers(model)
    if not layers:
        return [(1, None)]
    experts = reduce(math.gcd, (layer.moe.num_experts for layer in layers))
    biased = any(layer.add_bias_linear for layer in layers)
    choices = []
    for expert_tp in divisors(gpus):
        if biased and expert_tp != 1 or gpus_per_node is not None and gpus_per_node % expert_tp:
            continue
        for degree in divisors(gpus // expert_tp):
            if experts % degree == 0:
                choices.append((degree, None if expert_tp == tp else expert_tp))
    return [(e, t) for e, t in choices if ep in (None, e) and etp in (None, t if t is not None else tp)]


def with_experts(layer: LayerSpec, strategy: LayerStrategy, ep: int, etp: Optional[int]) -> LayerStrategy:
    """The strategy a layer of a megatron-space plan runs: the experts' degrees on a MoE layer, none on a
    dense one."""
    if layer.moe is None or (ep, etp) == (strategy.ep, strategy.etp):
        return strategy
    return _expert_variant(strategy, ep, etp)


@lru_cache(maxsize=4096)
def _expert_variant(strategy: LayerStrategy, ep: int, etp: Optional[int]) -> LayerStrategy:
    """One object per variant, so that its hash (the cost model's cache key) is computed once."""
    return replace(strategy, ep=ep, etp=etp)


def valid_for_layer(layer: LayerSpec, strategy: LayerStrategy) -> bool:
    """Whether Megatron-Core runs `layer` under `strategy` (plan.check_expert_strategy)."""
    try:
        check_expert_strategy(layer, strategy)
    except ValueError:
        return False
    return True


def check_expert_constraints(model: ModelSpec, world_size: int, ep: Optional[int], etp: Optional[int]) -> None:
    """--ep/--etp that no layout could take: one line saying why, before any search."""
    if ep is None and etp is None:
        return
    layers = moe_layers(model)
    if not layers:
        raise UserError(f"model '{model.name}' has no MoE layers: expert parallelism does not apply")
    experts = reduce(math.gcd, (layer.moe.num_experts for layer in layers))
    if ep is not None and experts % ep:
        raise UserError(f"--ep {ep} does not divide the {experts} experts")
    if (ep or 1) * (etp or 1) > world_size or world_size % ((ep or 1) * (etp or 1)):
        raise UserError(f"--ep {ep or 1} x --etp {etp or 1} does not divide the {world_size} GPUs")
