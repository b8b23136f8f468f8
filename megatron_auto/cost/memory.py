"""Memory per GPU, term by term: model states per ZeRO level, the optimizer step's
temporaries, activations per Korthikanti et al. with the attention that runs, the
attention's workspace and backward working set, and the logits.

Model states: Megatron-LM docs/distrib_optimizer.md (18 bytes/param unsharded in
bf16 with fp32 grads; 6 + 12/d with the distributed optimizer) and Rajbhandari
et al. 2020 (ZeRO stages 1-3). Activations: Korthikanti et al. 2022
(arXiv 2205.05198), Sec. 4, generalised to GQA, SwiGLU and any FFN width. How the
terms combine into a peak: cost/peak_memory.py; all of it: docs/cost_model.md, Sec. 6.
"""
from __future__ import annotations

from ..plan import LayerStrategy
from ..specs.model import LayerSpec, ModelSpec
from ..specs.training import UNFUSED, KernelFusions, TrainingSpec
from .mla import mla_latent_bytes, mla_qkv_kept_width
from .pipeline import warmup_chunk_forwards

MASK_BYTES = 1  # dropout masks are stored as bytes on CUDA (Korthikanti et al., Sec. 4.1); see ClusterSpec
FP32_BYTES = 4  # fp32 master weights, softmax outputs and norm statistics


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


def optimizer_temporary_bytes(num_params: float, strategy: LayerStrategy, training: TrainingSpec) -> float:
    """Bytes the optimizer step allocates beyond the states, for this rank's optimizer shard.

    torch's foreach Adam (torch/optim/adam.py, _multi_tensor_adam) holds one temporary per master
    weight at its peak: `exp_avg_sq_sqrt = torch._foreach_sqrt(exp_avg_sqs)` over the whole param
    group (the weight-decayed grads of non-decoupled Adam are deleted before it). The masters are fp32
    (4 bytes) in every precision. The fused kernel (_fused_adam) updates in place: no temporaries.
    """
    if training.optimizer_impl != "foreach":
        return 0.0
    return FP32_BYTES * num_params / strategy.tp / (strategy.dp if strategy.zero >= 1 else 1)


def layer_activation_bytes(layer: LayerSpec, seq: int, samples: int, strategy: LayerStrategy,
                           activation_bytes: int, mask_bytes: int = MASK_BYTES,
                           attention_backend: str = "unfused",
                           selective: frozenset = frozenset({"core_attn"}),
                           fusions: KernelFusions = UNFUSED, te_core: bool = False) -> float:
    """Bytes one layer keeps for backward, per micro-batch on one GPU.

    For GPT in 16-bit this is Korthikanti et al.'s (Table 2) sbh(34/t + 5as/(ht)) with SP,
    sbh(10 + 24/t + 5as/(ht)) without, 34sbh/t (SP) under selective recompute of the attention core,
    and 2sbh (/t with SP) under full recompute, with the s x s terms as the attention really keeps them
    (`attention_score_bytes`) and the norms' fp32 statistics. `mask_bytes`: ClusterSpec.dropout_mask_bytes.
    `selective`: the modules selective recompute re-runs (TrainingSpec.selective_modules): `mlp` keeps
    only the MLP's input (its inner activations are rebuilt), `layernorm` keeps neither norm's output
    nor statistics (Megatron-Core's CheckpointWithoutOutput frees the output after its consumer ran).
    `fusions`: Megatron's fused kernels that keep less (KernelFusions). No dropout mask at probability 0.
    `te_core`: the core is Transformer Engine's DotProductAttention (TrainingSpec.fused_norms), which keeps
    contiguous Q, K and V where it runs un-recomputed (qkv_kept_width).
    """
    s, b, h, t = seq, samples, layer.hidden_size, strategy.tp
    word = activation_bytes
    replicated_split = t if strategy.sp else 1
    if strategy.recompute == "full":
        return word * s * b * h / replicated_split
    recomputed = selective if strategy.recompute == "selective" else frozenset()
    # Kept whole on every TP rank unless SP: two LayerNorm inputs, two LayerNorm
    # outputs (QKV and fc1 inputs), two dropout masks, and the norms' statistics.
    norm_outputs = 0 if "layernorm" in recomputed else 2 * word * h
    replicated = s * b * (2 * word * h + norm_outputs + 2 * hidden_mask_bytes(layer, mask_bytes) * h)
    if "layernorm" not in recomputed:
        replicated += norm_statistics_bytes(layer, s, b)
    # Split over TP: Q, K, V as the attention keeps them, the projection input (a*d wide: Megatron-Core's
    # attention.py, query_projection_size = kv_channels * num_attention_heads), the MLP's inner activations.
    mlp_inner = mlp_saved_width(layer.swiglu, fusions.bias_activation) * layer.dense_ffn_hidden_size  # MoE: cost/moe.py
    if "mlp" in recomputed:
        mlp_inner = 0
    core_keeps_inputs = attention_backend == "flash" or "core_attn" in recomputed
    te_copies = te_core and attention_backend == "flash" and "core_attn" not in recomputed
    kept_qkv = qkv_kept_width(layer, core_keeps_inputs, "mla_up_proj" in recomputed, te_copies)
    sharded = word * s * b * (kept_qkv + layer.attention_width + mlp_inner)
    sharded += qk_norm_statistics_bytes(layer, s, b)
    if "core_attn" not in recomputed:
        sharded += attention_score_bytes(layer, s, b, word, mask_bytes, attention_backend)
    latents = mla_latent_bytes(layer, s, b, word, t, strategy.sp, "mla_up_proj" in recomputed)
    rotary = rotary_table_bytes(layer, s, word, "mla_up_proj" in recomputed, fusions.rope)
    return replicated / replicated_split + sharded / t + latents + rotary


def qkv_kept_width(layer: LayerSpec, core_keeps_inputs: bool, up_recomputed: bool = False,
                   te_copies: bool = False) -> float:
    """Per token, the width of what the attention keeps of Q, K and V before the TP split (measured exactly
    in the runtime's layer for every case below: tests/runtime/test_recompute_modules.py).

    The QKV GEMM writes one mixed tensor (a + 2g)d wide; Q, K and V are views of it, except that
    attention.py copies a grouped query to split it into heads (1 < g < a), and RoPE and the q/k norms
    write new Q and K. A core that keeps its inputs as given (flash/SDPA, or any core under selective
    recompute, whose checkpoint keeps them) keeps those: each new tensor, and the mixed one through V. The
    unfused core without recompute, with g < a, keeps instead a query it reshapes (a copy, or the one it
    was given) and K and V expanded to a heads (repeat_interleave): 3ad, and the mixed tensor no longer.
    The q/k norms keep their inputs: the grouped query's copy, and the mixed tensor. Multi-latent attention
    hands any core new contiguous Q, K (a d_q each) and V (a d_v): cost/mla.py mla_qkv_kept_width.

    `te_copies`: Transformer Engine's DotProductAttention, run un-recomputed, keeps what its get_qkv_layout
    hands the kernel: Q, K and V in one of its layouts, else contiguous copies of each (TE's
    attention/dot_product_attention/utils.py get_qkv_layout, "force q,k,v to be contiguous"). A new Q or K
    (RoPE, q/k norms) beside V, a strided view of the mixed tensor, matches no layout, so V is copied and
    the mixed tensor is freed; without new tensors, MHA's views match sbh3d and the mixed tensor is the
    q + 2g d kept. Either way the core keeps q + 2 g d; the q/k norms still keep their inputs (the query's
    copy and, through K, the mixed tensor)."""
    if layer.mla is not None:
        return mla_qkv_kept_width(layer, up_recomputed)
    a, g, d = layer.num_attention_heads, layer.num_query_groups, layer.kv_channels
    q, kv = a * d, g * d
    query_copied = 1 < g < a
    if te_copies and core_keeps_inputs:
        norm_inputs = (q if query_copied else 0) + (q + 2 * kv)  # the query's copy and the mixed tensor
        return q + 2 * kv + (norm_inputs if layer.qk_layernorm else 0)
    new_qk = layer.rotary or layer.qk_layernorm
    mixed_kept = layer.qk_layernorm
    kept = q if layer.qk_layernorm and query_copied else 0
    if not core_keeps_inputs and g < a:
        kept += 3 * q
    else:
        kept += q if new_qk or query_copied else 0
        kept += kv if new_qk else 0
        mixed_kept = True  # V is a view of it
    return kept + (q + 2 * kv if mixed_kept else 0)


def qk_norm_statistics_bytes(layer: LayerSpec, seq: int, samples: int) -> float:
    """--qk-layernorm's fp32 statistics, one norm per query and key head (a + g per token; mean and rstd
    for LayerNorm, rstd for RMSNorm), before the TP split; multi-latent attention's latent norms are priced
    with its latents (cost/mla.py)."""
    if not layer.qk_layernorm or layer.mla is not None:
        return 0.0
    stats = 1 if layer.normalization == "RMSNorm" else 2
    return stats * FP32_BYTES * (layer.num_attention_heads + layer.num_query_groups) * seq * samples


def rotary_table_bytes(layer: LayerSpec, seq: int, word: int, mla_up_recomputed: bool = False,
                       rope_fusion: bool = False) -> float:
    """RoPE's cos and sin tables (s x d, in the activation type), computed and kept once for Q and once for K
    by each layer (megatron-core's _apply_rotary_pos_emb_bshd), whatever the batch and TP. Multi-latent
    attention always rotates (its own RoPE or YaRN table), over qk_pos_emb_head_dim channels; under selective
    recompute of mla_up_proj the tables are rebuilt in backward, and the checkpoint keeps its input instead,
    the fp32 s x d_r angle table. With --apply-rope-fusion (Transformer Engine's fused RoPE kernel,
    megatron-core rope_utils.apply_rotary_pos_emb) a layer keeps only the model's shared angle table: nothing
    per layer (MLA keeps its own path)."""
    if layer.mla is None and rope_fusion:
        return 0.0
    if layer.mla is not None:
        if mla_up_recomputed:
            return FP32_BYTES * seq * layer.mla.qk_pos_emb_head_dim
        return 4 * seq * layer.mla.qk_pos_emb_head_dim * word
    return 4 * seq * layer.kv_channels * word if layer.rotary else 0.0


def mlp_saved_width(swiglu: bool, bias_activation_fusion: bool = False) -> int:
    """What an MLP keeps for backward per token beyond its input, in units of its ffn width f. GeLU: fc1's
    output and the activation's (2f), fused or not. SwiGLU without the bias-activation fusion (the runtime's
    default, megatron_auto.kernel_choice): fc1's 2f output, silu's output and the product: 4f (megatron-core
    0.16.1's glu would also keep a copy of the linear half, which patches/glu_offset_copy.py removes; measured
    in the runtime's layer: tests/runtime/test_recompute_modules.py). With the fusion (Megatron-LM's default,
    --no-bias-swiglu-fusion turns it off) megatron-core's fused_bias_swiglu saves only its 2f input, and fc2
    its f input: 3f."""
    if swiglu:
        return 3 if bias_activation_fusion else 4
    return 2


def hidden_mask_bytes(layer: LayerSpec, mask_bytes: int) -> int:
    """Bytes per element of each hidden dropout's kept mask: none at --hidden-dropout 0, where ATen's dropout
    returns its input (aten/src/ATen/native/Dropout.cpp: p == 0 takes the identity path)."""
    return mask_bytes if layer.hidden_dropout > 0 else 0


def norm_statistics_bytes(layer: LayerSpec, seq: int, samples: int) -> float:
    """The two norms' saved fp32 statistics per token: mean and rstd for LayerNorm, rstd for RMSNorm
    (ATen's native_layer_norm / rms_norm; measured: profile_gpt_1.7b_bf16.json's saved bytes)."""
    stats = 1 if layer.normalization == "RMSNorm" else 2
    return 2 * stats * FP32_BYTES * seq * samples


def attention_score_bytes(layer: LayerSpec, seq: int, samples: int, word: int, mask_bytes: int,
                          attention_backend: str) -> float:
    """What core attention keeps for backward beyond Q, K, V, before the TP split.

    unfused (Megatron-Core DotProductAttention, torch softmax path of FusedScaleMaskSoftmax):
    the softmax output in fp32 (attention_softmax_in_fp32), the dropout mask and the dropout
    output (the second bmm's input) in the activation type: (4 + word + mask) a s^2 b bytes,
    7as^2b in bf16 on CUDA where Korthikanti et al. count 5 (measured: 7 in
    data/reference/h100/profile_gpt_1.7b_bf16.json). flash (SDPA): no s x s tensors; the
    kernel keeps the fp32 log-sum-exp of each query row, 4 a s b (FlashAttention-2, Dao 2023).
    """
    heads = layer.num_attention_heads
    if attention_backend == "flash":
        return FP32_BYTES * heads * seq * samples
    mask = mask_bytes if layer.attention_dropout > 0 else 0  # at 0 the cast-down softmax is the bmm's input
    return (FP32_BYTES + word + mask) * heads * seq * seq * samples


def attention_workspace_bytes(layer: LayerSpec, seq: int, samples: int, strategy: LayerStrategy,
                              word: int, attention_backend: str) -> float:
    """The persistent scores buffer of the unfused attention: DotProductAttention takes the
    baddbmm input [b*np, s, s] from the global memory buffer ("mpu") and keeps it for the whole
    run, one per process (the largest asked for)."""
    if attention_backend == "flash":
        return 0.0
    return word * layer.num_attention_heads / strategy.tp * seq * seq * samples


def attention_backward_extra_bytes(layer: LayerSpec, seq: int, samples: int, strategy: LayerStrategy,
                                   attention_backend: str) -> float:
    """Bytes above the kept s x s tensors while one layer's unfused attention runs its backward.

    At the softmax backward the fp32 probabilities, their incoming gradient and the outgoing one
    (3 x 4 bytes per score) are alive with the dropout output and mask: 8 bytes per score more than
    the kept (4 + word + mask). The measured runs (data/reference/h100/runs_gpt_1.7b.json) show this
    working set at the same 8 a s^2 b under none, selective and full recompute. Flash attention's
    backward allocates gradients of Q, K and V only (O(sbh), left out).
    """
    if attention_backend == "flash":
        return 0.0
    # (3 x 4 + word + mask) - (4 + word + mask) bytes per score element.
    return 2 * FP32_BYTES * layer.num_attention_heads / strategy.tp * seq * seq * samples


def embedding_activation_bytes(model: ModelSpec, samples: int, strategy: LayerStrategy,
                               activation_bytes: int, mask_bytes: int = MASK_BYTES) -> float:
    """First stage: embedding output and its dropout mask (sbh(word + 1); the embedding's dropout is
    --hidden-dropout), split by SP."""
    split = strategy.tp if strategy.sp else 1
    mask = hidden_mask_bytes(model.layers[0], mask_bytes)
    return model.seq_length * samples * model.hidden_size * (activation_bytes + mask) / split


def logits_activation_bytes(model: ModelSpec, samples: int, strategy: LayerStrategy,
                            bytes_per_logit: int = FP32_BYTES) -> float:
    """Last stage: what the cross entropy keeps for backward per logit, sbV/t of them: the fp32 softmax of
    Megatron-Core's vocab-parallel cross entropy (tensor_parallel/cross_entropy.py: logits.float(), exp and
    divide in place), or the logits themselves under TE's fused one (kept_logit_bytes)."""
    return bytes_per_logit * model.seq_length * samples * model.vocab_size / strategy.tp


def kept_logit_bytes(fusion: str, word: int) -> int:
    """Bytes per logit the loss keeps: Transformer Engine's fused cross entropy (transformer_engine/pytorch/
    cross_entropy.py, parallel_cross_entropy) keeps its input and writes the gradient over it; the others an
    fp32 softmax."""
    return word if fusion == "te" else FP32_BYTES


def logits_transient_bytes(model: ModelSpec, samples: int, strategy: LayerStrategy, word: int,
                           fusion: str = "none") -> float:
    """Beside that fp32 softmax while the loss runs: the output layer's logits in the activation
    type, wsbV/t (the .float() copy is the same tensor in fp32, so nothing in fp32 training); the
    backward's cast of the gradient back to the activation type holds as much. Nothing under TE's fused
    cross entropy, whose kept logits are those."""
    if word >= FP32_BYTES or fusion == "te":
        return 0.0
    return word * model.seq_length * samples * model.vocab_size / strategy.tp


def tied_embedding_grad_bytes(model: ModelSpec, strategy: LayerStrategy, word: int) -> float:
    """With tied weights on one stage, the output layer's weight gradient (word x V x h / t) waits in
    autograd's input buffer of the shared weight until the embedding's backward adds its own."""
    return word * model.vocab_size * model.hidden_size / strategy.tp


def in_flight_micro_batches(stage: int, pipeline_parallel: int, num_micro_batches: int,
                            virtual_stages: int, schedule: str) -> float:
    """Micro-batches whose activations stage `stage` holds at its peak, in units of
    the whole stage's activations.

    1F1B holds p - s (Narayanan et al. SC21, Sec. 2.2.1); GPipe holds all m. The
    interleaved schedule warms up (p - s - 1) * 2 + (v - 1) * p chunk-micro-batches
    before its first backward (Megatron-Core schedules.py), each 1/v of the stage.
    The combined 1F1B schedule of --overlap-moe-expert-parallel-comm holds one layer
    more (cost.estimate.merged_step_extra_bytes).
    """
    if schedule == "gpipe":
        return float(num_micro_batches)
    chunks = warmup_chunk_forwards(pipeline_parallel, virtual_stages, stage) + 1
    return min(chunks, num_micro_batches * virtual_stages) / virtual_stages
