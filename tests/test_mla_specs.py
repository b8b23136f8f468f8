"""Multi-latent attention in the model spec: shapes, parameter counts, files and the TP constraint."""
from __future__ import annotations

import json

import pytest

from megatron_auto import serde
from megatron_auto.errors import UserError
from megatron_auto.specs import load_model
from megatron_auto.specs.model import LayerSpec, MLASpec, ModelSpec, model_from_dict
from megatron_auto.specs.presets import MODEL_PRESETS


def mla_attention_parameters(h: int, a: int, q_lora, kv_lora: int, dk: int, dr: int, dv: int) -> int:
    """Counted by hand from MLASelfAttention's modules (megatron/core/transformer/multi_latent_attention.py)
    with --qk-layernorm's RMSNorm latent norms: query, key/value down and up projections, output projection."""
    query = h * a * (dk + dr) if q_lora is None else h * q_lora + q_lora + q_lora * a * (dk + dr)
    return query + h * (kv_lora + dr) + kv_lora + kv_lora * a * (dk + dv) + a * dv * h


def swiglu(h: int, f: int) -> int:
    return 3 * h * f


def test_deepseek_v2_lite_counts_its_config_and_the_published_15_7b():
    h, vocab, layers = 2048, 102400, 27
    attention = mla_attention_parameters(h, 16, None, 512, 128, 64, 128)
    moe = 64 * swiglu(h, 1408) + swiglu(h, 2816) + 64 * h  # experts, the two shared as one MLP, router
    expected = (layers * (attention + 2 * h) + swiglu(h, 10944) + (layers - 1) * moe
                + 2 * vocab * h + h)  # untied embedding and head, final norm
    model = MODEL_PRESETS["deepseek-v2-lite"]
    assert model.num_parameters == expected
    assert model.num_parameters == pytest.approx(15.7e9, rel=0.005)


def test_deepseek_v3_counts_the_published_671b():
    """671B is the main model; the preset also carries V3's multi-token-prediction module (tests/test_mtp_specs.py)."""
    model = MODEL_PRESETS["deepseek-v3"]
    h = 7168
    attention = mla_attention_parameters(h, 128, 1536, 512, 128, 64, 128)
    assert model.layers[0].num_parameters == attention + 2 * h + swiglu(h, 18432)
    assert model.num_parameters - model.mtp_module_parameters == pytest.approx(671e9, rel=0.005)


def test_mla_widths_replace_the_head_width():
    layer = MODEL_PRESETS["deepseek-v3"].layers[0]
    assert (layer.query_head_width, layer.value_head_width, layer.attention_width) == (192, 128, 128 * 128)
    assert not layer.has_qkv_bias
    plain = MODEL_PRESETS["llama2-7b"].layers[0]
    assert (plain.query_head_width, plain.value_head_width, plain.attention_width) == (128, 128, 4096)


def test_tp_must_divide_heads_and_latents():
    layer = MODEL_PRESETS["tiny-mla"].layers[0]  # 4 heads, q latent 24, kv latent 32 + 8
    assert layer.tensor_parallel_error(4) is None
    odd = LayerSpec(hidden_size=64, num_attention_heads=4, num_query_groups=4, ffn_hidden_size=128,
                    mla=MLASpec(kv_lora_rank=30, qk_pos_emb_head_dim=8, q_lora_rank=24))
    assert odd.tensor_parallel_error(2) is None  # 24 and 38 split in two
    assert "latent widths (24, 38)" in odd.tensor_parallel_error(4)
    assert "attention heads" in layer.tensor_parallel_error(8)


@pytest.mark.parametrize("kwargs, message", [
    (dict(num_query_groups=2), "no query groups"),
    (dict(add_qkv_bias=True), "no bias"),
])
def test_mla_layer_refuses_what_megatron_refuses(kwargs, message):
    base = dict(hidden_size=64, num_attention_heads=4, num_query_groups=4, ffn_hidden_size=128, mla=MLASpec())
    with pytest.raises(ValueError, match=message):
        LayerSpec(**{**base, **kwargs})


def test_compact_file_takes_megatrons_mla_flags(tmp_path):
    data = dict(num_layers=2, hidden_size=64, num_attention_heads=4, seq_length=32, vocab_size=128,
                multi_latent_attention=True, kv_lora_rank=16, q_lora_rank=8, v_head_dim=24)
    path = tmp_path / "m.json"
    path.write_text(json.dumps(data))
    layer = load_model(str(path)).layers[0]
    # Megatron-LM's defaults for the flags not given: qk_head_dim 128, qk_pos_emb_head_dim 64.
    assert layer.mla == MLASpec(kv_lora_rank=16, q_lora_rank=8, v_head_dim=24)
    plain = model_from_dict({k: v for k, v in data.items() if k not in ("kv_lora_rank", "q_lora_rank", "v_head_dim")})
    assert plain.layers[0].mla == MLASpec()


def test_compact_mla_shape_without_the_switch_is_refused():
    with pytest.raises(UserError, match="kv_lora_rank need multi_latent_attention"):
        model_from_dict(dict(num_layers=2, hidden_size=64, num_attention_heads=4, seq_length=32, vocab_size=128,
                             kv_lora_rank=16))


@pytest.mark.parametrize("name", ["deepseek-v2-lite", "deepseek-v3", "tiny-mla"])
def test_mla_presets_round_trip_through_the_rich_form(name):
    model = MODEL_PRESETS[name]
    assert serde.from_dict(ModelSpec, json.loads(json.dumps(serde.to_dict(model)))) == model
