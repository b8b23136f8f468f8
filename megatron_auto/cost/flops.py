"""FLOP counts of a decoder layer, split into the GEMMs that run on one TP shard.

Counts follow Narayanan et al. SC21 (arXiv 2104.04473), Sec. 5.1: a GEMM of
(m x k) @ (k x n) costs 2mkn FLOPs; a GPT layer's forward pass costs
24bsh^2 + 4bs^2h. GQA and SwiGLU generalise the QKV and MLP shapes; a head width d other than
h/a (--kv-channels) makes Q, the scores' inner dimension and the output projection's input a*d
wide, as Megatron-Core's SelfAttention builds them (megatron/core/transformer/attention.py:
query_projection_size = kv_channels * num_attention_heads, linear_proj maps it to h). Multi-latent
attention replaces the QKV projection by its down and up projections (input_projection_gemms) and
gives the scores d_q = qk_head_dim + qk_pos_emb_head_dim channels and the values d_v = v_head_dim.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from ..specs.model import LayerSpec, ModelSpec


CORE = "core"
"""Role of the attention core's two batched GEMMs (what selective recompute of core_attn re-runs)."""
MLP = "mlp"
"""Role of fc1 and fc2 (what selective recompute of the mlp re-runs)."""
MLA_UP = "mla_up"
"""Role of multi-latent attention's query and key/value up projections (what mla_up_proj recompute re-runs)."""


@dataclass(frozen=True)
class Gemm:
    """One matrix product of the forward pass on one shard: batch x (m x k) @ (k x n); `role` names the
    layer part it belongs to (CORE, MLP, MLA_UP, or "" for the other projections)."""

    m: int
    k: int
    n: int
    batch: int = 1
    role: str = ""

    @property
    def flops(self) -> float:
        return 2.0 * self.batch * self.m * self.k * self.n


def layer_gemms(layer: LayerSpec, tokens_per_sample: int, samples: int, tp: int) -> tuple[Gemm, ...]:
    """The forward GEMMs of one layer on one of `tp` shards, for `samples` sequences: the projections in
    front of the core, Q @ K^T and softmax(QK^T) @ V per head, the output projection, then the MLP."""
    s, h = tokens_per_sample, layer.hidden_size
    tokens = samples * s
    heads_per_shard = samples * layer.num_attention_heads // tp
    ffn = layer.dense_ffn_hidden_size  # a MoE layer's shared expert (cost/moe.py prices the routed ones)
    mlp_in_width = ffn * (2 if layer.swiglu else 1)
    attention = (
        *input_projection_gemms(layer, tokens, tp),
        Gemm(s, layer.query_head_width, s, batch=heads_per_shard, role=CORE),  # Q @ K^T per head
        Gemm(s, s, layer.value_head_width, batch=heads_per_shard, role=CORE),  # softmax(QK^T) @ V per head
        Gemm(tokens, layer.attention_width // tp, h),   # output projection (row parallel), a*d_v -> h
    )
    if ffn == 0:
        return attention
    return attention + (
        Gemm(tokens, h, mlp_in_width // tp, role=MLP),  # fc1 (and gate for SwiGLU)
        Gemm(tokens, ffn // tp, h, role=MLP),           # fc2
    )


def input_projection_gemms(layer: LayerSpec, tokens: int, tp: int) -> tuple[Gemm, ...]:
    """What makes Q, K and V on one shard, all column-parallel: the fused QKV projection h -> (a + 2g)d, or
    MLA's (MLASelfAttention in Megatron-Core's local spec, which splits the down projections over TP too
    and all-gathers their outputs): the query's h -> a d_q (or h -> q_lora, q_lora -> a d_q), the key/value
    latent's h -> kv_lora + d_r and its up projection kv_lora -> a (d_k + d_v)."""
    h, heads, mla = layer.hidden_size, layer.num_attention_heads, layer.mla
    if mla is None:
        qkv_width = (heads + 2 * layer.num_query_groups) * layer.kv_channels
        return (Gemm(tokens, h, qkv_width // tp),)
    query_width = heads * mla.query_head_width // tp
    if mla.q_lora_rank is None:
        query: tuple[Gemm, ...] = (Gemm(tokens, h, query_width, role=MLA_UP),)
    else:
        query = (Gemm(tokens, h, mla.q_lora_rank // tp), Gemm(tokens, mla.q_lora_rank, query_width, role=MLA_UP))
    return query + (Gemm(tokens, h, (mla.kv_lora_rank + mla.qk_pos_emb_head_dim) // tp),
                    Gemm(tokens, mla.kv_lora_rank, heads * (mla.qk_head_dim + mla.v_head_dim) // tp, role=MLA_UP))


def layer_forward_flops(layer: LayerSpec, tokens_per_sample: int, samples: int = 1) -> float:
    """Forward FLOPs of one whole (unsharded) layer; 24bsh^2 + 4bs^2h for GPT; a MoE layer adds its
    router and the top-k experts each token passes (moe_forward_flops)."""
    dense = sum(g.flops for g in layer_gemms(layer, tokens_per_sample, samples, tp=1))
    return dense + moe_forward_flops(layer, tokens_per_sample * samples)


def moe_forward_flops(layer: LayerSpec, tokens: int) -> float:
    """Router (2 T h E) plus k expert MLPs per token (2 T k (h f_in + f h), f_in = 2f with SwiGLU): the
    activated FLOPs of Fedus et al. 2021 (Switch, arXiv 2101.03961) and Jiang et al. 2024 (Mixtral's 13B
    active parameters per token); 0 for a dense layer."""
    if layer.moe is None:
        return 0.0
    h, f, moe = layer.hidden_size, layer.moe.expert_ffn_hidden_size, layer.moe
    expert = h * f * (2 if layer.swiglu else 1) + f * h
    return 2.0 * tokens * (h * moe.num_experts + moe.router_topk * expert)


def logits_forward_flops(model: ModelSpec, samples: int = 1) -> float:
    """Forward FLOPs of the LM head: 2bshV (SC21 Sec. 5.1)."""
    return 2.0 * samples * model.seq_length * model.hidden_size * model.vocab_size


@lru_cache(maxsize=1024)
def model_flops_per_iteration(model: ModelSpec, global_batch_size: int) -> float:
    """Model FLOPs of one iteration, forward plus backward (3x forward), without recompute.

    For GPT this equals 72Bslh^2(1 + s/6h + V/12lh), SC21 eq. (3) less the recompute pass. Each
    multi-token prediction depth adds its layer, its 2h -> h projection and one more pass through the
    output layer, as Megatron-LM's num_floating_point_operations counts them (less its norms' 3h).
    """
    layers = sum(layer_forward_flops(l, model.seq_length, global_batch_size) for l in model.layers)
    logits = logits_forward_flops(model, global_batch_size)
    tokens, h = model.seq_length * global_batch_size, model.hidden_size
    mtp_depth = (layer_forward_flops(model.mtp_layer, model.seq_length, global_batch_size)
                 + 2 * tokens * 2 * h * h + logits)
    return 3.0 * (layers + logits + model.mtp_num_layers * mtp_depth)
