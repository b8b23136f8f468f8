"""The per-layer strategy space of one pipeline stage, pruned by a decision tree.

The tree (after Galvatron, Miao et al. VLDB 2023, Sec. 4.2) walks the raw
choices (tp, zero, sp, recompute) of a stage of n GPUs and applies its rules in
order; `prune_strategies` records how many candidates each rule removed.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..plan import RECOMPUTE_KINDS, LayerStrategy
from ..specs.cluster import ClusterSpec
from ..specs.model import ModelSpec
from .constraints import SearchConstraints
from .experts import expert_degree_choices
from .integers import divisors


@dataclass(frozen=True)
class Rule:
    """One decision-tree rule: a name, why it is safe, and the test that drops a candidate."""

    name: str
    reason: str
    drops: Callable[[LayerStrategy, "StageContext"], bool]


@dataclass(frozen=True)
class StageContext:
    gpus: int
    cluster: ClusterSpec
    model: ModelSpec
    constraints: SearchConstraints
    micro_batch_samples: int
    """Samples in one micro-batch across the whole stage (B / m)."""


def _heads_divisible(s: LayerStrategy, ctx: StageContext) -> bool:
    return any(layer.tensor_parallel_error(s.tp) is not None for layer in ctx.model.distinct_layers)


RULES = (
    Rule("tp-divides-heads", "Megatron splits whole attention heads, query groups and MLA latents over TP",
         _heads_divisible),
    Rule("batch-splits-over-dp", "each DP rank needs a whole number of samples per micro-batch",
         lambda s, ctx: ctx.micro_batch_samples % s.dp != 0),
    Rule("tp-within-node", "TP all-reduces every layer; across nodes it runs 12x slower (SC21 Sec. 5.4), "
         "and a TP degree that does not divide the node straddles nodes",
         lambda s, ctx: ctx.cluster.common_node_gpus % s.tp != 0),
    Rule("sp-with-tp", "with TP, SP moves the same bytes and stores and computes less (Korthikanti Sec. 4.2.2); "
         "only under the analytic ring model, where the two price alike",
         lambda s, ctx: s.tp > 1 and not s.sp and _ring_priced(ctx)),
    Rule("no-zero2", "Megatron-Core's DDP keeps a full gradient buffer; the runtime has no ZeRO-2 layout",
         lambda s, ctx: s.zero == 2),
    Rule("distributed-optimizer-over-dp", "with dp > 1, ZeRO-1's reduce-scatter + all-gather move what the "
         "all-reduce moves and the optimizer states shrink d-fold: plain DP is dominated",
         lambda s, ctx: s.dp > 1 and s.zero == 0 and ctx.constraints.distributed_optimizer is not False
         and _ring_priced(ctx)),
    Rule("zero-needs-dp", "with dp = 1 there is nothing to shard: ZeRO 1 and 3 equal plain DP",
         lambda s, ctx: s.dp == 1 and s.zero > 0),
    Rule("constraints", "the user's explicit flags pin these choices", lambda s, ctx: _violates(s, ctx.constraints)),
)


def _ring_priced(ctx: StageContext) -> bool:
    """True when collectives follow the analytic ring formulas, under which an
    all-reduce costs exactly a reduce-scatter plus an all-gather. Measured curves
    (a cluster profile) can break that, and then both variants stay in the space."""
    measured = ctx.cluster.measured
    return measured is None or measured.cluster is None


def _violates(s: LayerStrategy, c: SearchConstraints) -> bool:
    return ((c.tp is not None and s.tp != c.tp)
            or (c.dp is not None and s.dp != c.dp)
            or (c.sequence_parallel is not None and s.tp > 1 and s.sp != c.sequence_parallel)
            or (c.distributed_optimizer is not None and s.dp > 1 and (s.zero == 1) != c.distributed_optimizer)
            or (c.recompute is not None and s.recompute != c.recompute))


def raw_strategies(gpus: int, model: ModelSpec | None = None, gpus_per_node: int | None = None,
                   constraints: SearchConstraints = SearchConstraints()) -> list[LayerStrategy]:
    """Every (tp, zero, sp, recompute) for a stage of `gpus` GPUs, before pruning; for a model with MoE
    layers also each with every (ep, etp) its MoE layers take (search/experts.py), which the cost tables
    allow on MoE layers only (tables.layer_tables)."""
    out = []
    for tp in divisors(gpus):
        experts = [(1, None)]
        if model is not None:
            pinned = (constraints.ep, constraints.etp)
            experts += [pair for pair in expert_degree_choices(model, tp, gpus, gpus_per_node, *pinned)
                        if pair != (1, None)]
        for zero in (0, 1, 2, 3):
            for sp in ((False, True) if tp > 1 else (False,)):
                for recompute in RECOMPUTE_KINDS:
                    out += [LayerStrategy(tp=tp, dp=gpus // tp, zero=zero, sp=sp, recompute=recompute, ep=ep, etp=etp)
                            for ep, etp in experts]
    return out


def prune_strategies(ctx: StageContext) -> tuple[list[LayerStrategy], list[tuple[str, int]]]:
    """The surviving candidates and, per rule, how many it removed."""
    candidates = raw_strategies(ctx.gpus, ctx.model, ctx.cluster.common_node_gpus, ctx.constraints)
    removed = []
    for rule in RULES:
        kept = [s for s in candidates if not rule.drops(s, ctx)]
        removed.append((rule.name, len(candidates) - len(kept)))
        candidates = kept
    return candidates, removed
