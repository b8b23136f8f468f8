"""A layer under context parallelism (CP): each rank of a CP group holds 2 of the 2 x cp chunks of
every sequence (Megatron-Core's load-balanced split), and the runtime all-gathers K and V over the
group for the attention (runtime/context_parallel.py).

What changes against the same layer without CP, for one rank:
- every GEMM, element-wise kernel and TP collective sees s / cp tokens: the layer is priced at the
  local sequence;
- the attention core does not: each query chunk attends to all keys before it. Over a rank's two
  chunks (c = r and 2cp-1-r, L = s / 2cp tokens each) that is sum_c (c L^2 + L^2 / 2) = 2 cp L^2
  query-key pairs, 1 / cp of the whole sequence's (2 cp L)^2 / 2 and cp times the (2L)^2 / 2 of a
  causal sequence of s / cp; so the core costs its share of the whole sequence's;
- K and V travel (cp_exchange_time), by what runs: the local spec's attention all-gathers the whole
  sequence's K and V in the forward (again under full recompute) and reduce-scatters their gradients in the
  backward, over cp ranks `tp` apart (Megatron-Core's rank order tp-cp-dp-pp), all exposed (the attention
  waits for them). Transformer Engine's spec runs what --cp-comm-type asks: p2p, its ring, which overlaps
  them with the core (ring_kv_exchange_time); all_gather, the same gather, again in the backward; a2a,
  all-to-alls of Q, K, V and the output instead (qkvo_all_to_all_time). A sliding window runs with a2a and
  all_gather only, and a2a splits the heads over the ranks (cp_comm_problem);
- the attention keeps the whole sequence's K and V, expanded to the query heads (cp_qkv_kept_width);
- weights are replicated over CP: gradients are reduced, and the distributed optimizer shards, over
  dp x cp ranks (LayerStrategy.gradient_dp).
"""
from __future__ import annotations

from dataclasses import replace
from functools import lru_cache
from typing import Optional

from ..plan import LayerStrategy
from ..specs.cluster import ClusterSpec
from ..specs.model import LayerSpec, ModelSpec
from ..specs.training import TrainingSpec
from .communication import group_all_to_all_time
from .layer_kernels import attention_core_times
from .models import comm_model, compute_model


def local_sequence(seq: int, strategy: LayerStrategy) -> int:
    """Tokens of each sequence on one rank of the CP group."""
    return seq // strategy.cp


def gradient_strategy(strategy: LayerStrategy) -> LayerStrategy:
    """The strategy as the weights see it: CP folded into DP (the gradient and optimizer group)."""
    return _cp_folded(strategy) if strategy.cp > 1 else strategy


@lru_cache(maxsize=4096)
def _cp_folded(strategy: LayerStrategy) -> LayerStrategy:
    """gradient_strategy of a CP layout, memoised: a search asks it of each layout thousands of times."""
    return replace(strategy, dp=strategy.gradient_dp, cp=1)


def local_model(model: ModelSpec, strategy: LayerStrategy) -> ModelSpec:
    """The model as one CP rank's embedding and LM head see it: s / cp tokens per sequence."""
    return replace(model, seq_length=local_sequence(model.seq_length, strategy)) if strategy.cp > 1 else model


def attention_core_extra_times(layer: LayerSpec, seq: int, samples: int, strategy: LayerStrategy,
                               cluster: ClusterSpec, training: TrainingSpec) -> tuple[float, float]:
    """(forward, backward) seconds the core adds over its local-sequence price: a rank's share of the whole
    sequence's core (1 / cp of it, module docstring) less the local-sequence core already priced."""
    whole = _core_times(layer, seq, samples, strategy, cluster, training)
    local = _core_times(layer, local_sequence(seq, strategy), samples, strategy, cluster, training)
    return tuple(max(0.0, w / strategy.cp - l) for w, l in zip(whole, local))  # type: ignore[return-value]


def _core_times(layer: LayerSpec, seq: int, samples: int, strategy: LayerStrategy, cluster: ClusterSpec,
                training: TrainingSpec) -> tuple[float, float]:
    """(forward, backward) seconds of the core attention as the layer's price counts them: kernel by kernel
    its own times without the launch floor (which bounds the whole layer, cost/layer_kernels.py); else the
    core's forward and the analytic model's 2x for its backward."""
    if cluster.compute.kernel_level:
        return attention_core_times(layer, seq, samples, strategy.tp, cluster, training.activation_bytes,
                                    training.attention_backend)
    forward = compute_model(cluster).layer_times(layer, seq, samples, strategy.tp, strategy.sp, cluster,
                                                 training.activation_bytes,
                                                 training.attention_backend).attention_core_forward_s
    return forward, 2.0 * forward


def kv_bytes(layer: LayerSpec, seq: int, samples: int, strategy: LayerStrategy, word: int) -> float:
    """The whole sequence's K and V of this rank's query groups: what the CP group exchanges."""
    return 2 * seq * samples * max(1, layer.num_query_groups // strategy.tp) * layer.kv_channels * word


def kv_exchange_time(layer: LayerSpec, seq: int, samples: int, strategy: LayerStrategy,
                     cluster: ClusterSpec, word: int, gathers: int) -> float:
    """`gathers` all-gathers of the whole sequence's K and V of this rank's query groups and one reduce-scatter of
    their gradients, per micro-batch."""
    bytes_ = kv_bytes(layer, seq, samples, strategy, word)
    comm = comm_model(cluster)
    return (gathers * comm.collective_time("all_gather", bytes_, strategy.cp, strategy.tp, cluster)
            + comm.collective_time("reduce_scatter", bytes_, strategy.cp, strategy.tp, cluster))


def cp_exchange_time(layer: LayerSpec, seq: int, samples: int, strategy: LayerStrategy, cluster: ClusterSpec,
                     training: TrainingSpec, core_recomputed: bool) -> float:
    """The layer's CP traffic per micro-batch, by what runs (module docstring): the local spec's all-gather (once,
    twice where the core is recomputed); under Transformer Engine's spec, for --cp-comm-type p2p its ring, for
    all_gather its gather, which AttnFuncWithCPAndKVAllGather runs again in the backward (it keeps the local K and
    V: context_parallel.py, backward, gather_along_first_dim), for a2a its all-to-alls."""
    word = training.activation_bytes
    if not training.fused_norms:
        return kv_exchange_time(layer, seq, samples, strategy, cluster, word, gathers=2 if core_recomputed else 1)
    if training.cp_comm_type == "p2p":
        return ring_kv_exchange_time(layer, seq, samples, strategy, cluster, training, regather=core_recomputed)
    if training.cp_comm_type == "all_gather":
        return kv_exchange_time(layer, seq, samples, strategy, cluster, word, gathers=3 if core_recomputed else 2)
    return qkvo_all_to_all_time(layer, seq, samples, strategy, cluster, word, replayed=core_recomputed)


def qkvo_all_to_all_time(layer: LayerSpec, seq: int, samples: int, strategy: LayerStrategy, cluster: ClusterSpec,
                         word: int, replayed: bool) -> float:
    """Transformer Engine's a2a CP (AttnFuncWithCPAndQKVOA2A; DeepSpeed-Ulysses' exchange, Jacobs et al. 2023,
    arXiv 2309.14509): before the core an all-to-all turns each rank's sequence shard of Q, K and V into a shard
    of 1/cp of its heads over the whole sequence, after it another turns the output back; the backward exchanges
    the output's gradient in and those of Q, K and V out. Each moves the rank's local tensors over cp ranks `tp`
    apart, on the attention's path (TE overlaps the three inputs' exchanges only with each other). Where the core
    is recomputed the forward's two run again."""
    tokens = samples * seq / strategy.cp
    heads, groups = layer.num_attention_heads // strategy.tp, max(1, layer.num_query_groups // strategy.tp)
    dq, dv = layer.query_head_width, layer.value_head_width
    qkv = word * tokens * (heads * dq + groups * (dq + dv))
    out = word * tokens * heads * dv
    one_way = (group_all_to_all_time(qkv, strategy.cp, strategy.tp, cluster)
               + group_all_to_all_time(out, strategy.cp, strategy.tp, cluster))
    return one_way * (3 if replayed else 2)


def gathered_kv_transient_bytes(layer: LayerSpec, seq: int, samples: int, strategy: LayerStrategy,
                                training: TrainingSpec) -> float:
    """The whole sequence's K and V that Transformer Engine's all_gather CP holds while its core runs (not kept:
    the backward gathers them again); nothing under its ring or a2a, or under the local spec (whose kept K and V
    layer_cost counts)."""
    if training.fused_norms and training.cp_comm_type == "all_gather":
        return kv_bytes(layer, seq, samples, strategy, training.activation_bytes)
    return 0.0


def cp_comm_problem(model: ModelSpec, tp: int, cp: int, training: TrainingSpec) -> Optional[str]:
    """Why Transformer Engine's CP attention cannot run the model's layers at (tp, cp) with training.cp_comm_type,
    or None (transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py): a softmax other than
    the vanilla one runs with a2a only and a sliding window with a2a or all_gather (attn_forward_func_with_cp), and
    a2a splits each TP shard's query heads and key/value groups over the cp ranks (AttnFuncWithCPAndQKVOA2A). The
    local spec's attention reads no cp_comm_type."""
    if cp == 1 or not training.fused_norms:
        return None
    layers = model.distinct_layers
    offsets = sorted({layer.softmax_type for layer in layers} - {"vanilla"})
    if offsets and training.cp_comm_type != "a2a":
        return (f"the {offsets[0]} softmax under context parallelism needs --cp-comm-type a2a (Transformer Engine "
                f"runs it on its fused attention, and under CP with a2a only; model '{model.name}')")
    if training.cp_comm_type == "p2p" and any(layer.attention_window is not None for layer in layers):
        return ("sliding-window attention under context parallelism needs --cp-comm-type a2a or all_gather "
                f"(Transformer Engine's p2p ring runs no window; model '{model.name}')")
    if training.cp_comm_type != "a2a":
        return None
    for layer in layers:
        heads, groups = layer.num_attention_heads // tp, max(1, layer.num_query_groups // tp)
        if heads % cp or groups % cp:
            return (f"--cp-comm-type a2a splits each TP shard's {heads} query heads and {groups} key/value groups "
                    f"over the {cp} context-parallel ranks, which do not divide them (model '{model.name}', tp {tp})")
    return None


def ring_kv_exchange_time(layer: LayerSpec, seq: int, samples: int, strategy: LayerStrategy, cluster: ClusterSpec,
                          training: TrainingSpec, regather: bool) -> float:
    """The K/V traffic left exposed by Transformer Engine's ring attention (AttnFuncWithCPAndKVP2P, what
    Megatron-Core's TE spec runs for CP): in each of its cp steps a rank sends the K/V chunk it holds to the
    next rank while it computes attention on the chunk it received, so cp - 1 transfers run beside cp - 1 of
    the cp steps' core work (1 / cp of the whole sequence's core each, module docstring). The forward moves
    the whole sequence's K and V once (again under full recompute); the backward moves them again with their
    gradients (an all-gather's and a reduce-scatter's bytes). What the core cannot cover stays exposed, and all
    of it where the cluster overlaps nothing (grad_overlap). Its sends and receives to one peer each run on a few
    of NCCL's point-to-point channels, not a collective's (cost/comm_interference.py leaves them out)."""
    bytes_ = kv_bytes(layer, seq, samples, strategy, training.activation_bytes)
    comm = comm_model(cluster)
    gather = comm.collective_time("all_gather", bytes_, strategy.cp, strategy.tp, cluster)
    scatter = comm.collective_time("reduce_scatter", bytes_, strategy.cp, strategy.tp, cluster)
    core_forward, core_backward = (t / strategy.cp * (strategy.cp - 1) / strategy.cp
                                   for t in _core_times(layer, seq, samples, strategy, cluster, training))
    passes = ((gather, core_forward),) * (2 if regather else 1) + ((gather + scatter, core_backward),)
    total = sum(moved for moved, _ in passes)
    exposed = sum(max(0.0, moved - covered) for moved, covered in passes)
    return total - comm.grad_overlap * (total - exposed)


def cp_qkv_kept_width(layer: LayerSpec, cp: int) -> float:
    """Per local token and before the TP split, what the attention keeps of Q, K and V under CP (compare
    cost.memory.qkv_kept_width without CP): K and V of the whole sequence expanded to the a query heads
    (2 a d x cp), Q as its own tensor when RoPE, the q/k norms or the grouped-query copy wrote one, else
    the mixed QKV tensor it views; the q/k norms keep their inputs (the mixed tensor, and the query copy).
    The local K and V are not kept: the gather and the expansion do not need their inputs for backward.
    Derived from the code paths, not yet measured in the runtime's layer."""
    a, g, d = layer.num_attention_heads, layer.num_query_groups, layer.kv_channels
    q, kv = a * d, g * d
    query_copied = 1 < g < a
    new_q = layer.rotary or layer.qk_layernorm or query_copied
    kept = 2 * q * cp + (q if new_q else q + 2 * kv)
    if layer.qk_layernorm:
        kept += q + 2 * kv + (q if query_copied else 0)
    return kept
