"""What Transformer Engine's core attention keeps of Q, K and V (cost.memory.qkv_kept_width, te_copies): its
get_qkv_layout hands the kernel Q, K and V in a layout it knows, else contiguous copies, so under TE's spec the
un-recomputed core keeps q + 2 g d per token where the local spec's core keeps the mixed QKV tensor besides."""
from __future__ import annotations

from dataclasses import replace

import pytest

from megatron_auto.cost.layer_cost import layer_cost
from megatron_auto.cost.memory import layer_activation_bytes, qkv_kept_width
from megatron_auto.plan import LayerStrategy
from megatron_auto.specs.loaders import load_cluster
from megatron_auto.specs.presets import MODEL_PRESETS
from megatron_auto.specs.training import TrainingSpec

LLAMA3 = MODEL_PRESETS["llama3-70b"].layers[0]  # GQA (64 heads, 8 groups), RoPE
LLAMA2 = MODEL_PRESETS["llama2-7b"].layers[0]  # MHA, RoPE
GPT3 = MODEL_PRESETS["gpt3-175b"].layers[0]  # MHA, learned positions
H100 = load_cluster("dgx-h100-80gb", 1)


def _widths(layer):
    q = layer.num_attention_heads * layer.kv_channels
    return q, layer.num_query_groups * layer.kv_channels


@pytest.mark.parametrize("layer", [LLAMA3, LLAMA2, GPT3], ids=["gqa-rope", "mha-rope", "mha-learned"])
def test_te_keeps_q_k_and_v_alone(layer):
    q, kv = _widths(layer)
    assert qkv_kept_width(layer, True, te_copies=True) == q + 2 * kv


def test_rope_makes_the_local_core_keep_the_mixed_tensor_that_te_frees():
    q, kv = _widths(LLAMA2)
    # local: RoPE's new Q and K, and the mixed tensor through V's view; TE copies V and frees the mixed one
    assert qkv_kept_width(LLAMA2, True) - qkv_kept_width(LLAMA2, True, te_copies=True) == q + kv
    q, kv = _widths(GPT3)
    assert qkv_kept_width(GPT3, True) == qkv_kept_width(GPT3, True, te_copies=True) == q + 2 * kv  # sbh3d


def test_q_k_norms_keep_their_inputs_under_te_and_te_adds_v_s_copy():
    normed = replace(LLAMA3, qk_layernorm=True)
    q, kv = _widths(normed)
    assert qkv_kept_width(normed, True, te_copies=True) == qkv_kept_width(normed, True) + kv


def test_only_an_un_recomputed_flash_core_under_te_keeps_the_copies():
    strategy = LayerStrategy(tp=8, dp=1, sp=True)
    q, kv = _widths(LLAMA3)
    local = layer_activation_bytes(LLAMA3, 4096, 1, strategy, 2, 0, "flash", frozenset())
    te = layer_activation_bytes(LLAMA3, 4096, 1, strategy, 2, 0, "flash", frozenset(), te_core=True)
    assert local - te == pytest.approx(2 * 4096 * (q + kv) / 8)
    # selective recompute of the core: its checkpoint keeps the inputs as given, whatever runs inside
    recomputed = replace(strategy, recompute="selective")
    assert (layer_activation_bytes(LLAMA3, 4096, 1, recomputed, 2, 0, "flash", te_core=True)
            == layer_activation_bytes(LLAMA3, 4096, 1, recomputed, 2, 0, "flash"))
    assert (layer_activation_bytes(LLAMA3, 4096, 1, strategy, 2, 0, "unfused", frozenset(), te_core=True)
            == layer_activation_bytes(LLAMA3, 4096, 1, strategy, 2, 0, "unfused", frozenset()))


def test_the_layer_cost_prices_te_s_core_under_te_s_spec():
    strategy = LayerStrategy(tp=8, dp=1, sp=True)
    local = layer_cost(LLAMA3, strategy, 1, 4096, H100, TrainingSpec(global_batch_size=8))
    te = layer_cost(LLAMA3, strategy, 1, 4096, H100, TrainingSpec(global_batch_size=8, fused_norms=True))
    q, kv = _widths(LLAMA3)
    assert local.activation_bytes - te.activation_bytes == pytest.approx(2 * 4096 * (q + kv) / 8)
