"""The least memory any plan needs, for the error that says a budget is impossible.

Memory falls with full recomputation, ZeRO-3 (hybrid space) or ZeRO-1
(megatron space), SP, one sample per micro-batch and no interleaving, and for
MoE layers with the most expert sharding (ep x etp), so the minimum over
(tp, pp, pipeline split) of those layouts is the least any plan of the space needs.
"""
from __future__ import annotations

import math

from ..cost.estimate import estimate_plan
from ..errors import UserError
from ..plan import Chunk, LayerStrategy, Plan
from ..specs.cluster import ClusterSpec
from ..specs.model import ModelSpec
from ..specs.training import TrainingSpec
from .constraints import SearchConstraints
from .experts import expert_degree_choices, with_experts
from .megatron_space import SpaceStats, parallel_degrees
from .uniform import megatron_uneven_splits


def least_memory_gib(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, space: str,
                     constraints: SearchConstraints) -> float:
    """Smallest predicted device memory per GPU (at the allocated peak, cost.peak_memory) over the space's leanest layouts (inf if none is valid)."""
    least = math.inf
    for tp, pp in parallel_degrees(model, cluster, training, constraints, SpaceStats()):
        dp = cluster.world_size // (tp * pp)
        zero = 3 if space == "hybrid" and dp > 1 else (1 if dp > 1 else 0)
        lean = LayerStrategy(tp=tp, dp=dp, zero=zero, sp=tp > 1, recompute="full")
        embedding = LayerStrategy(tp=tp, dp=dp, zero=min(zero, 1), sp=tp > 1)
        experts = expert_degree_choices(model, tp, tp * dp, None, constraints.ep,
                                        constraints.etp)
        if not experts:
            continue
        ep, etp = max(experts, key=lambda pair: pair[0] * (tp if pair[1] is None else pair[1]))
        layers = tuple(with_experts(layer, lean, ep, etp) for layer in model.layers)
        for split in megatron_uneven_splits(model.num_layers, pp):
            starts = [sum(split[:i]) for i in range(len(split))]
            try:
                plan = Plan(space="hybrid", world_size=cluster.world_size, pipeline_parallel=pp,
                            global_batch_size=training.global_batch_size,
                            num_micro_batches=training.global_batch_size // dp,
                            chunks=tuple(Chunk(layers[start:start + n]) for start, n in zip(starts, split)),
                            embedding=embedding, model=model)
                least = min(least, estimate_plan(plan, model, cluster, training).device_memory_gib)
            except (ValueError, UserError):
                continue
    return least
