"""All cost terms of one layer under one strategy, gathered in one record.

The search builds its time[L,S] and mem[L,S] tables from `layer_cost`, and
`estimate_plan` sums the same records, so both always agree. A MoE layer is its
dense part (attention, norms, router weights and shared expert under the layer's
TP/DP/ZeRO) plus its routed experts (cost/moe.py).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

from ..plan import LayerStrategy
from ..specs.cluster import ClusterSpec
from ..specs.model import LayerSpec
from ..specs.training import DEFAULT_RECOMPUTE_MODULES, TrainingSpec, interned
from .comm_interference import dispatch_interference_share, exposed_beside
from .communication import dp_cost_fields, tp_comm_time, zero3_comm_time
from .context_parallel import (attention_core_extra_times, cp_exchange_time, cp_qkv_kept_width,
                               gathered_kv_transient_bytes, gradient_strategy, local_sequence)
from .compute import ComputeTimes, module_forward_shares, recompute_time
from .activation_offload import RESIDENT_LAYERS, offload_exposed_seconds, offloaded_bytes
from .cuda_graphs import graph_static_input_bytes, graphed_cluster
from .tp_overlap import exposed_tp_seconds, linear_gemm_seconds, overlap_gemm_seconds, tp_overlap_applies
from .layer_kernels import fused_accumulation_saving
from .fp8 import fp8_layer_delta, fp8_saved_input_savings, fp8_weight_copy_bytes
from .models import compute_model
from .mla_comm import mla_tp_comm_time
from .moe import ExpertCost, expert_activation_bytes, expert_cost, experts_recomputed
from .ep_overlap import hidden_ep_seconds
from .shared_expert import hidden_dispatch_seconds
from .memory import (attention_backward_extra_bytes, attention_workspace_bytes, layer_activation_bytes,
                     model_state_bytes, optimizer_temporary_bytes, qkv_kept_width, zero3_gathered_bytes)


@dataclass(frozen=True)
class LayerCost:
    """One layer on one GPU of its stage. Times per micro-batch unless named per iteration."""

    forward_s: float
    backward_s: float
    recompute_s: float
    tp_comm_s: float
    zero3_exposed_s: float
    """ZeRO-3 gathers and scatters left over after overlapping with this layer's compute."""
    dp_comm_per_iteration_s: float
    """Gradient (and ZeRO-1/2 weight) traffic, once per iteration, before overlap."""
    state_bytes: float
    """Weights, gradients and optimizer states held for the whole run."""
    activation_bytes: float
    """Activations kept per micro-batch in flight."""
    transient_bytes: float
    """Extra bytes alive only while this layer runs (ZeRO-3 gathers, recomputed activations,
    the attention's backward working set)."""
    workspace_bytes: float = 0.0
    """Buffers the layer's kernels keep for the whole run, shared by all layers of a process (max, not sum)."""
    optimizer_temporary_bytes: float = 0.0
    """Temporaries the optimizer step allocates for this layer's shard (cost.memory.optimizer_temporary_bytes)."""
    ep_comm_s: float = 0.0
    """A MoE layer's token dispatch and combine and expert-TP collectives (cost/moe.py)."""
    cp_comm_s: float = 0.0
    """Context parallelism's K/V all-gathers and gradient reduce-scatter (cost/context_parallel.py)."""
    ep_hidden_s: float = 0.0
    """Dispatch seconds per micro-batch that --overlap-moe-expert-parallel-comm's merged steps hide (already
    off ep_comm_s); the schedule's unmerged warm-up steps show them again (cost/estimate.py)."""
    dp_gather_per_iteration_s: float = 0.0
    """Of dp_comm_per_iteration_s, the ZeRO-1/2 weight all-gather, which runs beside the forward
    (communication.dp_comm_times)."""

    @property
    def micro_batch_s(self) -> float:
        """Critical-path seconds of one micro-batch through this layer."""
        return (self.forward_s + self.backward_s + self.recompute_s + self.tp_comm_s + self.zero3_exposed_s
                + self.ep_comm_s + self.cp_comm_s)


def layer_cost(layer: LayerSpec, strategy: LayerStrategy, samples: int, seq: int,
               cluster: ClusterSpec, training: TrainingSpec) -> LayerCost:
    """Cost of `layer` with `samples` sequences per micro-batch on each of its DP ranks."""
    if strategy.recompute != "selective" and training.recompute_modules != DEFAULT_RECOMPUTE_MODULES:
        # What selective recomputation re-runs shapes nothing else: one cache entry serves every set.
        training = _without_recompute_modules(training)
    return _layer_cost(layer, strategy, samples, seq, cluster, training)


def without_recompute_modules(training: TrainingSpec) -> TrainingSpec:
    """`training` with the default --recompute-modules, one object per distinct result: caches keyed on it then
    match by identity, not field by field, across the searches of every set (search/module_sets.py)."""
    if training.recompute_modules != DEFAULT_RECOMPUTE_MODULES:
        return _without_recompute_modules(training)
    return interned(training)


@lru_cache(maxsize=256)
def _without_recompute_modules(training: TrainingSpec) -> TrainingSpec:
    return interned(replace(training, recompute_modules=DEFAULT_RECOMPUTE_MODULES))


@lru_cache(maxsize=65536)
def _layer_cost(layer: LayerSpec, strategy: LayerStrategy, samples: int, seq: int,
                cluster: ClusterSpec, training: TrainingSpec) -> LayerCost:
    if strategy.cp > 1:
        cost = context_parallel_layer_cost(layer, strategy, samples, seq, cluster, training)
    else:
        cost = _shared_dense_part(layer, dense_view(strategy), samples, seq, cluster, training)
        if layer.moe is not None:
            cost = _with_priced_experts(cost, layer, strategy, samples, seq, cluster, training)
    if training.cuda_graph_impl == "none" and not training.offload_modules:
        return cost
    return _with_host_knobs(cost, layer, strategy, samples, seq, cluster, training)


def _host_knob_bytes(layer: LayerSpec, strategy: LayerStrategy, samples: int, seq: int,
                     training: TrainingSpec) -> tuple[float, float]:
    """(bytes the CUDA graphs' static inputs keep, bytes offloaded to the host) per micro-batch in flight, at the
    local sequence under CP."""
    if strategy.cp > 1:
        strategy, seq = gradient_strategy(strategy), local_sequence(seq, strategy)
    return (graph_static_input_bytes(layer, strategy, seq, samples, training),
            offloaded_bytes(layer, strategy, seq, samples, training))


def _with_host_knobs(cost: LayerCost, layer: LayerSpec, strategy: LayerStrategy, samples: int, seq: int,
                     cluster: ClusterSpec, training: TrainingSpec) -> LayerCost:
    """`cost` with the CUDA graphs' static inputs kept (cost/cuda_graphs.py) and the offloaded activations on the
    host, two layers' worth on the device while a layer runs, and the copies that outlast the passes
    (cost/activation_offload.py)."""
    static, offloaded = _host_knob_bytes(layer, strategy, samples, seq, training)
    forward, backward = offload_exposed_seconds(offloaded, cost.forward_s, cost.backward_s + cost.recompute_s, cluster)
    return replace(cost, forward_s=cost.forward_s + forward, backward_s=cost.backward_s + backward,
                   activation_bytes=cost.activation_bytes + static - offloaded,
                   transient_bytes=cost.transient_bytes + RESIDENT_LAYERS * offloaded)


@lru_cache(maxsize=4096)
def dense_view(strategy: LayerStrategy) -> LayerStrategy:
    """`strategy` without its expert degrees, which dense_part_cost does not read: one cache entry of the dense
    part serves every (ep, etp) a search weighs for a MoE layer."""
    return strategy if strategy.ep == 1 and strategy.etp is None else replace(strategy, ep=1, etp=None)


@lru_cache(maxsize=65536)
def _shared_dense_part(layer: LayerSpec, strategy: LayerStrategy, samples: int, seq: int, cluster: ClusterSpec,
                       training: TrainingSpec) -> LayerCost:
    return dense_part_cost(layer, strategy, samples, seq, cluster, training)


def with_experts(dense: LayerCost, experts: ExpertCost, cluster: ClusterSpec, hidden_dispatch_s: float = 0.0,
                 dispatch_share: float = 0.0, ep_hidden_s: float = 0.0) -> LayerCost:
    """A MoE layer: its dense part plus its routed experts, each term added (the expert ZeRO-3 traffic
    hidden behind the layer's compute as the dense part's is), less the dispatch time the shared expert's
    stream hides (`hidden_dispatch_s`, cost/shared_expert.py) plus `dispatch_share` of it, what the hidden traffic's
    kernels take from the compute beside them (cost/comm_interference.py); `ep_hidden_s`: LayerCost.ep_hidden_s."""
    compute = experts.forward_s + experts.backward_s + experts.recompute_s
    return replace(
        dense,
        forward_s=dense.forward_s + experts.forward_s,
        backward_s=dense.backward_s + experts.backward_s,
        recompute_s=dense.recompute_s + experts.recompute_s,
        zero3_exposed_s=dense.zero3_exposed_s + exposed_beside(experts.zero3_s, compute, cluster),
        dp_comm_per_iteration_s=dense.dp_comm_per_iteration_s + experts.dp_comm_per_iteration_s,
        dp_gather_per_iteration_s=dense.dp_gather_per_iteration_s + experts.dp_gather_per_iteration_s,
        state_bytes=dense.state_bytes + experts.state_bytes,
        activation_bytes=dense.activation_bytes + experts.activation_bytes,
        transient_bytes=dense.transient_bytes + experts.rematerialised_bytes,
        optimizer_temporary_bytes=dense.optimizer_temporary_bytes + experts.optimizer_temporary_bytes,
        ep_comm_s=experts.comm_s - hidden_dispatch_s * (1.0 - dispatch_share),
        ep_hidden_s=ep_hidden_s,
    )


def context_parallel_layer_cost(layer: LayerSpec, strategy: LayerStrategy, samples: int, seq: int,
                               cluster: ClusterSpec, training: TrainingSpec) -> LayerCost:
    """A layer under context parallelism (cost/context_parallel.py): its dense part priced at the local sequence
    with CP folded into DP, plus the attention core's extra work, the K/V exchange and the whole sequence's K
    and V that the attention keeps (rebuilt instead where the core is recomputed, whose checkpoint keeps local
    ones). A MoE layer's router and experts see only the rank's own tokens, so they are priced at the local
    sequence too, with CP folded into expert DP: Megatron-Core forms the expert groups (etp-ep-edp) over the
    stage's tp x cp x dp ranks (parallel_state.py, the expert RankGenerator). Transformer Engine's spec
    (TrainingSpec.fused_norms) runs CP as --cp-comm-type says (cost/context_parallel.py, cp_exchange_time): its
    ring (AttnFuncWithCPAndKVP2P) keeps the local Q, K and V and each step's softmax statistics and passes the K/V
    chunks around again in the backward, its all-gather holds the whole sequence's K and V only while the core
    runs, its all-to-all keeps Q, K, V and the output as 1/cp of the heads over the whole sequence, the bytes of
    the local ones: none keeps a whole sequence's K and V."""
    if layer.mla is not None:
        raise ValueError("context parallelism with multi-latent attention layers is not priced yet")
    if training.attention_backend != "flash":
        raise ValueError("context parallelism runs on the flash (SDPA) core attention, not "
                         f"{training.attention_backend!r}")
    local = local_sequence(seq, strategy)
    base = _shared_dense_part(layer, dense_view(gradient_strategy(strategy)), samples, local, cluster, training)
    core_recomputed = _core_recomputed(layer, strategy, training)
    forward, backward = attention_core_extra_times(layer, seq, samples, strategy, cluster, training)
    whole_kv = _whole_sequence_kv_bytes(layer, strategy, samples, local, training)
    dense = replace(
        base,
        forward_s=base.forward_s + forward, backward_s=base.backward_s + backward,
        recompute_s=base.recompute_s + (forward if core_recomputed else 0.0),
        cp_comm_s=cp_exchange_time(layer, seq, samples, strategy, cluster, training, core_recomputed),
        activation_bytes=base.activation_bytes + (0.0 if core_recomputed else whole_kv),
        transient_bytes=(base.transient_bytes + (whole_kv if core_recomputed else 0.0)
                         + gathered_kv_transient_bytes(layer, seq, samples, strategy, training)),
    )
    if layer.moe is None:
        return dense
    return _with_priced_experts(dense, layer, gradient_strategy(strategy), samples, local, cluster, training)


def _with_priced_experts(dense: LayerCost, layer: LayerSpec, strategy: LayerStrategy, samples: int, seq: int,
                         cluster: ClusterSpec, training: TrainingSpec) -> LayerCost:
    """`dense`, a MoE layer's dense part, with its experts priced under `strategy`, less the dispatch the shared
    expert's stream hides or --overlap-moe-expert-parallel-comm's merged steps hide (cost/ep_overlap.py)."""
    experts = expert_cost(layer, strategy, samples, seq, cluster, training)
    hidden = hidden_dispatch_seconds(layer, strategy, samples, seq, cluster, training,
                                     dense.forward_s + dense.backward_s + dense.recompute_s, experts.comm_s)
    passes = 3 if experts_recomputed(layer, strategy, training) else 2
    merged = hidden_ep_seconds(layer, strategy, samples, seq, cluster, training, (dense.forward_s, dense.backward_s),
                               (experts.forward_s, experts.backward_s), experts.comm_s / passes)
    share = dispatch_interference_share(cluster, training)
    return with_experts(dense, experts, cluster, hidden + merged, share, ep_hidden_s=merged)


def dense_part_cost(layer: LayerSpec, strategy: LayerStrategy, samples: int, seq: int,
                    cluster: ClusterSpec, training: TrainingSpec) -> LayerCost:
    """A dense layer, or a MoE layer's dense part: attention, norms, router weights and the shared expert
    (LayerSpec.dense_ffn_hidden_size, .dense_parameters)."""
    word = training.activation_bytes
    host = graphed_cluster(layer, strategy, cluster, training)  # CUDA graphs lower the host floor
    times = compute_model(host).layer_times(layer, seq, samples, strategy.tp, strategy.sp, host, word,
                                            training.attention_backend)
    if training.grad_accumulation_fusion:
        saved = fused_accumulation_saving(layer, seq, samples, strategy.tp, host, word, times.backward_s)
        times = replace(times, backward_s=times.backward_s - saved)
    if training.fp8:
        times = _in_fp8(times, layer, seq, samples, strategy, cluster, training)
    if tp_overlap_applies(strategy, training):
        forward, backward = overlap_gemm_seconds(layer, seq, samples, strategy.tp, cluster, training)
        times = replace(times, forward_s=times.forward_s + forward, backward_s=times.backward_s + backward)
    selective = training.selective_modules(layer)
    recompute = recompute_time(times, strategy.recompute, selective, _module_shares(layer, strategy, samples, seq,
                                                                                   host, training, selective))
    compute = times.forward_s + times.backward_s + recompute
    params = layer.dense_parameters
    zero3 = zero3_comm_time(params, strategy, cluster, training, strategy.recompute == "full")
    backend = training.attention_backend
    activations, kept = _dense_kept_bytes(layer, strategy, samples, seq, cluster, training, selective)
    rematerialised = attention_backward_extra_bytes(layer, seq, samples, strategy, backend)
    if strategy.recompute != "none":
        kept_without = layer_activation_bytes(layer, seq, samples, _no_recompute(strategy), word,
                                              cluster.dropout_mask_bytes, backend, fusions=training.fusions,
                                              te_core=training.fused_norms)
        rematerialised += kept_without - activations
    states = model_state_bytes(params, strategy, training)
    if training.fp8:
        states += fp8_weight_copy_bytes(layer.dense_parameters, strategy.tp, training.fp8_param_gather)
    return LayerCost(
        forward_s=times.forward_s,
        backward_s=times.backward_s,
        recompute_s=recompute,
        tp_comm_s=_tp_comm_seconds(layer, seq, samples, strategy, cluster, training, selective),
        # FSDP prefetches the next gathers while this layer computes; on a cluster whose
        # runtime hides no communication behind compute (grad_overlap 0, cpu-gloo) it all shows.
        zero3_exposed_s=exposed_beside(zero3, compute, cluster),
        **dp_cost_fields(params, strategy, cluster, training),
        state_bytes=states,
        activation_bytes=kept,
        transient_bytes=zero3_gathered_bytes(params, strategy, training) + rematerialised,
        workspace_bytes=attention_workspace_bytes(layer, seq, samples, strategy, word, backend),
        optimizer_temporary_bytes=optimizer_temporary_bytes(params, strategy, training),
    )


def kept_activation_bytes(layer: LayerSpec, strategy: LayerStrategy, samples: int, seq: int,
                          cluster: ClusterSpec, training: TrainingSpec) -> float:
    """layer_cost(...).activation_bytes without pricing any time: the search's memory floor weighs it under
    every --recompute-modules set (search/stage_bound.py, least_selective_kept_bytes)."""
    if strategy.recompute != "selective" and training.recompute_modules != DEFAULT_RECOMPUTE_MODULES:
        training = _without_recompute_modules(training)
    selective = training.selective_modules(layer)
    dense_view, dense_seq, extra = strategy, seq, 0.0
    if strategy.cp > 1:
        dense_view, dense_seq = gradient_strategy(strategy), local_sequence(seq, strategy)
        if not _core_recomputed(layer, strategy, training):
            extra = _whole_sequence_kv_bytes(layer, strategy, samples, dense_seq, training)
    kept = _dense_kept_bytes(layer, dense_view, samples, dense_seq, cluster, training, selective)[1] + extra
    static, offloaded = _host_knob_bytes(layer, strategy, samples, seq, training)
    kept += static - offloaded
    if layer.moe is None:
        return kept
    return kept + expert_activation_bytes(layer, dense_seq, samples, dense_view, training,
                                          experts_recomputed(layer, dense_view, training))


def _dense_kept_bytes(layer: LayerSpec, strategy: LayerStrategy, samples: int, seq: int, cluster: ClusterSpec,
                      training: TrainingSpec, selective: frozenset) -> tuple[float, float]:
    """(what the dense part's kernels keep for backward in the activation type, the same less what FP8's saved
    inputs save): cost.memory.layer_activation_bytes and cost.fp8.fp8_saved_input_savings."""
    kept = layer_activation_bytes(layer, seq, samples, strategy, training.activation_bytes,
                                  cluster.dropout_mask_bytes, training.attention_backend, selective, training.fusions,
                                  te_core=training.fused_norms)
    if not training.fp8:
        return kept, kept
    return kept, kept - _fp8_saved_savings(layer, seq, samples, strategy, training, selective)


def _core_recomputed(layer: LayerSpec, strategy: LayerStrategy, training: TrainingSpec) -> bool:
    return strategy.recompute == "full" or (
        strategy.recompute == "selective" and "core_attn" in training.selective_modules(layer))


def _whole_sequence_kv_bytes(layer: LayerSpec, strategy: LayerStrategy, samples: int, local: int,
                             training: TrainingSpec) -> float:
    """The whole sequence's K and V that Megatron-Core's own CP attention keeps beyond the local ones (none
    under Transformer Engine's ring: context_parallel_layer_cost)."""
    if training.fused_norms:
        return 0.0
    return (training.activation_bytes * local * samples / strategy.tp
            * (cp_qkv_kept_width(layer, strategy.cp) - qkv_kept_width(layer, True)))


def _tp_comm_seconds(layer: LayerSpec, seq: int, samples: int, strategy: LayerStrategy, cluster: ClusterSpec,
                     training: TrainingSpec, selective: frozenset) -> float:
    """The layer's TP collectives per micro-batch, less what --tp-comm-overlap hides (cost/tp_overlap.py)."""
    word = training.activation_bytes
    seconds = (tp_comm_time(layer.hidden_size, seq, samples, strategy, cluster, word) * _tp_share(layer)
               + mla_tp_comm_time(layer, seq, samples, strategy, cluster, word, "mla_up_proj" in selective))
    if not tp_overlap_applies(strategy, training):
        return seconds
    gemms = linear_gemm_seconds(layer, seq, samples, strategy.tp, cluster, training)
    return exposed_tp_seconds(seconds, gemms, strategy.tp)


def _in_fp8(times: ComputeTimes, layer: LayerSpec, seq: int, samples: int, strategy: LayerStrategy,
            cluster: ClusterSpec, training: TrainingSpec) -> ComputeTimes:
    """The layer's times with its linear GEMMs in FP8 and the casts that needs (cost/fp8.py)."""
    delta = fp8_layer_delta(layer, seq, samples, strategy.tp, strategy.sp, cluster, training.fp8_recipe)
    return replace(times, forward_s=times.forward_s + delta.forward_s, backward_s=times.backward_s + delta.backward_s)


def _fp8_saved_savings(layer: LayerSpec, seq: int, samples: int, strategy: LayerStrategy, training: TrainingSpec,
                       selective: frozenset) -> float:
    """Saved bytes FP8 removes (cost/fp8.py): none under full recompute (only the layer input is kept)."""
    if strategy.recompute == "full":
        return 0.0
    recomputed = selective if strategy.recompute == "selective" else frozenset()
    return fp8_saved_input_savings(layer, seq, samples, strategy.tp, strategy.sp,
                                   norms_kept="layernorm" not in recomputed, mlp_inner_kept="mlp" not in recomputed,
                                   core_keeps_output=training.attention_backend == "flash"
                                   and "core_attn" not in recomputed)


def _module_shares(layer: LayerSpec, strategy: LayerStrategy, samples: int, seq: int, cluster: ClusterSpec,
                   training: TrainingSpec, selective: frozenset) -> tuple[float, float, float]:
    """The MLP's, the norms' and MLA's up projections' share of the forward where selective recompute re-runs
    them (else unused)."""
    if strategy.recompute != "selective" or not selective & {"mlp", "layernorm", "mla_up_proj"}:
        return 0.0, 0.0, 0.0
    return module_forward_shares(layer, seq, samples, strategy.tp, strategy.sp, cluster, training.activation_bytes,
                                 training.attention_backend)


def _tp_share(layer: LayerSpec) -> float:
    """The share of a dense layer's TP collectives a layer runs: all of them, or for a MoE layer without a
    shared expert the attention's half (the routed experts' tokens travel by the dispatcher, not the TP group;
    Megatron-Core's SharedExpertMLP gathers and reduce-scatters its input over TP like the dense MLP)."""
    return 0.5 if layer.moe is not None and not layer.moe.shared_expert_ffn_hidden_size else 1.0


def _no_recompute(strategy: LayerStrategy) -> LayerStrategy:
    return replace(strategy, recompute="none")
