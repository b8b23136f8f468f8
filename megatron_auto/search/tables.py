"""Dense cost tables for the per-layer DP: time[L,S], mem[L,S], transition[S,S].

Every entry comes from the same cost functions `estimate_plan` sums, so a plan
the DP scores at T seconds is estimated at T seconds too.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Optional

import numpy as np

from ..cost.comm_interference import interference_share
from ..cost.communication import pipeline_p2p_time, transition_time
from ..cost.embedding import embedding_cost
from ..cost.estimate import StageCost, _add_part, optimizer_step_time
from ..cost.layer_cost import layer_cost
from ..cost.memory import in_flight_micro_batches, tied_embedding_grad_bytes
from ..cost.models import comm_model, runtime_overhead
from ..cost.pipeline import exposed_dp_split
from ..plan import LayerStrategy
from ..specs.cluster import ClusterSpec
from ..specs.model import ModelSpec
from ..specs.training import TrainingSpec
from .experts import valid_for_layer


@dataclass(frozen=True)
class LayerTables:
    """Per-layer, per-strategy costs for one (pp, micro-batch) pair; S strategies."""

    strategies: tuple[LayerStrategy, ...]
    time: np.ndarray
    """[L, S] seconds per micro-batch, with the layer's gradient sync and optimizer step / m."""
    first_extra: np.ndarray
    """[L, S] extra seconds when the layer is its stage's first unit (its bucket cannot hide)."""
    state: np.ndarray
    """[L, S] bytes of weights, gradients and optimizer states."""
    activation: np.ndarray
    """[L, S] bytes of activations per micro-batch in flight."""
    transient: np.ndarray
    """[L, S] bytes alive only while the layer runs."""
    transition: np.ndarray
    """[S, S] seconds per micro-batch to move from layout i to layout j."""
    groups: np.ndarray
    """[S] index of each strategy's activation layout (tp, dp, sp): transitions depend on it alone."""


def layer_tables(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, strategies: list[LayerStrategy],
                 micro_batch_samples: int, num_micro_batches: int,
                 expert_pins: tuple[Optional[int], Optional[int]] = (None, None)) -> LayerTables:
    """The tables; a (layer, strategy) pair Megatron-Core would not run (expert degrees on a dense layer, a
    MoE layer without SP under TP, or off the user's --ep/--etp) costs infinite time, so the DP never picks it."""
    shape = (model.num_layers, len(strategies))
    time, first, state, act, transient = (np.zeros(shape) for _ in range(5))
    m = num_micro_batches
    distinct = {}
    for l, spec in enumerate(model.layers):
        if spec in distinct:  # like layers cost alike: copy the row
            source = distinct[spec]
            for table in (time, first, state, act, transient):
                table[l] = table[source]
            continue
        distinct[spec] = l
        for j, strategy in enumerate(strategies):
            if not _allowed(spec, strategy, expert_pins):
                time[l, j] = np.inf
                continue
            c = layer_cost(spec, strategy, micro_batch_samples // strategy.dp, model.seq_length, cluster, training)
            exposed = exposed_dp_split(c.dp_comm_per_iteration_s, c.dp_gather_per_iteration_s, c.backward_s,
                                       c.forward_s, comm_model(cluster).grad_overlap, interference_share(cluster))
            optimizer = optimizer_step_time(c.state_bytes, cluster, training.optimizer_impl)
            time[l, j] = c.micro_batch_s + (exposed + optimizer) / m
            first[l, j] = (c.dp_comm_per_iteration_s - exposed) / m
            # The run-long workspace rides with the transient: both are a max over the stage's layers.
            state[l, j], act[l, j] = c.state_bytes, c.activation_bytes
            transient[l, j] = c.transient_bytes + c.workspace_bytes
    layouts = sorted({(s.tp, s.dp, s.sp) for s in strategies})
    groups = np.array([layouts.index((s.tp, s.dp, s.sp)) for s in strategies])
    # transition_time depends on the layouts alone: price each layout pair once.
    representatives = [strategies[int(np.argmax(groups == g))] for g in range(len(layouts))]
    by_layout = np.array([[transition_time(a, b, model.hidden_size, model.seq_length, micro_batch_samples,
                                           cluster, training.activation_bytes) for b in representatives]
                          for a in representatives])
    transition = by_layout[np.ix_(groups, groups)]
    return drop_dominated(LayerTables(tuple(strategies), time, first, state, act, transient, transition, groups))


def drop_dominated(tables: LayerTables) -> LayerTables:
    """The tables without strategies that another of the same activation layout beats or ties on every layer
    it can run (time, first-unit time, states, activations, transient all no larger): swapping one for the
    other never costs time or memory and the transitions are the same, so the DP's optimum is unchanged.
    With MoE layers most (ep, etp) pairs fall here, and the DP runs over far fewer strategies."""
    metrics = np.stack([tables.time, tables.first_extra, tables.state, tables.activation, tables.transient])
    runnable = np.isfinite(tables.time)  # [L, S]
    keep = np.ones(len(tables.strategies), dtype=bool)
    for b in range(len(tables.strategies)):
        rivals = keep & (tables.groups == tables.groups[b])
        rivals[b] = False
        if not rivals.any():
            continue
        no_worse = (metrics[:, :, rivals] <= metrics[:, :, b:b + 1]).all(axis=0) | ~runnable[:, b:b + 1]  # [L, R]
        better = (metrics[:, :, rivals] < metrics[:, :, b:b + 1]).any(axis=(0, 1))
        earlier = np.nonzero(rivals)[0] < b  # exact ties keep the first
        if (no_worse.all(axis=0) & (better | earlier)).any():
            keep[b] = False
    if keep.all():
        return tables
    index = np.nonzero(keep)[0]
    layouts, groups = np.unique(tables.groups[index], return_inverse=True)
    return LayerTables(tuple(tables.strategies[i] for i in index), tables.time[:, index],
                       tables.first_extra[:, index], tables.state[:, index], tables.activation[:, index],
                       tables.transient[:, index], tables.transition[np.ix_(index, index)], groups)


def _allowed(layer, strategy: LayerStrategy, expert_pins: tuple[Optional[int], Optional[int]]) -> bool:
    """Megatron-Core runs `layer` under `strategy`, and a MoE layer takes the pinned --ep/--etp and
    ZeRO 0 or 1: the hybrid runtime shards experts over their expert-DP group with Megatron's DDP and
    distributed optimizer, not FSDP2 (runtime/hybrid/hybrid_runtime.check_supported)."""
    if not valid_for_layer(layer, strategy) or (layer.moe is not None and strategy.zero >= 2):
        return False
    ep, etp = expert_pins
    return layer.moe is None or (ep in (None, strategy.ep) and etp in (None, strategy.expert_tp))


@dataclass(frozen=True)
class StageFixed:
    """What a stage pays whatever its layers' strategies: embedding/head, p2p, overhead."""

    time: float
    """Seconds per micro-batch (with the parts' gradient sync, optimizer step and runtime overhead / m)."""
    memory: float
    """Bytes."""
    in_flight: float
    """Micro-batches whose activations the stage holds at its peak."""
    first_layer_is_first_unit: bool
    """False on stage 0, where the embedding's bucket is the one that cannot hide."""
    entry_transition: np.ndarray
    """[S] seconds per micro-batch to re-lay the stage's input (embedding or boundary layout) for strategy j."""
    exit_transition: np.ndarray
    """[S] seconds per micro-batch to re-lay the output of a last layer in strategy j (to the head or boundary)."""
    loss_memory: float = 0.0
    """Bytes the loss adds at its moment (last stage: logits); the peak is max(backward, loss), cost.peak_memory."""
    waiting_memory: float = 0.0
    """Bytes added at the backward moment beside the layers' transient (a tied weight gradient)."""

    def extra_units(self, ceiling_units: int, unit: float) -> int:
        """Memory units above the resident ones at the stage's peak moment, for a transient ceiling."""
        backward = ceiling_units + math.ceil(self.waiting_memory / unit)
        return max(backward, math.ceil(self.loss_memory / unit))

    def least_extra(self) -> float:
        """Bytes above the resident ones at the peak whatever the layers' transients."""
        return max(self.waiting_memory, self.loss_memory)


def stage_fixed(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, embedding: LayerStrategy,
                stage: int, pp: int, micro_batch_samples: int, num_micro_batches: int,
                strategies: tuple[LayerStrategy, ...], boundary: LayerStrategy,
                job: Optional[ClusterSpec] = None) -> StageFixed:
    """Mirror of estimate.stage_costs for the non-layer parts of stage `stage` (v = 1, 1F1B). `job`: the whole
    cluster where `cluster` is this stage's node group of a mixed one (ClusterSpec.stage_clusters), whose p2p runs at
    the pace of the slowest group's links."""
    job = job or cluster
    parts = embedding_cost(model, embedding, micro_batch_samples // embedding.dp, cluster, training, pp)
    acc = StageCost(grad_overlap=comm_model(cluster).grad_overlap, interference=interference_share(cluster))
    if stage == 0:
        _add_part(acc, parts.embedding)
    if stage < pp - 1:
        acc.micro_batch_s += max(pipeline_p2p_time(model.hidden_size, model.seq_length, micro_batch_samples,
                                                   job.world_size // pp, pp, view, training.activation_bytes)
                                 for view in dict.fromkeys(job.stage_clusters(pp)))
    head = StageCost(units=1, grad_overlap=comm_model(cluster).grad_overlap, interference=interference_share(cluster))
    if stage == pp - 1:
        _add_part(head, parts.head)
    in_flight = in_flight_micro_batches(stage, pp, num_micro_batches, 1, "1f1b")
    exposed = acc.exposed_dp_s + head.exposed_dp_s
    optimizer = optimizer_step_time(acc.state_bytes + head.state_bytes, cluster, training.optimizer_impl)
    memory = (acc.state_bytes + head.state_bytes + cluster.framework_overhead_bytes
              + (in_flight * parts.embedding.activation_bytes if stage == 0 else 0.0))
    tied = stage == pp - 1 and pp == 1 and not model.untie_embeddings_and_output_weights
    entry = embedding if stage == 0 else boundary
    exit_ = embedding if stage == pp - 1 else boundary

    @lru_cache(maxsize=None)   # transition_time depends on the layouts alone
    def relayout_layouts(before: tuple, after: tuple) -> float:
        return transition_time(_of(before), _of(after), model.hidden_size, model.seq_length, micro_batch_samples,
                               cluster, training.activation_bytes)

    def relayout(before: LayerStrategy, after: LayerStrategy) -> float:
        return relayout_layouts((before.tp, before.dp, before.sp), (after.tp, after.dp, after.sp))

    per_step, per_chunk = runtime_overhead(cluster)
    return StageFixed(time=acc.micro_batch_s + head.micro_batch_s + per_chunk
                      + (exposed + optimizer + per_step) / num_micro_batches,
                      memory=memory, in_flight=in_flight, first_layer_is_first_unit=stage > 0,
                      loss_memory=parts.head.activation_bytes + parts.head.loss_bytes if stage == pp - 1 else 0.0,
                      waiting_memory=tied_embedding_grad_bytes(model, embedding, training.activation_bytes)
                      if tied else 0.0,
                      entry_transition=np.array([relayout(entry, s) for s in strategies]),
                      exit_transition=np.array([relayout(s, exit_) for s in strategies]))


def _of(layout: tuple) -> LayerStrategy:
    tp, dp, sp = layout
    return LayerStrategy(tp=tp, dp=dp, sp=sp)
