"""Memory per GPU: model states per ZeRO level, activations per Korthikanti et al.

Model states: Megatron-LM docs/distrib_optimizer.md (18 bytes/param unsharded in
bf16 with fp32 grads; 6 + 12/d with the distributed optimizer) and Rajbhandari
et al. 2020 (ZeRO stages 1-3). Activations: Korthikanti et al. 2022
(arXiv 2205.05198), Sec. 4, generalised to GQA, SwiGLU and any FFN width.
"""
from __future__ import annotations

from ..plan import LayerStrategy
from ..specs.model import LayerSpec, ModelSpec
from ..specs.training import TrainingSpec
from .pipeline import warmup_chunk_forwards

MASK_BYTES = 1  # dropout masks are stored as bytes on CUDA (Korthikanti et al., Sec. 4.1); see ClusterSpec


def model_state_bytes(num_params: float, strategy: LayerStrategy, training: TrainingSpec) -> float:
    """Parameters, gradients and Adam states of `num_params` weights on one GPU.

    The weights are first split by TP; ZeRO then shards optimizer states (>=1),
    gradients (>=2) and parameters (3) over the DP group.
    """
    local = num_params / strategy.tp
    dp = strategy.dp
    params = local * training.param_bytes / (dp if strategy.zero >= 3 else 1)
    grads = local * training.grad_bytes / (dp if strategy.zero >= 2 else 1)
    optimizer = local * training.optimizer_bytes / (dp if strategy.zero >= 1 else 1)
    return params + grads + optimizer


def zero3_gathered_bytes(num_params: float, strategy: LayerStrategy, training: TrainingSpec) -> float:
    """Transient unsharded weights (and their grads) of one ZeRO-3 layer while it runs."""
    if strategy.zero < 3:
        return 0.0
    return 2 * num_params / strategy.tp * training.param_bytes


def layer_activation_bytes(layer: LayerSpec, seq: int, samples: int, strategy: LayerStrategy,
                           activation_bytes: int, mask_bytes: int = MASK_BYTES) -> float:
    """Bytes one layer keeps for backward, per micro-batch on one GPU.

    For GPT in 16-bit this is sbh(34/t + 5as/(ht)) with SP, sbh(10 + 24/t + 5as/(ht))
    without, 34sbh/t (SP) under selective recompute, and 2sbh (/t with SP) under full
    recompute (Korthikanti et al., Table 2). `mask_bytes`: ClusterSpec.dropout_mask_bytes (1 on
    CUDA; the word on CPU, where the per-layer saved tensors measured by profile-model match this sum).
    """
    s, b, h, t = seq, samples, layer.hidden_size, strategy.tp
    kv_width = layer.num_query_groups * layer.kv_channels
    word = activation_bytes
    replicated_split = t if strategy.sp else 1
    if strategy.recompute == "full":
        return word * s * b * h / replicated_split
    # Kept whole on every TP rank unless SP: two LayerNorm inputs, two LayerNorm
    # outputs (QKV and fc1 inputs), and two dropout masks.
    replicated = s * b * (4 * word * h + 2 * mask_bytes * h)
    # Split over TP: Q, K, V, the projection input, the MLP's inner activations.
    mlp_inner = (3 if layer.swiglu else 2) * layer.ffn_hidden_size
    sharded = word * s * b * (h + 2 * kv_width + h + mlp_inner)
    if strategy.recompute == "none":
        # softmax output and its dropout output (2 words each) plus the mask: 5as^2b in 16-bit.
        sharded += (2 * word + mask_bytes) * layer.num_attention_heads * s * s * b
    return replicated / replicated_split + sharded / t


def embedding_activation_bytes(model: ModelSpec, samples: int, strategy: LayerStrategy,
                               activation_bytes: int, mask_bytes: int = MASK_BYTES) -> float:
    """First stage: embedding output and its dropout mask (sbh(word + 1)), split by SP."""
    split = strategy.tp if strategy.sp else 1
    return model.seq_length * samples * model.hidden_size * (activation_bytes + mask_bytes) / split


def logits_activation_bytes(model: ModelSpec, samples: int, strategy: LayerStrategy) -> float:
    """Last stage: fp32 logits of the vocab-parallel cross entropy, 4sbV/t (Korthikanti Sec. 4.3)."""
    return 4.0 * model.seq_length * samples * model.vocab_size / strategy.tp


def in_flight_micro_batches(stage: int, pipeline_parallel: int, num_micro_batches: int,
                            virtual_stages: int, schedule: str) -> float:
    """Micro-batches whose activations stage `stage` holds at its peak, in units of
    the whole stage's activations.

    1F1B holds p - s (Narayanan et al. SC21, Sec. 2.2.1); GPipe holds all m. The
    interleaved schedule warms up (p - s - 1) * 2 + (v - 1) * p chunk-micro-batches
    before its first backward (Megatron-Core schedules.py), each 1/v of the stage.
    """
    if schedule == "gpipe":
        return float(num_micro_batches)
    chunks = warmup_chunk_forwards(pipeline_parallel, virtual_stages, stage) + 1
    return min(chunks, num_micro_batches * virtual_stages) / virtual_stages
