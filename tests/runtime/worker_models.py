"""Test-size models the equivalence workers share."""
from __future__ import annotations

from typing import Optional

from megatron_auto.specs.model import MLASpec, ModelSpec, uniform_model


def llama_model(name: str) -> ModelSpec:
    """LLaMA's architecture at test size: GQA (2 groups), SwiGLU, RMSNorm, no linear biases, RoPE, untied head."""
    return uniform_model(name, num_layers=4, hidden_size=64, num_attention_heads=4, seq_length=32, vocab_size=256,
                         num_query_groups=2, ffn_hidden_size=176, swiglu=True, normalization="RMSNorm",
                         add_bias_linear=False, position_embedding_type="rope", rotary_base=500000,
                         untie_embeddings_and_output_weights=True)


def qwen3_model(name: str) -> ModelSpec:
    """Qwen3's attention at test size: heads twice as wide as hidden / heads (--kv-channels), per-head
    q/k RMSNorms (--qk-layernorm), a QKV bias without other biases (--add-qkv-bias, as Qwen2), and
    zero-centred norm weights (--apply-layernorm-1p); GQA, SwiGLU, RoPE, untied head."""
    return uniform_model(name, num_layers=4, hidden_size=64, num_attention_heads=4, seq_length=32, vocab_size=256,
                         num_query_groups=2, ffn_hidden_size=176, swiglu=True, normalization="RMSNorm",
                         add_bias_linear=False, position_embedding_type="rope", rotary_base=1000000,
                         untie_embeddings_and_output_weights=True, kv_channels=32, qk_layernorm=True,
                         add_qkv_bias=True, apply_layernorm_1p=True)


def swiglu_moe_model(name: str) -> ModelSpec:
    """Mixtral's architecture at test size (every layer a MoE of 4 SwiGLU experts, top-2, no biases,
    RMSNorm, GQA, RoPE, untied head) plus a shared expert (Qwen-MoE/DeepSeek style), with the
    load-balancing and z losses on."""
    return uniform_model(name, num_layers=2, hidden_size=32, num_attention_heads=4, seq_length=32, vocab_size=256,
                         num_query_groups=2, ffn_hidden_size=64, swiglu=True, normalization="RMSNorm",
                         add_bias_linear=False, position_embedding_type="rope",
                         untie_embeddings_and_output_weights=True, num_experts=4, moe_router_topk=2,
                         moe_ffn_hidden_size=48, moe_aux_loss_coeff=1e-2, moe_z_loss_coeff=1e-3,
                         moe_shared_expert_intermediate_size=32)


def mixed_moe_model(name: str) -> ModelSpec:
    """GPT layers with biases where every second layer is a MoE (--moe-layer-freq 2: layers 0 and 2) of
    4 GeLU experts with biases, top-2, and the load-balancing loss (megatron-core's shared expert has no biases)."""
    return uniform_model(name, num_layers=4, hidden_size=32, num_attention_heads=4, seq_length=32, vocab_size=256,
                         ffn_hidden_size=64, num_experts=4, moe_router_topk=2, moe_ffn_hidden_size=32,
                         moe_layer_freq=2, moe_aux_loss_coeff=1e-2)


def deepseek_style_moe_model(name: str) -> ModelSpec:
    """DeepSeekMoE's shape at test size: a dense first layer, then three MoE layers of 4 SwiGLU experts
    (top-2, no biases) with a shared expert, RMSNorm, GQA, RoPE, untied head; the sequence-level
    load-balancing loss (--moe-router-load-balancing-type seq_aux_loss, DeepSeek-V3's) and the z-loss."""
    return uniform_model(name, num_layers=4, hidden_size=32, num_attention_heads=4, seq_length=32, vocab_size=256,
                         num_query_groups=2, ffn_hidden_size=64, swiglu=True, normalization="RMSNorm",
                         add_bias_linear=False, position_embedding_type="rope",
                         untie_embeddings_and_output_weights=True, num_experts=4, moe_router_topk=2,
                         moe_ffn_hidden_size=48, moe_layer_freq=[0, 1, 1, 1],
                         moe_router_load_balancing_type="seq_aux_loss", moe_aux_loss_coeff=1e-2,
                         moe_z_loss_coeff=1e-3, moe_shared_expert_intermediate_size=32)


def mla_model(name: str, q_lora_rank: Optional[int] = 24) -> ModelSpec:
    """DeepSeek-V2's attention at test size (multi-latent attention, Megatron-Core's MLASelfAttention): keys and
    values up-projected from a 32-wide latent, queries from a 24-wide one (or, with q_lora_rank None, from the
    hidden state, as DeepSeek-V2-Lite), query/key heads of 16 + 8 rotated channels, values 12 wide (neither the
    query width nor hidden / heads, so a core that mixed them up fails), latent RMSNorms (--qk-layernorm);
    SwiGLU, RMSNorm, no biases, RoPE positions, untied head."""
    return uniform_model(name, num_layers=4, hidden_size=64, num_attention_heads=4, seq_length=32, vocab_size=256,
                         ffn_hidden_size=176, swiglu=True, normalization="RMSNorm", add_bias_linear=False,
                         position_embedding_type="rope", untie_embeddings_and_output_weights=True, qk_layernorm=True,
                         mla=MLASpec(kv_lora_rank=32, qk_head_dim=16, qk_pos_emb_head_dim=8, v_head_dim=12,
                                     q_lora_rank=q_lora_rank))


def mtp_model(name: str, untie: bool = False) -> ModelSpec:
    """DeepSeek-V3's multi-token prediction at test size: one MTP module (--mtp-num-layers 1) after four LLaMA-style
    layers (GQA, SwiGLU, RMSNorm, no biases, RoPE, which MTP needs), its loss weighted 0.3 (V3's first phase), and
    the word embedding tied to the output head unless `untie` (with pipeline parallelism the MTP stage then holds
    its own copy of the embedding beside the first stage's)."""
    return uniform_model(name, num_layers=4, hidden_size=64, num_attention_heads=4, seq_length=32, vocab_size=256,
                         num_query_groups=2, ffn_hidden_size=176, swiglu=True, normalization="RMSNorm",
                         add_bias_linear=False, position_embedding_type="rope", rotary_base=10000,
                         untie_embeddings_and_output_weights=untie, mtp_num_layers=1, mtp_loss_scaling_factor=0.3)
