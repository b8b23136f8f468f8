"""Specs: preset sizes against the published ones, model/cluster JSON in both forms, bad input."""
from __future__ import annotations

import json

import pytest

from megatron_auto import serde
from megatron_auto.errors import UserError
from megatron_auto.specs import ClusterSpec, load_cluster, load_model
from megatron_auto.specs.model import LayerSpec, ModelSpec, model_from_dict, uniform_model
from megatron_auto.specs.presets import CLUSTER_PRESETS, MODEL_PRESETS
from megatron_auto.specs.training import TrainingSpec

# Published sizes in billions: SC21 Table 1 (GPT-3 shapes, one decimal), GPT-3 175B
# (Brown et al.: 174.6B with V=51200), Meta's model cards for LLaMA.
PUBLISHED_BILLIONS = {
    "gpt3-1.7b": 1.7, "gpt3-3.6b": 3.6, "gpt3-7.5b": 7.5, "gpt3-18.4b": 18.4, "gpt3-39.1b": 39.1,
    "gpt3-76.1b": 76.1, "gpt3-145.6b": 145.6, "gpt3-175b": 174.6, "gpt3-310b": 310.1,
    "gpt3-530b": 529.6, "gpt3-1t": 1008.0,
}
LLAMA_BILLIONS = {"llama2-7b": 6.738, "llama2-13b": 13.016, "llama2-70b": 68.977, "llama3-8b": 8.030,
                 "llama3-70b": 70.554, "llama3.1-405b": 405.853}


@pytest.mark.parametrize("name, billions", PUBLISHED_BILLIONS.items())
def test_gpt3_preset_sizes_round_to_sc21_table(name, billions):
    # SC21 prints P = 12lh^2(1 + 13/12h + (V+s)/12lh) to one decimal; e.g. 1.7B is 1.652B.
    params = MODEL_PRESETS[name].num_parameters / 1e9
    assert round(params, 1) == pytest.approx(billions)
    assert params == pytest.approx(billions, rel=0.03)


def test_gpt3_175b_is_174_6_billion_within_one_percent():
    assert MODEL_PRESETS["gpt3-175b"].num_parameters == pytest.approx(174.6e9, rel=0.01)


@pytest.mark.parametrize("name, billions", LLAMA_BILLIONS.items())
def test_llama_preset_sizes_within_one_percent(name, billions):
    assert MODEL_PRESETS[name].num_parameters / 1e9 == pytest.approx(billions, rel=0.01)


def test_gpt_layer_parameters_are_12h2_plus_13h():
    # Megatron GPT layer: QKV 3h^2+3h, proj h^2+h, fc1 4h^2+4h, fc2 4h^2+h, two LayerNorms 4h.
    h = 12288
    layer = MODEL_PRESETS["gpt3-175b"].layers[0]
    assert layer.num_parameters == 12 * h * h + 13 * h


def test_model_parameters_match_sc21_closed_form():
    # SC21 Sec. 5.1: P = 12lh^2 (1 + 13/12h + (V + s)/(12lh)); plus the final LayerNorm (2h).
    l, h, s, v = 96, 12288, 2048, 51200
    closed_form = 12 * l * h * h * (1 + 13 / (12 * h) + (v + s) / (12 * l * h)) + 2 * h
    assert MODEL_PRESETS["gpt3-175b"].num_parameters == pytest.approx(closed_form, rel=1e-12)


def test_swiglu_gqa_layer_parameters():
    # h=64, a=4, g=2 (kv=16), f=176, SwiGLU, with biases and LayerNorm.
    # QKV: 64*(64+2*32) + 128 = 8320; proj: 64*64 + 64 = 4160;
    # fc1 (gate+up): 64*352 + 352 = 22880; fc2: 176*64 + 64 = 11328; norms: 4*64 = 256.
    layer = LayerSpec(64, 4, 2, 176, swiglu=True)
    assert layer.num_parameters == 8320 + 4160 + 22880 + 11328 + 256


def test_llama_layer_has_no_biases_and_rms_norms():
    # tiny-llama: as above without the 128 + 64 + 352 + 64 biases, norms 2*64 (RMSNorm: scale only).
    layer = MODEL_PRESETS["tiny-llama"].layers[0]
    assert layer.num_parameters == (8320 - 128) + (4160 - 64) + (22880 - 352) + (11328 - 64) + 128


def test_llama_presets_match_the_published_parameter_counts():
    # Meta's model cards / Hugging Face configs: exact parameter counts of the released weights.
    assert MODEL_PRESETS["llama2-7b"].num_parameters == 6_738_415_616
    assert MODEL_PRESETS["llama2-70b"].num_parameters == 68_976_648_192
    assert MODEL_PRESETS["llama3-8b"].num_parameters == 8_030_261_248
    assert MODEL_PRESETS["llama3-8b"].rotary_base == 500000
    assert MODEL_PRESETS["llama3-70b"].num_parameters == 70_553_706_496
    assert MODEL_PRESETS["llama3.1-405b"].num_parameters == 405_853_388_800


def test_untied_head_adds_vocab_times_hidden():
    tied = uniform_model("m", 2, 64, 4, 32, 128)
    untied = uniform_model("m", 2, 64, 4, 32, 128, untie_embeddings_and_output_weights=True)
    assert untied.num_parameters - tied.num_parameters == 128 * 64


def _write(tmp_path, name, payload):
    path = tmp_path / name
    path.write_text(payload if isinstance(payload, str) else json.dumps(payload))
    return str(path)


def test_compact_model_json_loads_megatron_names(tmp_path):
    path = _write(tmp_path, "gpt.json", {"num_layers": 96, "hidden_size": 12288, "num_attention_heads": 96,
                                        "seq_length": 2048, "vocab_size": 51200})
    model = load_model(path)
    assert model.num_layers == 96
    assert model.layers[0] == LayerSpec(12288, 96, 96, 4 * 12288, swiglu=False)
    assert model.num_parameters == MODEL_PRESETS["gpt3-175b"].num_parameters
    assert model.name == "gpt"


def test_compact_model_json_optional_keys(tmp_path):
    path = _write(tmp_path, "llama.json", {
        "num_layers": 32, "hidden_size": 4096, "num_attention_heads": 32, "seq_length": 8192,
        "vocab_size": 128256, "ffn_hidden_size": 14336, "num_query_groups": 8, "swiglu": True,
        "untie_embeddings_and_output_weights": True, "normalization": "RMSNorm", "add_bias_linear": False,
        "position_embedding_type": "rope", "rotary_base": 500000, "schema_version": 1})
    assert load_model(path).num_parameters == MODEL_PRESETS["llama3-8b"].num_parameters


def test_rich_model_json_round_trips(tmp_path):
    layers = (LayerSpec(64, 4, 4, 256), LayerSpec(64, 8, 2, 128, swiglu=True))
    model = ModelSpec(name="mixed", layers=layers, seq_length=32, vocab_size=128)
    path = _write(tmp_path, "mixed.json", serde.dumps(model))
    loaded = load_model(path)
    assert loaded == model
    assert serde.dumps(loaded) == serde.dumps(model)


def test_preset_round_trips_through_rich_form():
    model = MODEL_PRESETS["llama2-70b"]
    assert model_from_dict(json.loads(serde.dumps(model))) == model


@pytest.mark.parametrize("payload, message", [
    ({"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "seq_length": 32, "vocab_size": 128,
      "hiden_size": 64}, "unknown key"),
    ({"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "seq_length": 32}, "missing"),
    ({"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "seq_length": 32, "vocab_size": 128,
      "schema_version": 2}, "schema_version"),
    ({"num_layers": "2", "hidden_size": 64, "num_attention_heads": 4, "seq_length": 32, "vocab_size": 128},
     "expected int"),
    ({"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "seq_length": 32, "vocab_size": 128,
      "swiglu": 1}, "expected bool"),
    ({"num_layers": 2, "hidden_size": 65, "num_attention_heads": 4, "seq_length": 32, "vocab_size": 128},
     "not divisible"),
    ({"num_layers": 0, "hidden_size": 64, "num_attention_heads": 4, "seq_length": 32, "vocab_size": 128},
     "at least one layer"),
    ([1, 2, 3], "JSON object"),
])
def test_bad_compact_model_raises_user_error(tmp_path, payload, message):
    with pytest.raises(UserError, match=message):
        load_model(_write(tmp_path, "bad.json", payload))


def test_rich_model_with_wrong_schema_version_or_unknown_key_raises(tmp_path):
    data = json.loads(serde.dumps(MODEL_PRESETS["tiny-gpt"]))
    with pytest.raises(UserError, match="schema_version"):
        load_model(_write(tmp_path, "v2.json", {**data, "schema_version": 2}))
    data["layers"][0]["heads"] = 4
    with pytest.raises(UserError, match="unknown key"):
        load_model(_write(tmp_path, "extra.json", data))


def test_malformed_json_and_missing_file_raise_user_error(tmp_path):
    with pytest.raises(UserError, match="not valid JSON"):
        load_model(_write(tmp_path, "broken.json", '{"num_layers": 2,'))
    with pytest.raises(UserError, match="cannot read"):
        load_model(str(tmp_path / "absent.json"))
    with pytest.raises(UserError, match="unknown model preset"):
        load_model("gpt3-176b")


def test_cluster_json_round_trip(tmp_path):
    cluster = CLUSTER_PRESETS["dgx-h100-80gb"].with_nodes(4)
    path = _write(tmp_path, "h100.json", serde.dumps(cluster))
    loaded = load_cluster(path)
    assert loaded == cluster
    assert serde.dumps(loaded) == serde.dumps(cluster)
    assert load_cluster(path, num_nodes=16).world_size == 128


def test_cluster_preset_and_node_override():
    cluster = load_cluster("dgx-a100-80gb", num_nodes=128)
    assert cluster.world_size == 1024
    assert cluster.gpu.peak_flops == 312e12
    with pytest.raises(UserError, match="positive"):
        load_cluster("dgx-a100-80gb", num_nodes=0)
    with pytest.raises(UserError, match="unknown cluster preset"):
        load_cluster("dgx-b200")


def test_bad_cluster_json_raises_user_error(tmp_path):
    data = json.loads(serde.dumps(CLUSTER_PRESETS["dgx-a100-80gb"]))
    with pytest.raises(UserError, match="schema_version"):
        load_cluster(_write(tmp_path, "v9.json", {**data, "schema_version": 9}))
    with pytest.raises(UserError, match="unknown key"):
        load_cluster(_write(tmp_path, "extra.json", {**data, "nvlink": 1}))
    del data["gpu"]
    with pytest.raises(UserError, match="missing required key 'gpu'"):
        load_cluster(_write(tmp_path, "nogpu.json", data))


def test_link_for_group_uses_span_of_ranks():
    cluster = CLUSTER_PRESETS["dgx-a100-80gb"].with_nodes(2)
    assert cluster.link_for_group(8) is cluster.intra_node           # ranks 0..7
    assert cluster.link_for_group(4, stride=2) is cluster.intra_node  # ranks 0,2,4,6
    assert cluster.link_for_group(2, stride=8) is cluster.inter_node  # ranks 0,8
    assert cluster.link_for_group(16) is cluster.inter_node


def test_training_spec_validation_and_bytes():
    assert TrainingSpec(8).activation_bytes == 2
    assert TrainingSpec.fp32(8).activation_bytes == 4
    with pytest.raises(ValueError):
        TrainingSpec(0)
    with pytest.raises(ValueError):
        TrainingSpec(8, precision="fp4")
    assert TrainingSpec(8, precision="fp8").fp8 and TrainingSpec(8, precision="fp8").activation_bytes == 2
    with pytest.raises(ValueError):
        TrainingSpec(8, fp8_param_gather=True)  # FP8 weights need FP8 training
    with pytest.raises(ValueError):
        TrainingSpec(8, precision="fp8", fp8_recipe="nvfp4")
    assert isinstance(CLUSTER_PRESETS["cpu-gloo"], ClusterSpec)
