"""A layer priced kernel by kernel: GEMMs, element-wise passes, the attention core per backend,
the weight-gradient accumulation and the host's per-op floor (ComputeEfficiency.kernel_level).

What runs is Megatron-Core's TransformerLayer on the local spec with every fusion off
(runtime/config.py, profiling/layer_bench.py): separate bias adds, dropouts and residual adds,
torch LayerNorm and GeLU, and for `unfused` attention DotProductAttention's baddbmm, fp32
softmax (TransformerConfig.attention_softmax_in_fp32, default True: FusedScaleMaskSoftmax's
torch path casts to fp32, masks in place, softmax, casts back), dropout and bmm. The tensor
sizes are Korthikanti et al. 2022 (arXiv 2205.05198), Sec. 4.1: per token, h-wide LayerNorm,
bias-dropout-add and residual tensors, f-wide MLP tensors and a*s attention scores.

Memory-bound work moves its bytes at ELEMENTWISE_BANDWIDTH_FRACTION of HBM bandwidth (cost/kernel_rates.py).
The attention-core GEMMs are memory-bound too (k or n = h/a): each runs at the slower of the GEMM
law and its s x s operand's bytes. The layer takes at least ops x GpuSpec.kernel_launch_s: with
small shards the host, not the GPU, sets the pace (eager PyTorch issues one op at a time; the
GPU's queue hides the host only while kernels outlast it), hence max(host, GPU) per pass.
"""
from __future__ import annotations

from ..specs.cluster import ClusterSpec
from ..specs.model import LayerSpec
from .flops import CORE, Gemm, layer_gemms
from .kernel_rates import ELEMENTWISE_BANDWIDTH_FRACTION, elementwise_bandwidth, gemm_compute_time  # noqa: F401
from .mla import mla_elementwise_widths

SOFTMAX_BYTES = 4
"""The unfused softmax runs in fp32 (TransformerConfig.attention_softmax_in_fp32 = True)."""
MAIN_GRAD_BYTES = 4
"""Megatron-Core's DDP accumulates each weight gradient into an fp32 main_grad buffer."""
HOST_OPS_FORWARD = 66
HOST_OPS_BACKWARD = 86
HOST_OPS_CORE = 16
"""Aten ops that one local-spec GPT layer dispatches in its forward and backward pass (and its
attention core's forward), counted with a TorchDispatchMode on megatron-core 0.16.1 (the CPU's
three-op dropout counted as CUDA's one native_dropout; docs/cost_model.md, H100 calibration)."""
MLA_HOST_OPS = {True: (55, 65), False: (50, 57)}
"""(forward, backward) ops a multi-latent-attention layer dispatches beyond the same layer with standard attention,
with and without a query down-projection (q_lora_rank): the down and up projections, their norms and the split and
concatenated RoPE parts (the LLaMA-style local-spec layer with flash attention, 86 / 116 ops, against the same layer
under MLA; `.venv/bin/python -m validation.count_moe_host_ops`)."""
HOST_OPS_MLP = 12
HOST_OPS_NORMS = 2
"""Forward ops of the same layer's MLP and of its two LayerNorms, what selective recompute of `mlp` and
`layernorm` re-runs (`.venv/bin/python -m validation.count_host_ops`, GPT row)."""


def layer_host_ops(layer: LayerSpec) -> tuple[int, int]:
    """(forward, backward) ops of one layer's pass: HOST_OPS_FORWARD and HOST_OPS_BACKWARD, plus MLA_HOST_OPS under
    multi-latent attention (a MoE layer's routed side has its own: cost/moe.py, expert_host_seconds)."""
    if layer.mla is None:
        return HOST_OPS_FORWARD, HOST_OPS_BACKWARD
    forward, backward = MLA_HOST_OPS[layer.mla.q_lora_rank is not None]
    return HOST_OPS_FORWARD + forward, HOST_OPS_BACKWARD + backward


def elementwise_bytes(layer: LayerSpec, tokens: int, tp: int, sp: bool, word: int,
                      mask_bytes: int) -> tuple[float, float]:
    """(forward, backward) bytes of the layer's element-wise kernels outside the attention core.

    Per token, forward: two LayerNorms (read+write h each), two bias-dropout-adds (bias add 2h,
    dropout 2h + mask when --hidden-dropout > 0, residual add 3h), the QKV bias add, the query reshape and the context's
    permute copy (2 x width each), the fc1 bias add and the activation (2f for GeLU; SwiGLU
    reads 2f and writes f in silu and the product). Backward: LayerNorm 3h each, dropout 2h +
    mask each, two residual-gradient sums 3h each, bias gradients (a read of each output) and
    the activation 3f (GeLU) or 5f (SwiGLU). h-wide work splits over TP only with SP. Multi-latent
    attention: see mla_elementwise_widths.
    """
    h_shard = layer.hidden_size / (tp if sp else 1)
    qkv = (layer.num_attention_heads + 2 * layer.num_query_groups) * layer.kv_channels / tp
    attn = layer.num_attention_heads * layer.kv_channels / tp
    mla_forward, mla_backward = mla_elementwise_widths(layer, tp, sp)
    f = layer.dense_ffn_hidden_size / tp  # a MoE layer's shared expert; cost/moe.py prices the routed ones
    bias = 1.0 if layer.add_bias_linear else 0.0
    qkv_bias = 1.0 if layer.has_qkv_bias else 0.0  # --add-qkv-bias: the QKV bias alone
    # At --hidden-dropout 0 ATen's dropout returns its input: no kernel, no mask.
    dropout = (2 + mask_bytes / word) * h_shard if layer.hidden_dropout > 0 else 0.0
    fc1_width = f * (2 if layer.swiglu else 1)
    forward = (4 * h_shard + 2 * (2 * bias * h_shard + dropout + 3 * h_shard)
               + 2 * qkv_bias * qkv + 2 * bias * fc1_width + (5 if layer.swiglu else 2) * f)
    backward = (6 * h_shard + 2 * dropout + 6 * h_shard
                + qkv_bias * qkv + bias * (2 * h_shard + fc1_width) + (5 if layer.swiglu else 3) * f)
    if layer.mla is None:
        forward, backward = forward + 4 * attn, backward + 4 * attn
    else:
        forward, backward = forward + mla_forward, backward + mla_backward
    return tokens * word * forward, tokens * word * backward


def attention_core_times(layer: LayerSpec, seq: int, samples: int, tp: int, cluster: ClusterSpec,
                         word: int, backend: str) -> tuple[float, float]:
    """(forward, backward) GPU seconds of the core attention: softmax(QK^T)V per head."""
    heads = samples * layer.num_attention_heads // tp
    dq, dv = layer.query_head_width, layer.value_head_width
    if backend == "flash":
        # SDPA's flash kernel with is_causal skips the tiles above the diagonal: it runs half of
        # the 4bs^2h of SC21's count (2 s^2 (d_q + d_v) per head); its backward recomputes QK^T, 2.5x
        # the forward's FLOPs (Dao 2023, FlashAttention-2, Sec. 3.1-3.2). Scores and dropout stay on chip.
        flops = 2.0 * heads * attended_pairs(seq, layer.attention_window) * (dq + dv)
        rate = cluster.gpu.peak_flops * cluster.compute.flash_fraction
        forward, backward = flops / rate, 2.5 * flops / rate
        if layer.attention_window is None:
            return forward, backward
        # A narrow window leaves the kernel its reads and writes: Q, K, V in and O out forward; those, dO and
        # the log-sum-exp in, dQ, dK, dV out backward (about twice). A whole causal prefix of the sequences
        # planned here (s/4 FLOPs a byte) is far past the ridge; a window of w gives w/2.
        moved = word * samples * seq * (layer.num_attention_heads + layer.num_query_groups) * (dq + dv) / tp
        bandwidth = elementwise_bandwidth(cluster)
        return max(forward, moved / bandwidth), max(backward, 2 * moved / bandwidth)
    scores = heads * seq * seq  # elements of the b * np * s * s score tensor
    bandwidth = elementwise_bandwidth(cluster)
    operand = word * scores / bandwidth  # the s x s operand each core GEMM reads or writes
    qk = max(gemm_compute_time(Gemm(seq, dq, seq, heads), cluster), operand)
    pv = max(gemm_compute_time(Gemm(seq, seq, dv, heads), cluster), operand)
    # The attention dropout's pass (read, write, mask); none at --attention-dropout 0.
    dropout = 2 * word + cluster.dropout_mask_bytes if layer.attention_dropout > 0 else 0
    cast = 0 if word == SOFTMAX_BYTES else word + SOFTMAX_BYTES  # one fp32<->16-bit cast pass
    # forward: cast up, masked_fill_ and softmax (read+write fp32), cast down, dropout.
    forward = 2 * cast + 4 * SOFTMAX_BYTES + dropout
    # backward: dropout, cast, softmax backward, masked_fill, cast. Rows longer than 1024 take
    # ATen's non-persistent softmax backward, which reads output and gradient once for the row
    # sum and again for the update (5 fp32 passes; the persistent kernel needs only 3).
    softmax_backward = 5 if seq > 1024 else 3
    backward = dropout + 2 * cast + softmax_backward * SOFTMAX_BYTES + 2 * SOFTMAX_BYTES
    return (qk + pv + forward * scores / bandwidth,
            2 * (qk + pv) + backward * scores / bandwidth)


def attended_pairs(seq: int, window: int | None) -> float:
    """(query, key) pairs one head of a causal core computes over a sequence: half the s x s square, or with a
    sliding window of `window` keys before each query (Megatron-Core's window_size[0]) the band
    sum_i (min(i, window) + 1) = (window + 1) (s - window / 2) where the window is shorter than the sequence."""
    if window is None or window >= seq - 1:
        return 0.5 * seq * seq
    return (window + 1) * (seq - window / 2)


def weight_grad_accumulation_bytes(layer: LayerSpec, tp: int, word: int) -> float:
    """Bytes of adding each new weight gradient into its fp32 main_grad (read new, read+write old)."""
    return layer.dense_parameters / tp * (word + 2 * MAIN_GRAD_BYTES)


def fused_accumulation_saving(layer: LayerSpec, seq: int, samples: int, tp: int, cluster: ClusterSpec,
                              word: int, backward_s: float) -> float:
    """Backward seconds the weight-gradient accumulation fusion removes from a kernel-level layer: the separate
    accumulation pass (weight_grad_accumulation_bytes); the GEMM's fp32 epilogue that replaces it runs beside its
    math. Never below the host's floor of the backward's ops."""
    if not cluster.compute.kernel_level:
        return 0.0
    saved = weight_grad_accumulation_bytes(layer, tp, word) / elementwise_bandwidth(cluster)
    floor = layer_host_ops(layer)[1] * cluster.gpu.kernel_launch_s
    return max(0.0, min(saved, backward_s - floor))


def kernel_level_times(layer: LayerSpec, seq: int, samples: int, tp: int, sp: bool, cluster: ClusterSpec,
                       word: int, backend: str) -> tuple[float, float, float]:
    """(forward, backward, attention-core forward) seconds of one micro-batch on one shard."""
    gemms = layer_gemms(layer, seq, samples, tp)
    dense = sum(gemm_compute_time(g, cluster) for g in gemms if g.role != CORE)
    core_forward, core_backward = attention_core_times(layer, seq, samples, tp, cluster, word, backend)
    forward_bytes, backward_bytes = elementwise_bytes(layer, samples * seq, tp, sp, word, cluster.dropout_mask_bytes)
    backward_bytes += weight_grad_accumulation_bytes(layer, tp, word)
    bandwidth = elementwise_bandwidth(cluster)
    launch = cluster.gpu.kernel_launch_s
    host_forward, host_backward = layer_host_ops(layer)
    forward = max(host_forward * launch, dense + core_forward + forward_bytes / bandwidth)
    # dgrad + wgrad: twice the forward GEMMs (SC21 Sec. 5.1).
    backward = max(host_backward * launch, 2 * dense + core_backward + backward_bytes / bandwidth)
    return forward, backward, max(HOST_OPS_CORE * launch, core_forward)


MIXED_STATE_BYTES_PER_PARAM = 18
"""bf16 weight, fp32 main_grad, fp32 master, momentum and variance (TrainingSpec defaults)."""
ADAM_STEP_BYTES_PER_PARAM = {"fused": 42, "foreach": 94}
"""HBM bytes one optimizer step moves per parameter. Both: the grad-norm read of the fp32
gradient (4), the bf16 copy of the updated master (read 4, write 2) and zeroing main_grad (4).
fused (one kernel): read the gradient, read+write master, momentum, variance (28). foreach
(torch's _multi_tensor_adamw, one pass per op over fp32 lists): weight decay on the master
(8), lerp_ of the momentum (12), mul_ and addcmul_ of the variance (8 + 12), sqrt, div_ and
add_ of the denominator (8 each) and addcdiv_ into the master (16): 80."""


def optimizer_step_bytes(state_bytes: float, impl: str) -> float:
    """HBM bytes of one optimizer step over `state_bytes` of model state, scaled per parameter from
    the mixed-precision layout (with ZeRO the shards scale alike to first order)."""
    return state_bytes * ADAM_STEP_BYTES_PER_PARAM[impl] / MIXED_STATE_BYTES_PER_PARAM


CROSS_ENTROPY_BYTES_PER_LOGIT = (38, 14)
"""(forward, backward) HBM bytes per logit of Megatron-Core's vocab-parallel cross entropy
(tensor_parallel/cross_entropy.py): forward casts the bf16 logits to fp32 (6), takes the max
(4), subtracts it and exponentiates in place (8 + 8), sums (4) and divides in place (8);
backward scales the saved softmax in place (8) and casts the gradient back to bf16 (6)."""
TE_CROSS_ENTROPY_BYTES_PER_LOGIT = (6, 4)
"""The same under Transformer Engine's fused cross entropy (its Triton kernel, transformer_engine/pytorch/
triton/cross_entropy.py): one pass reads the logits for the running max and sum (2), a second reads them and
writes the gradient over them (2 + 2); backward scales that gradient in place (2 + 2)."""


def embedding_times(tokens: int, hidden: int, vocab: int, tp: int, word: int,
                    cluster: ClusterSpec) -> tuple[float, float]:
    """(forward, backward) seconds of the word embedding on one shard: a gather, the position
    add and dropout (7.5 words per hidden element); backward writes a dense vocab x hidden
    gradient (zeroed, then scattered into) and adds it into main_grad."""
    table = vocab * hidden / tp
    forward = tokens * hidden * word * 7.5
    backward = table * (2 * word + word + 2 * MAIN_GRAD_BYTES)
    bandwidth = elementwise_bandwidth(cluster)
    return forward / bandwidth, backward / bandwidth


def head_memory_times(tokens: int, hidden: int, vocab: int, tp: int, word: int,
                      cluster: ClusterSpec, fusion: str = "none") -> tuple[float, float]:
    """(forward, backward) memory-bound seconds of the LM head beside its GEMMs: the final
    LayerNorm, the cross entropy over the tokens x vocab/tp logits, and the output weight's
    gradient added into main_grad."""
    logits = tokens * vocab / tp
    forward_bytes, backward_bytes = TE_CROSS_ENTROPY_BYTES_PER_LOGIT if fusion == "te" else CROSS_ENTROPY_BYTES_PER_LOGIT
    forward = 2 * tokens * hidden * word + forward_bytes * logits
    backward = 3 * tokens * hidden * word + backward_bytes * logits + vocab * hidden / tp * (word + 2 * MAIN_GRAD_BYTES)
    bandwidth = elementwise_bandwidth(cluster)
    return forward / bandwidth, backward / bandwidth
