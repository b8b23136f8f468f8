"""What multi-latent attention (DeepSeek-V2, arXiv 2405.04434) adds to a layer's price beyond its GEMMs
(cost/flops.py input_projection_gemms): element-wise copies and kept bytes (its tensor-parallel
collectives: cost/mla_comm.py).

The layer is Megatron-Core 0.16.1's MLASelfAttention on the local spec (megatron/core/transformer/
multi_latent_attention.py): its down projections are column-parallel linears whose outputs are
all-gathered over TP (and scattered back to sequence shards under SP), and its up projections are
column-parallel linears over those latents.
"""
from __future__ import annotations

from ..specs.model import LayerSpec


def mla_elementwise_widths(layer: LayerSpec, tp: int, sp: bool) -> tuple[float, float]:
    """(forward, backward) elements per token that multi-latent attention copies besides its GEMMs, on one
    shard (0, 0 for other layers). MLASelfAttention (megatron-core 0.16.1, get_query_key_value_tensors)
    concatenates each head's query and key from their position-free and rotated parts (read and write
    a d_q each), copies the value out of the up projection's output (.contiguous(), 2 a d_v) and the context
    is permuted as in SelfAttention (2 a d_v); with --qk-layernorm its latent
    norms read and write q_lora and kv_lora channels (3x in backward, as the layer's norms), whole on
    every TP rank unless SP scatters the latents. Backward moves the same copies' gradients."""
    if layer.mla is None:
        return 0.0, 0.0
    heads = layer.num_attention_heads / tp
    copies = heads * (4 * layer.query_head_width + 4 * layer.value_head_width)
    norms = sum(layer.mla.latent_norm_widths()) / (tp if sp else 1) if layer.qk_layernorm else 0.0
    return copies + 2 * norms, copies + 3 * norms


FP32_BYTES = 4


def mla_qkv_kept_width(layer: LayerSpec, up_recomputed: bool = False) -> int:
    """Per token, before the TP split, what the attention core keeps of Q, K and V: MLASelfAttention
    concatenates each head's query and key (a d_q each) and makes the value contiguous (a d_v), so any core
    (SDPA or DotProductAttention, which has no query groups to expand here) keeps those three new tensors;
    none under selective recompute of mla_up_proj, whose CheckpointWithoutOutput frees them once the core
    has run and rebuilds them in backward."""
    if up_recomputed:
        return 0
    heads = layer.num_attention_heads
    return 2 * heads * layer.query_head_width + heads * layer.value_head_width


def mla_latent_bytes(layer: LayerSpec, seq: int, samples: int, word: int, tp: int, sp: bool,
                     up_recomputed: bool = False) -> float:
    """Bytes of the latents an MLA layer keeps for backward on one GPU (0 for other layers); measured exactly
    in the runtime's layer at TP1 and at TP2 with SP (tests/runtime/test_recompute_modules.py).

    Without SP every TP rank holds whole latents. The query latent (all-gathered, so a new tensor) is kept by
    its norm and the norm's output by the up projection: 2 q_lora (q_lora without --qk-layernorm). The
    key/value latent is a view of the gathered kv_lora + d_r output of the down projection: its norm (or,
    without one, the up projection) keeps that whole tensor alive, plus the norm's output. Under SP each
    latent is scattered back to sequence shards (scatter_to_sequence_parallel_region): the kv latent's
    shard is a copy (a slice of a last-dim split), but the query's is a view of the whole gathered tensor
    (the dim-0 slice is contiguous, so _split_along_first_dim's .contiguous() copies nothing), which stays
    alive whole. The norms keep fp32 statistics (rstd, and mean for LayerNorm). Under selective recompute of
    mla_up_proj the checkpoint keeps its inputs, among them the key's rotated part, a view of the gathered
    kv_lora + d_r tensor: under SP that whole-sequence tensor is kept too."""
    mla = layer.mla
    if mla is None:
        return 0.0
    norms = layer.qk_layernorm
    q_lora, kv_lora, gathered_kv = mla.q_lora_rank or 0, mla.kv_lora_rank, mla.kv_lora_rank + mla.qk_pos_emb_head_dim
    kv_norm_output = kv_lora if norms else 0
    if sp:
        whole = q_lora + (gathered_kv if up_recomputed else 0)
        shards = (q_lora if norms else 0) + kv_lora + kv_norm_output
    else:
        whole = (2 if norms else 1) * q_lora + gathered_kv + kv_norm_output
        shards = 0
    stats = (1 if layer.normalization == "RMSNorm" else 2) * len(mla.latent_norm_widths()) if norms else 0
    split = tp if sp else 1
    return seq * samples * (word * whole + (word * shards + FP32_BYTES * stats) / split)
