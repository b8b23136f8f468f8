"""Rank groups of a hybrid plan: a pure function of the Plan (no torch, no process started).

Inside a pipeline stage of n GPUs (global ranks `stage * n ... stage * n + n - 1`,
Megatron's order with PP outermost) a layer with layout (tp, dp) puts local rank
r at tensor rank `r % tp` and data rank `r // tp`: TP ranks are adjacent, DP ranks
`tp` apart, exactly Megatron-Core's RankGenerator order (tp-cp-dp-pp).

Between two layouts of one stage whose DP degrees differ by k the activations
move inside *regroup* groups: the k ranks that share the coarser layout's data
rank and the finer layout's tensor rank (`stride = min(tp)`, k of them). Those
hold the k sub-batches of one coarse sample chunk, so a batch all-gather over
them rebuilds it (see relayout.py).

A MoE layer's experts take Megatron-Core's expert order inside the stage
(tp-ep-dp: parallel_state's expert RankGenerator): local rank r is at expert
tensor rank `r % etp`, expert rank `(r // etp) % ep` and expert data rank
`r // (etp * ep)`. Its expert-TP, TP x EP and expert-DP groups are thus the TP
and DP groups of a (tp = etp) or (tp = etp * ep) layout; the EP groups are
`ep` ranks `etp` apart.

Every group is listed once per rank set, in one deterministic order, so every
rank calls `new_group` for the same sets in the same order, and a rank set that
two roles share (a TP4 group is also the DP4 group of tp1 on 4 GPUs) is one
communicator.
"""
from __future__ import annotations

from dataclasses import dataclass

from ...plan import LayerStrategy, Plan, boundary_layout_for

Ranks = tuple[int, ...]


@dataclass(frozen=True)
class StageLayout:
    """The (tp, dp) of one layout on one pipeline stage."""

    stage: int
    gpus: int
    tp: int

    @property
    def dp(self) -> int:
        return self.gpus // self.tp

    def base(self) -> int:
        return self.stage * self.gpus


def tp_groups(layout: StageLayout) -> list[Ranks]:
    """Tensor-parallel groups: `tp` adjacent ranks, one group per data rank."""
    base, tp = layout.base(), layout.tp
    return [tuple(base + d * tp + t for t in range(tp)) for d in range(layout.dp)]


def dp_groups(layout: StageLayout) -> list[Ranks]:
    """Data-parallel groups: `dp` ranks `tp` apart, one group per tensor rank."""
    base, tp = layout.base(), layout.tp
    return [tuple(base + d * tp + t for d in range(layout.dp)) for t in range(tp)]


def regroup_groups(stage: int, gpus: int, tp_a: int, tp_b: int) -> list[Ranks]:
    """Groups that re-split the batch between layouts with TP degrees tp_a and tp_b.

    With tp_big = k * tp_small: for each coarse data rank and each fine tensor
    rank, the k ranks `base + d * tp_big + c * tp_small + t` (c < k).
    """
    big, small = max(tp_a, tp_b), min(tp_a, tp_b)
    if big == small:
        return []
    if big % small:
        raise ValueError(f"TP degrees {tp_a} and {tp_b} do not nest (one must divide the other)")
    k, base = big // small, stage * gpus
    return [tuple(base + d * big + c * small + t for c in range(k))
            for d in range(gpus // big) for t in range(small)]


def regroup_index(local_rank: int, tp_a: int, tp_b: int) -> int:
    """Which of the k sub-batches of its coarse chunk a rank holds in the finer-DP layout."""
    big, small = max(tp_a, tp_b), min(tp_a, tp_b)
    return (local_rank % big) // small


def ep_groups(stage: int, gpus: int, ep: int, etp: int) -> list[Ranks]:
    """Expert-parallel groups: `ep` ranks `etp` apart, one per (expert data rank, expert tensor rank)."""
    base, block = stage * gpus, ep * etp
    return [tuple(base + d * block + e * etp + t for e in range(ep))
            for d in range(gpus // block) for t in range(etp)]


def expert_groups(stage: int, gpus: int, ep: int, etp: int) -> dict[str, list[Ranks]]:
    """The expert groups of a MoE layout (ep, expert tp) on one stage, by role."""
    return {"expt_tp": tp_groups(StageLayout(stage, gpus, etp)),
            "tp_ep": tp_groups(StageLayout(stage, gpus, etp * ep)),
            "ep": ep_groups(stage, gpus, ep, etp),
            "expt_dp": dp_groups(StageLayout(stage, gpus, etp * ep))}


def has_experts(strategy: LayerStrategy) -> bool:
    """Whether the strategy lays experts out other than its dense layer (ep > 1 or its own expert TP)."""
    return strategy.ep > 1 or strategy.expert_tp != strategy.tp


def stage_layouts(plan: Plan) -> list[tuple[int, LayerStrategy]]:
    """(stage, strategy) of every layer and of the embedding on the stages that hold it."""
    pairs = []
    for index, chunk in enumerate(plan.chunks):
        stage = index % plan.pipeline_parallel
        pairs.extend((stage, s) for s in chunk.layers)
    for stage in {0, plan.pipeline_parallel - 1}:
        pairs.append((stage, plan.embedding))
    return pairs


def boundary_strategy(plan: Plan, seq_length: int) -> LayerStrategy:
    """The layout activations cross stage boundaries in (one definition, shared with the
    cost model): see megatron_auto.plan.boundary_layout_for."""
    return boundary_layout_for(plan.gpus_per_stage, plan.global_batch_size // plan.num_micro_batches, seq_length)


def transition_pairs(plan: Plan, seq_length: int) -> list[tuple[int, LayerStrategy, LayerStrategy]]:
    """(stage, before, after) of every re-layout the runtime performs, in model order."""
    boundary = boundary_strategy(plan, seq_length) if plan.pipeline_parallel > 1 else None
    pairs = []
    for index, chunk in enumerate(plan.chunks):
        stage = index % plan.pipeline_parallel
        before = plan.embedding if index == 0 else boundary
        sequence = list(chunk.layers) + [plan.embedding if index == len(plan.chunks) - 1 else boundary]
        for after in sequence:
            pairs.append((stage, before, after))
            before = after
    return pairs


def plan_groups(plan: Plan, seq_length: int) -> dict[str, list[Ranks]]:
    """Every rank group the hybrid runtime creates, by role (a rank set may appear in several roles)."""
    gpus = plan.gpus_per_stage
    tps = sorted({(stage, s.tp) for stage, s in stage_layouts(plan)})
    if plan.pipeline_parallel > 1:
        boundary = boundary_strategy(plan, seq_length)
        tps = sorted(set(tps) | {(st, boundary.tp) for st in range(plan.pipeline_parallel)})
    roles: dict[str, list[Ranks]] = {"tp": [], "dp": [], "regroup": []}
    for stage, tp in tps:
        layout = StageLayout(stage, gpus, tp)
        roles["tp"].extend(tp_groups(layout))
        roles["dp"].extend(dp_groups(layout))
    pairs = sorted({(st, min(a.tp, b.tp), max(a.tp, b.tp)) for st, a, b in transition_pairs(plan, seq_length)
                    if a.tp != b.tp})
    for stage, small, big in pairs:
        roles["regroup"].extend(regroup_groups(stage, gpus, small, big))
    expert_layouts = sorted({(stage, s.ep, s.expert_tp) for stage, s in stage_layouts(plan) if has_experts(s)})
    for stage, ep, etp in expert_layouts:
        for role, rank_sets in expert_groups(stage, gpus, ep, etp).items():
            roles.setdefault(role, []).extend(rank_sets)
    return roles


def unique_groups(plan: Plan, seq_length: int) -> list[Ranks]:
    """The distinct rank sets of size > 1, in creation order (sorted): one communicator each."""
    sets = {g for groups in plan_groups(plan, seq_length).values() for g in groups if len(g) > 1}
    return sorted(sets, key=lambda g: (len(g), g))
