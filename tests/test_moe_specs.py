"""MoE specs: the presets' parameter counts, Megatron's flag names in model files, moe_layer_pattern,
LayerStrategy's ep/etp and the plan checks, and the JSON round trips."""
from __future__ import annotations

import json

import pytest

from megatron_auto import serde
from megatron_auto.errors import UserError
from megatron_auto.plan import Chunk, LayerStrategy, Plan, check_expert_strategy, load_plan, save_plan
from megatron_auto.specs import load_model
from megatron_auto.specs.model import LayerSpec, ModelSpec, MoESpec, model_from_dict, moe_layer_pattern
from megatron_auto.specs.presets import MODEL_PRESETS
from megatron_auto.specs.training import TrainingSpec


def swiglu_mlp(h: int, f: int) -> int:
    """Gate, up and down projections of a SwiGLU MLP without biases."""
    return 3 * h * f


def test_mixtral_matches_the_hugging_face_parameter_count():
    # Hugging Face's MixtralForCausalLM(config of mistralai/Mixtral-8x7B-v0.1).num_parameters() = 46,702,792,704.
    h, layers, vocab = 4096, 32, 32000
    attention = h * h + 2 * h * 1024 + h * h  # q, k and v of 8 KV heads x 128, o
    layer = attention + 8 * swiglu_mlp(h, 14336) + 8 * h + 2 * h  # experts, router, two RMSNorms
    assert layers * layer + 2 * vocab * h + h == 46_702_792_704
    assert MODEL_PRESETS["mixtral-8x7b"].num_parameters == 46_702_792_704


def test_deepseek_moe_16b_matches_its_config_arithmetic_and_the_published_16_4b():
    # deepseek-ai/deepseek-moe-16b-base config.json; DeepSeekMoE (arXiv 2401.06066) reports 16.4B in total.
    h, vocab = 2048, 102400
    attention = 4 * h * h + 2 * h
    dense = attention + swiglu_mlp(h, 10944)
    moe = attention + 64 * swiglu_mlp(h, 1408) + swiglu_mlp(h, 2 * 1408) + 64 * h
    expected = dense + 27 * moe + 2 * vocab * h + h
    model = MODEL_PRESETS["deepseek-moe-16b"]
    assert model.num_parameters == expected == 16_375_728_128
    assert round(model.num_parameters / 1e9, 1) == 16.4
    assert [layer.is_moe for layer in model.layers] == [False] + [True] * 27


def test_moe_layer_pattern_follows_megatrons_moe_layer_freq():
    assert moe_layer_pattern(1, 4) == (True, True, True, True)
    assert moe_layer_pattern(2, 5) == (True, False, True, False, True)
    assert moe_layer_pattern([0, 1, 1], 3) == (False, True, True)
    for bad in (0, [1, 1], [0, 2, 1], True, "x", 1.5):
        with pytest.raises(ValueError):
            moe_layer_pattern(bad, 3)


def test_compact_model_file_takes_megatrons_moe_names(tmp_path):
    path = tmp_path / "moe.json"
    path.write_text(json.dumps({
        "num_layers": 4, "hidden_size": 64, "num_attention_heads": 4, "seq_length": 32, "vocab_size": 128,
        "ffn_hidden_size": 96, "swiglu": True, "num_experts": 8, "moe_router_topk": 2, "moe_ffn_hidden_size": 32,
        "moe_shared_expert_intermediate_size": 48, "moe_layer_freq": 2, "moe_router_load_balancing_type": "none",
        "moe_aux_loss_coeff": 0.01, "moe_z_loss_coeff": 0}))
    model = load_model(str(path))
    moe = model.layers[0].moe
    assert moe == MoESpec(num_experts=8, router_topk=2, expert_ffn_hidden_size=32, shared_expert_ffn_hidden_size=48,
                          router_load_balancing_type="none", aux_loss_coeff=0.01, z_loss_coeff=0.0)
    assert [layer.is_moe for layer in model.layers] == [True, False, True, False]
    assert model.layers[1].ffn_hidden_size == 96


def test_expert_width_defaults_to_the_layers_ffn():
    model = model_from_dict({"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "seq_length": 32,
                             "vocab_size": 128, "ffn_hidden_size": 80, "num_experts": 4})
    assert model.layers[0].moe.expert_ffn_hidden_size == 80


def test_moe_layer_parameters_count_router_experts_and_shared_expert():
    dense = LayerSpec(hidden_size=64, num_attention_heads=4, num_query_groups=4, ffn_hidden_size=128)
    moe = LayerSpec(hidden_size=64, num_attention_heads=4, num_query_groups=4, ffn_hidden_size=128,
                    moe=MoESpec(num_experts=4, shared_expert_ffn_hidden_size=32))
    gelu_mlp = lambda f: 2 * 64 * f + f + 64  # fc1 and fc2 with their biases
    router = 4 * 64 + 4  # weight E x h and, with add_bias_linear, E biases (Megatron-Core's TopKRouter)
    assert moe.num_parameters - dense.num_parameters == router + 4 * gelu_mlp(128) + gelu_mlp(32) - gelu_mlp(128)
    assert moe.expert_parameters == 4 * gelu_mlp(128)
    assert dense.expert_parameters == 0


@pytest.mark.parametrize("name", ["mixtral-8x7b", "deepseek-moe-16b", "tiny-mixtral", "tiny-deepseek-moe"])
def test_moe_presets_round_trip_through_the_rich_form(name):
    model = MODEL_PRESETS[name]
    assert serde.from_dict(ModelSpec, json.loads(serde.dumps(model))) == model


def test_rich_layer_without_moe_key_is_dense():
    layer = serde.from_dict(LayerSpec, {"hidden_size": 64, "num_attention_heads": 4, "num_query_groups": 4,
                                        "ffn_hidden_size": 128})
    assert layer.moe is None


@pytest.mark.parametrize("kwargs", [dict(num_experts=0), dict(num_experts=2, router_topk=3),
                                    dict(num_experts=2, expert_ffn_hidden_size=0),
                                    dict(num_experts=2, shared_expert_ffn_hidden_size=-1),
                                    dict(num_experts=2, router_load_balancing_type="greedy"),
                                    dict(num_experts=2, aux_loss_coeff=-0.1)])
def test_bad_moe_spec_raises_value_error(kwargs):
    with pytest.raises(ValueError):
        MoESpec(**kwargs)


def test_training_spec_moe_fields():
    spec = TrainingSpec(global_batch_size=8)
    assert (spec.moe_token_dispatcher, spec.moe_load_imbalance, spec.moe_grouped_gemm) == ("alltoall", 1.0, False)
    for bad in (dict(moe_token_dispatcher="deepep"), dict(moe_flex_backend="nccl"), dict(moe_load_imbalance=0.9),
                dict(moe_load_imbalance=float("inf"))):
        with pytest.raises(ValueError):
            TrainingSpec(global_batch_size=8, **bad)


def test_layer_strategy_expert_degrees():
    strategy = LayerStrategy(tp=2, dp=4, sp=True, ep=2)
    assert (strategy.expert_tp, strategy.expert_dp) == (2, 2)
    assert LayerStrategy(tp=2, dp=4, sp=True, ep=8, etp=1).expert_dp == 1
    assert LayerStrategy(tp=2, dp=4, sp=True, ep=4, etp=1).short() == "tp2·dp4·sp·ep4·etp1"
    for bad in (dict(tp=2, dp=2, ep=4), dict(tp=1, dp=4, ep=0), dict(tp=1, dp=4, ep=2, etp=4),
                dict(tp=1, dp=4, etp=0)):
        with pytest.raises(ValueError):
            LayerStrategy(**bad)


def test_expert_strategy_against_the_layer():
    mixtral_layer = MODEL_PRESETS["tiny-mixtral"].layers[0]
    dense_layer = MODEL_PRESETS["tiny-llama"].layers[0]
    check_expert_strategy(mixtral_layer, LayerStrategy(tp=2, dp=2, sp=True, ep=2, etp=1))
    check_expert_strategy(dense_layer, LayerStrategy(tp=1, dp=4))
    bad = [(dense_layer, LayerStrategy(dp=4, ep=2)), (dense_layer, LayerStrategy(dp=4, etp=1)),
           (mixtral_layer, LayerStrategy(dp=8, ep=8)),  # 4 experts
           (mixtral_layer, LayerStrategy(tp=2, dp=2, ep=2, etp=1)),  # TP without SP
           (LayerSpec(64, 4, 4, 128, moe=MoESpec(num_experts=4)), LayerStrategy(tp=2, dp=2, sp=True, ep=2))]
    for layer, strategy in bad:
        with pytest.raises(ValueError):
            check_expert_strategy(layer, strategy)


def moe_plan(moe_strategies: tuple[LayerStrategy, ...], space: str = "megatron") -> Plan:
    """tiny-deepseek-moe (a dense first layer, three MoE layers) on one stage of 4 GPUs."""
    dense = LayerStrategy(tp=2, dp=2, sp=True)
    return Plan(space=space, world_size=4, pipeline_parallel=1, global_batch_size=8, num_micro_batches=2,
                chunks=(Chunk((dense, *moe_strategies)),), embedding=dense, model=MODEL_PRESETS["tiny-deepseek-moe"])


def test_plan_with_expert_parallel_round_trips_and_old_plans_load(tmp_path):
    plan = moe_plan((LayerStrategy(tp=2, dp=2, sp=True, ep=2, etp=1),) * 3)
    save_plan(plan, tmp_path / "plan.json")
    assert load_plan(tmp_path / "plan.json") == plan
    data = json.loads((tmp_path / "plan.json").read_text())
    for chunk in data["chunks"]:
        for layer in chunk["layers"]:
            del layer["ep"], layer["etp"]
    (tmp_path / "old.json").write_text(json.dumps(data))
    assert load_plan(tmp_path / "old.json").layer_strategies[1].ep == 1


def test_megatron_space_needs_one_ep_for_all_moe_layers():
    a = LayerStrategy(tp=2, dp=2, sp=True, ep=2, etp=1)
    b = LayerStrategy(tp=2, dp=2, sp=True, ep=4, etp=1)
    with pytest.raises(ValueError, match="one ep/etp"):
        moe_plan((a, b, a))
    assert moe_plan((a, b, a), space="hybrid").layer_strategies[2].ep == 4


def test_plan_file_with_ep_on_the_dense_layer_is_a_user_error(tmp_path):
    plan = moe_plan((LayerStrategy(tp=2, dp=2, sp=True, ep=2, etp=1),) * 3)
    data = json.loads(serde.dumps(plan))
    data["chunks"][0]["layers"][0]["ep"] = 2
    (tmp_path / "bad.json").write_text(json.dumps(data))
    with pytest.raises(UserError, match="dense layer"):
        load_plan(tmp_path / "bad.json")


def test_moe_layer_freq_takes_megatrons_list_expressions():
    from megatron_auto.specs.model import parse_moe_layer_freq

    assert parse_moe_layer_freq("([0]*1+[1]*27)") == [0] + [1] * 27
    assert parse_moe_layer_freq("([1]*3+[0]*1)*3") == [1, 1, 1, 0] * 3
    assert parse_moe_layer_freq("2") == 2
    assert moe_layer_pattern("[0]+[1]*3", 4) == (False, True, True, True)
    for bad in ("__import__('os')", "[0]*10**9", "[0]*1000000000", "[0]*-1", "[0]*[1]", "1+[1]", "[0.5]"):
        with pytest.raises(ValueError):
            moe_layer_pattern(bad, 4)


def test_compact_model_file_takes_a_moe_layer_freq_string(tmp_path):
    path = tmp_path / "deepseek-like.json"
    path.write_text(json.dumps({"num_layers": 4, "hidden_size": 64, "num_attention_heads": 4, "seq_length": 32,
                                "vocab_size": 128, "num_experts": 4, "moe_layer_freq": "([0]*1+[1]*3)"}))
    assert [layer.is_moe for layer in load_model(str(path)).layers] == [False, True, True, True]
    path.write_text(json.dumps({"num_layers": 4, "hidden_size": 64, "num_attention_heads": 4, "seq_length": 32,
                                "vocab_size": 128, "num_experts": 4, "moe_layer_freq": "[0]*"}))
    with pytest.raises(UserError, match="moe_layer_freq"):
        load_model(str(path))
