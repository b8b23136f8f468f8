"""Multi-token prediction in the model spec: the module's parameters, DeepSeek-V3's published counts, files."""
from __future__ import annotations

import json

import pytest

from megatron_auto import serde
from megatron_auto.errors import UserError
from megatron_auto.specs import load_model
from megatron_auto.specs.model import ModelSpec, model_from_dict
from megatron_auto.specs.presets import MODEL_PRESETS

TINY = {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "seq_length": 32, "vocab_size": 128,
        "normalization": "RMSNorm", "swiglu": True, "ffn_hidden_size": 96, "add_bias_linear": False,
        "position_embedding_type": "rope", "untie_embeddings_and_output_weights": True}


def test_an_mtp_module_is_a_layer_a_2h_projection_and_three_norms():
    plain = model_from_dict(TINY)
    deep = model_from_dict({**TINY, "mtp_num_layers": 2})
    h = 64
    layer = 4 * h * h + 3 * h * 96 + 2 * h  # q, k, v, proj; SwiGLU; two RMSNorms
    assert plain.layers[-1].num_parameters == layer
    assert deep.mtp_module_parameters == layer + 2 * h * h + 3 * h
    assert deep.num_parameters - plain.num_parameters == 2 * deep.mtp_module_parameters


def test_deepseek_v3_is_671b_plus_its_14b_mtp_module():
    """DeepSeek-AI 2024 (arXiv 2412.19437) and the Hugging Face release: 685B = 671B main model + 14B MTP module,
    where the release stores the module with its own copy of the embedding and the output head."""
    model = MODEL_PRESETS["deepseek-v3"]
    assert model.mtp_num_layers == 1 and model.mtp_layer.moe is not None
    main = model.num_parameters - model.mtp_module_parameters
    assert main == pytest.approx(671e9, rel=0.005)
    released_module = model.mtp_module_parameters + 2 * model.vocab_size * model.hidden_size
    assert released_module == pytest.approx(14e9, rel=0.05)
    assert main + released_module == pytest.approx(685e9, rel=0.005)


def test_mtp_fields_round_trip_the_rich_form(tmp_path):
    model = model_from_dict({**TINY, "mtp_num_layers": 1, "mtp_loss_scaling_factor": 0.3}, "tiny-mtp")
    path = tmp_path / "model.json"
    path.write_text(json.dumps(serde.to_dict(model)))
    again = load_model(str(path))
    assert (again.mtp_num_layers, again.mtp_loss_scaling_factor) == (1, 0.3)
    assert again.num_parameters == model.num_parameters


@pytest.mark.parametrize("key, value, words", [
    ("mtp_num_layers", -1, "must not be negative"),
    ("mtp_num_layers", 1.5, "expected int"),
    ("mtp_num_layers", True, "expected int"),
    ("mtp_loss_scaling_factor", -0.1, "must not be negative"),
    ("mtp_loss_scaling_factor", "0.1", "expected float"),
])
def test_bad_mtp_values_are_one_clear_error(key, value, words):
    with pytest.raises(UserError, match=words):
        model_from_dict({**TINY, key: value}, "m")


def test_the_record_checks_its_mtp_fields():
    model = model_from_dict(TINY)
    with pytest.raises(ValueError, match="non-negative integer"):
        ModelSpec(name="m", layers=model.layers, seq_length=32, vocab_size=128, mtp_num_layers=-1)
    with pytest.raises(ValueError, match="finite non-negative"):
        ModelSpec(name="m", layers=model.layers, seq_length=32, vocab_size=128, mtp_loss_scaling_factor=float("inf"))


def test_mtp_needs_rope_or_no_positions_as_megatron_lm_asserts():
    with pytest.raises(UserError, match="learned_absolute"):
        model_from_dict({**TINY, "position_embedding_type": "learned_absolute", "mtp_num_layers": 1}, "m")


def test_zero_depths_is_no_mtp():
    assert model_from_dict({**TINY, "mtp_num_layers": 0}) == model_from_dict(TINY)
    assert ModelSpec.__dataclass_fields__["mtp_num_layers"].default == 0
