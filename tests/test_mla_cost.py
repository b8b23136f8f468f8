"""Multi-latent attention's cost terms against values computed by hand from Megatron-Core 0.16.1's
MLASelfAttention (megatron/core/transformer/multi_latent_attention.py) and Megatron-LM's FLOP count
(megatron/training/training.py, num_floating_point_operations, multi_latent_attention branch)."""
from __future__ import annotations

from dataclasses import replace

import pytest

from megatron_auto.cost.collectives import all_gather_time, all_reduce_time, reduce_scatter_time
from megatron_auto.cost.communication import tp_comm_time
from megatron_auto.cost.flops import CORE, MLA_UP, MLP, layer_gemms
from megatron_auto.cost.layer_cost import layer_cost
from megatron_auto.cost.layer_kernels import attention_core_times
from megatron_auto.cost.memory import layer_activation_bytes
from megatron_auto.cost.compute import mla_up_projection_seconds
from megatron_auto.cost.mla import mla_latent_bytes
from megatron_auto.cost.mla_comm import mla_tp_comm_time
from megatron_auto.plan import LayerStrategy, context_parallel_problem
from megatron_auto.search.constraints import SearchConstraints
from megatron_auto.search.megatron_space import SpaceStats, context_parallel_choices
from megatron_auto.specs.model import MLASpec, uniform_model
from megatron_auto.specs.presets import CLUSTER_PRESETS, MODEL_PRESETS
from megatron_auto.specs.training import TrainingSpec, recompute_modules_problem

H100 = CLUSTER_PRESETS["dgx-h100-80gb"]
# A DeepSeek-V3-like layer at a small width: h 1024, 8 heads, q latent 384, kv latent 256, d_k 64, d_r 32, d_v 64.
H, A, QL, KL, DK, DR, DV = 1024, 8, 384, 256, 64, 32, 64
S, B = 1024, 2
MLA = MLASpec(kv_lora_rank=KL, qk_head_dim=DK, qk_pos_emb_head_dim=DR, v_head_dim=DV, q_lora_rank=QL)
MODEL = uniform_model("toy-mla", 2, H, A, S, 32000, ffn_hidden_size=2816, swiglu=True, normalization="RMSNorm",
                      add_bias_linear=False, position_embedding_type="rope", qk_layernorm=True, mla=MLA)
LAYER = MODEL.layers[0]


def megatron_lm_attention_flops_per_token(q_lora, seq):
    """Megatron-LM's forward MLA terms per token (2 x its bracket), without the latent norms' '+ 1' and with
    the whole s x s core (SC21's convention, which this cost model keeps) instead of its causal half."""
    q_term = H * A * (DK + DR) if q_lora is None else q_lora * (H + A * (DK + DR))
    projections = q_term + KL * (H + A * (DK + DV)) + H * DR + A * DV * H
    core = seq * A * (DK + DR) + seq * A * DV
    return 2 * projections, 2 * core


@pytest.mark.parametrize("q_lora", [QL, None])
def test_gemms_count_megatron_lms_mla_flops(q_lora):
    layer = replace(LAYER, mla=replace(MLA, q_lora_rank=q_lora))
    gemms = layer_gemms(layer, S, B, tp=1)
    projections, core = megatron_lm_attention_flops_per_token(q_lora, S)
    assert sum(g.flops for g in gemms if g.role in ("", MLA_UP)) == pytest.approx(S * B * projections, rel=1e-12)
    assert sum(g.flops for g in gemms if g.role == MLA_UP) == pytest.approx(
        2 * S * B * (q_lora or H) * A * (DK + DR) + 2 * S * B * KL * A * (DK + DV), rel=1e-12)
    assert sum(g.flops for g in gemms if g.role == CORE) == pytest.approx(S * B * core, rel=1e-12)
    assert sum(g.flops for g in gemms if g.role == MLP) == pytest.approx(S * B * 2 * 3 * H * 2816, rel=1e-12)
    assert sum(g.flops for g in layer_gemms(layer, S, B, tp=4)) == pytest.approx(
        sum(g.flops for g in gemms) / 4, rel=1e-12)


def test_flash_core_scales_with_query_and_value_widths():
    forward, _ = attention_core_times(LAYER, S, B, 1, H100, 2, "flash")
    # Causal flash: half of 2 s^2 (d_q + d_v) per head, at flash_fraction of peak.
    flops = 0.5 * 2 * B * A * S * S * (DK + DR + DV)
    assert forward == pytest.approx(flops / (H100.gpu.peak_flops * H100.compute.flash_fraction), rel=1e-12)


@pytest.mark.parametrize("sp", [False, True])
def test_tp_collectives_beyond_self_attentions(sp):
    t, word = 4, 2
    link = H100.intra_node

    def size(width):
        return S * B * width * word

    if sp:
        forward = (all_gather_time(size(QL), t, link) + all_gather_time(size(KL + DR), t, link)
                   + all_gather_time(size(H), t, link) + all_gather_time(size(QL), t, link)
                   + all_gather_time(size(KL), t, link))
        backward = (reduce_scatter_time(size(H), t, link) + sum(
            reduce_scatter_time(size(w), t, link) + all_gather_time(size(w), t, link) for w in (QL, KL)))
        # H100's grad_overlap is 1: the weight-gradient regathers are hidden.
    else:
        forward = all_gather_time(size(QL), t, link) + all_gather_time(size(KL + DR), t, link)
        backward = sum(all_reduce_time(size(w), t, link) for w in (H, QL, KL))
    backward += all_reduce_time(size(DR), t, link)  # the shared RoPE key's gradient (patches/mla_tensor_parallel.py)
    strategy = LayerStrategy(tp=t, dp=1, sp=sp)
    assert mla_tp_comm_time(LAYER, S, B, strategy, H100, word) == pytest.approx(forward + backward, rel=1e-12)
    full = replace(strategy, recompute="full")
    assert mla_tp_comm_time(LAYER, S, B, full, H100, word) == pytest.approx(2 * forward + backward, rel=1e-12)
    cost = layer_cost(LAYER, strategy, B, S, H100, TrainingSpec(global_batch_size=8))
    assert cost.tp_comm_s == pytest.approx(tp_comm_time(H, S, B, strategy, H100, word) + forward + backward,
                                           rel=1e-12)
    assert mla_tp_comm_time(LAYER, S, B, LayerStrategy(tp=1, dp=4), H100, word) == 0.0


def test_kept_bytes_count_the_new_qkv_and_the_latents():
    word, t = 2, 4
    base = layer_activation_bytes(LAYER, S, B, LayerStrategy(tp=t, dp=1, sp=True), word, 1, "flash", frozenset())
    wider = replace(LAYER, mla=replace(MLA, v_head_dim=DV + 16))
    # The value and the attention output (the output projection's input) each grow by a x 16 channels.
    grown = layer_activation_bytes(wider, S, B, LayerStrategy(tp=t, dp=1, sp=True), word, 1, "flash", frozenset())
    assert grown - base == pytest.approx(word * S * B * 2 * A * 16 / t, rel=1e-12)
    # Latents: q (norm input and output), kv (a scattered copy under SP, else the whole gathered
    # kv_lora + d_r output) and the kv norm's output, plus one fp32 rstd per latent norm and token; under SP
    # the q norm's input is a view of the whole gathered q latent.
    without_sp = S * B * (word * (2 * QL + KL + DR + KL) + 2 * 4)
    assert mla_latent_bytes(LAYER, S, B, word, t, sp=False) == without_sp
    assert mla_latent_bytes(LAYER, S, B, word, t, sp=True) == S * B * (word * QL + (word * (QL + 2 * KL) + 2 * 4) / t)
    assert mla_latent_bytes(MODEL_PRESETS["llama2-7b"].layers[0], S, B, word, t, sp=False) == 0.0


def test_context_parallelism_is_not_offered_for_mla():
    assert "multi-latent attention is not priced" in context_parallel_problem(2, MODEL)
    long = replace(MODEL, seq_length=16384)
    choices = context_parallel_choices(long, H100, TrainingSpec(global_batch_size=64), SearchConstraints(), 1, 1,
                                       SpaceStats())
    assert choices == [1]
    with pytest.raises(ValueError, match="multi-latent attention"):
        layer_cost(LAYER, LayerStrategy(tp=1, cp=2, dp=4), B, S, H100, TrainingSpec(global_batch_size=8))


def test_mla_up_proj_recompute_trades_qkv_for_a_replay():
    word, t = 2, 4
    sp = LayerStrategy(tp=t, dp=1, sp=True, recompute="selective")
    training = TrainingSpec(global_batch_size=8, recompute_modules=("mla_up_proj",))
    plain = layer_cost(LAYER, replace(sp, recompute="none"), B, S, H100, training)
    up = layer_cost(LAYER, sp, B, S, H100, training)
    # Freed: the new Q, K, V (/t) and the RoPE tables; kept instead: the whole gathered kv latent the
    # checkpoint's k_pos_emb input views (SP only).
    qkv = word * S * B * (2 * A * (DK + DR) + A * DV) / t
    rope = 4 * S * DR * word - 4 * S * DR  # the checkpoint keeps the fp32 angle table instead
    gathered = word * S * B * (KL + DR)
    assert plain.activation_bytes - up.activation_bytes == pytest.approx(qkv + rope - gathered, rel=1e-12)
    replay = mla_up_projection_seconds(LAYER, S, B, t, H100, word)
    assert plain.recompute_s == 0.0 and replay > 0
    assert up.recompute_s == pytest.approx(replay, rel=1e-9)
    link = H100.intra_node
    replayed = all_gather_time(S * B * QL * word, t, link) + all_gather_time(S * B * KL * word, t, link)
    assert up.tp_comm_s - plain.tp_comm_s == pytest.approx(replayed, rel=1e-12)


def test_mla_up_proj_needs_mla_layers():
    llama = MODEL_PRESETS["llama2-7b"]
    assert "needs --multi-latent-attention" in recompute_modules_problem(llama.layers, ("mla_up_proj",))
    assert recompute_modules_problem(MODEL.layers, ("mla_up_proj",)) is None
    training = TrainingSpec(global_batch_size=8, recompute_modules=("core_attn", "mla_up_proj"))
    assert training.selective_modules(llama.layers[0]) == {"core_attn"}
    assert training.selective_modules(LAYER) == {"core_attn", "mla_up_proj"}
