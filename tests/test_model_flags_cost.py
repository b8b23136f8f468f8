"""Megatron-LM's model flags in the ModelSpec and the cost terms: --kv-channels, --add-qkv-bias,
--qk-layernorm, --apply-layernorm-1p."""
from __future__ import annotations

import json

import pytest

from megatron_auto import serde
from megatron_auto.cost.flops import layer_forward_flops
from megatron_auto.cost.layer_kernels import elementwise_bytes
from megatron_auto.cost.memory import layer_activation_bytes
from megatron_auto.errors import UserError
from megatron_auto.plan import LayerStrategy
from megatron_auto.specs.model import LayerSpec, ModelSpec, model_from_dict, uniform_model

H, A, G, F, S = 64, 4, 2, 256, 32


def _layer(**fields) -> LayerSpec:
    return LayerSpec(hidden_size=H, num_attention_heads=A, num_query_groups=G, ffn_hidden_size=F, **fields)


def test_kv_channels_defaults_to_hidden_over_heads_and_may_differ():
    assert _layer().kv_channels == H // A
    assert _layer(kv_channels=32).kv_channels == 32
    # Megatron-LM requires heads to divide the width only without --kv-channels.
    assert LayerSpec(hidden_size=60, num_attention_heads=8, num_query_groups=8, ffn_hidden_size=F,
                     kv_channels=16).attention_width == 128
    with pytest.raises(ValueError, match="not divisible"):
        LayerSpec(hidden_size=60, num_attention_heads=8, num_query_groups=8, ffn_hidden_size=F)


def test_forward_flops_use_the_head_width():
    d = 32  # twice H / A
    # SC21's GEMM count with Q, the scores and the projection input a*d wide (Megatron-Core attention.py):
    qkv = 2 * S * H * (A + 2 * G) * d
    scores_and_values = 2 * 2 * S * S * A * d
    projection = 2 * S * (A * d) * H
    mlp = 2 * 2 * S * H * F
    assert layer_forward_flops(_layer(kv_channels=d), S) == qkv + scores_and_values + projection + mlp


def test_parameters_count_the_qkv_bias_and_the_qk_norms():
    d = 32
    base = _layer(kv_channels=d, add_bias_linear=False, normalization="RMSNorm")
    qkv_out = (A + 2 * G) * d
    assert _layer(kv_channels=d, add_bias_linear=False, normalization="RMSNorm",
                  add_qkv_bias=True).num_parameters == base.num_parameters + qkv_out
    # --qk-layernorm: one RMSNorm (weight only) over d channels for queries and one for keys.
    assert _layer(kv_channels=d, add_bias_linear=False, normalization="RMSNorm",
                  qk_layernorm=True).num_parameters == base.num_parameters + 2 * d
    assert _layer(apply_layernorm_1p=True).num_parameters == _layer().num_parameters  # a reparametrisation


def test_activations_grow_with_the_head_width_and_qk_norms():
    strategy = LayerStrategy()
    base = layer_activation_bytes(_layer(), S, 1, strategy, 2)
    wide = layer_activation_bytes(_layer(kv_channels=32), S, 1, strategy, 2)
    # Grouped queries (g = 2 < a = 4) into the unfused core without recompute: it keeps a query copy and K
    # and V expanded to a heads (3ad per token, cost.memory.qkv_kept_width), and the projection input is ad
    # wide: all four double with d (16 -> 32, 2 bytes each); the s x s scores do not change.
    assert wide - base == 4 * S * A * 16 * 2
    normed = layer_activation_bytes(_layer(qk_layernorm=True), S, 1, strategy, 2)
    # The q/k norms keep their inputs (the grouped query's copy, ad, and the mixed QKV output, (a + 2g)d)
    # and their fp32 mean and rstd per head (a + g per token).
    assert normed - base == S * ((A * 16 + (A + 2 * G) * 16) * 2 + 2 * 4 * (A + G))


def test_qkv_bias_alone_adds_its_elementwise_traffic():
    without = elementwise_bytes(_layer(add_bias_linear=False), 1024, 1, False, 2, 1)
    with_qkv = elementwise_bytes(_layer(add_bias_linear=False, add_qkv_bias=True), 1024, 1, False, 2, 1)
    assert with_qkv[0] > without[0] and with_qkv[1] > without[1]


def test_model_flags_round_trip_and_old_files_still_load(tmp_path):
    model = uniform_model("m", 2, H, A, S, 256, num_query_groups=G, kv_channels=32, add_qkv_bias=True,
                          qk_layernorm=True, apply_layernorm_1p=True)
    assert serde.from_dict(ModelSpec, json.loads(serde.dumps(model))) == model
    old = json.loads(serde.dumps(uniform_model("m", 2, H, A, S, 256)))
    for layer in old["layers"]:
        for key in ("kv_channels", "add_qkv_bias", "qk_layernorm", "apply_layernorm_1p"):
            del layer[key]
    assert serde.from_dict(ModelSpec, old).layers[0].kv_channels == H // A
    compact = model_from_dict({"num_layers": 2, "hidden_size": H, "num_attention_heads": A, "seq_length": S,
                               "vocab_size": 256, "kv_channels": 32, "qk_layernorm": True})
    assert compact.layers[0].kv_channels == 32 and compact.layers[0].qk_layernorm
    with pytest.raises(UserError, match="qk_layernorm: expected bool"):
        model_from_dict({"num_layers": 2, "hidden_size": H, "num_attention_heads": A, "seq_length": S,
                         "vocab_size": 256, "qk_layernorm": 1})


def test_rope_models_mark_their_layers_and_old_profiles_still_match():
    """ModelSpec sets LayerSpec.rotary from its position_embedding_type (RoPE's copies of Q and K change what a
    layer keeps); a profile written before the field existed still matches the RoPE layer it measured."""
    from dataclasses import replace

    from megatron_auto.specs.profiles import LayerProfile, ModelProfile

    rope = uniform_model("m", 2, H, A, S, 256, position_embedding_type="rope")
    assert all(layer.rotary for layer in rope.layers)
    assert not any(layer.rotary for layer in uniform_model("m", 2, H, A, S, 256).layers)
    assert serde.from_dict(ModelSpec, json.loads(serde.dumps(rope))) == rope
    old = ModelProfile(name="m", device="cpu", precision="fp32", concurrent_processes=1,
                       layers=(LayerProfile(replace(rope.layers[0], rotary=False), ()),))
    assert old.for_layer(rope.layers[0]) is old.layers[0]
