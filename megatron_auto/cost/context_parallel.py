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
- K and V travel: an all-gather of the whole sequence's K and V in the forward (again under full
  recompute), a reduce-scatter of their gradients in the backward, over cp ranks `tp` apart
  (Megatron-Core's rank order tp-cp-dp-pp), all exposed (the attention waits for them); under
  Transformer Engine's spec the ring overlaps them with the core instead (ring_kv_exchange_time);
- the attention keeps the whole sequence's K and V, expanded to the query heads (cp_qkv_kept_width);
- weights are replicated over CP: gradients are reduced, and the distributed optimizer shards, over
  dp x cp ranks (LayerStrategy.gradient_dp).
"""
from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

from ..plan import LayerStrategy
from ..specs.cluster import ClusterSpec
from ..specs.model import LayerSpec, ModelSpec
from ..specs.training import TrainingSpec
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
                     cluster: ClusterSpec, word: int, regather: bool) -> float:
    """The K/V all-gather (twice where the core attention is recomputed: `regather`) and the reduce-scatter
    of their gradients, per micro-batch: the gathered buffer is the whole sequence's K and V of this rank's
    query groups."""
    bytes_ = kv_bytes(layer, seq, samples, strategy, word)
    comm = comm_model(cluster)
    gathers = 2 if regather else 1
    return (gathers * comm.collective_time("all_gather", bytes_, strategy.cp, strategy.tp, cluster)
            + comm.collective_time("reduce_scatter", bytes_, strategy.cp, strategy.tp, cluster))


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
