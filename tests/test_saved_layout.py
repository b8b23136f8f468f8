"""runtime/saved_layout.py: how a reading run finds what another runtime or optimizer structure wrote.

The key names below are the ones megatron-core 0.16.1 and the hybrid runtime write (listed from
real checkpoints of tools/pretrain_gpt.py: the stock runtime with and without
--use-distributed-optimizer, and a hybrid plan)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from megatron_auto.runtime.saved_layout import (DISTRIBUTED, FP32, MIXED_PRECISION, OptimizerKeys, SavedLayout,
                                                rekey_optimizer_template, saved_adam_step, saved_grad_scaler)

QKV = "decoder.layers.self_attention.linear_qkv.weight"


def _layout(keys) -> SavedLayout:
    return SavedLayout(format="megatron", expert_optimizer=None, stored_keys=frozenset(keys))


def test_stacked_and_per_layer_checkpoints_are_told_apart():
    assert _layout([QKV, "embedding.word_embeddings.weight", f"optimizer.state.exp_avg.{QKV}"]).layers_stacked
    per_layer = ["decoder.layers.0.self_attention.linear_qkv.weight", "decoder.final_layernorm.weight"]
    assert not _layout(per_layer).layers_stacked
    assert not _layout(["optimizer.state.exp_avg.decoder.layers.3.mlp.linear_fc1.weight"]).layers_stacked


def test_optimizer_keys_find_masters_under_either_name_and_chained_parts():
    keys = OptimizerKeys([QKV, f"optimizer.state.fp32_param.{QKV}", f"chained_1.optimizer.state.exp_avg.{QKV}",
                          f"optimizer.state.exp_avg_sq.{QKV}"])
    assert keys.stored(f"optimizer.state.param.{QKV}") == f"optimizer.state.fp32_param.{QKV}"
    assert keys.stored(f"optimizer.state.exp_avg.{QKV}") == f"chained_1.optimizer.state.exp_avg.{QKV}"
    assert keys.stored(f"optimizer.state.exp_avg_sq.{QKV}") == f"optimizer.state.exp_avg_sq.{QKV}"
    assert keys.stored(f"optimizer.state.exp_avg.{QKV}.other") is None
    assert keys.has_masters()


def _template(kinds=("param", "exp_avg", "exp_avg_sq")) -> dict:
    return {"part0": {0: {kind: SimpleNamespace(key=f"optimizer.state.{kind}.{QKV}") for kind in kinds}}}


def test_rekeying_points_the_template_at_the_stored_keys():
    template = _template()
    rekey_optimizer_template(template, OptimizerKeys([f"optimizer.state.fp32_param.{QKV}",
                                                      f"optimizer.state.exp_avg.{QKV}",
                                                      f"optimizer.state.exp_avg_sq.{QKV}"]))
    assert {kind: entry.key for kind, entry in template["part0"][0].items()} == {
        "param": f"optimizer.state.fp32_param.{QKV}", "exp_avg": f"optimizer.state.exp_avg.{QKV}",
        "exp_avg_sq": f"optimizer.state.exp_avg_sq.{QKV}"}


def test_a_checkpoint_without_masters_leaves_them_to_the_weights():
    """Megatron's fp32 optimizer writes no master copies: the template asks for none, and hands back the master
    templates it took out (model_space_optimizer reads the stored weights into them for 16-bit weights)."""
    template = _template()
    master = template["part0"][0]["param"]
    missing = rekey_optimizer_template(template, OptimizerKeys([QKV, f"optimizer.state.exp_avg.{QKV}",
                                                                f"optimizer.state.exp_avg_sq.{QKV}"]))
    assert sorted(template["part0"][0]) == ["exp_avg", "exp_avg_sq"]
    assert missing == [("part0", 0, master)]


def test_the_optimizer_that_wrote_a_checkpoint_is_told_by_its_masters():
    moments = [f"optimizer.state.exp_avg.{QKV}", f"chained_1.optimizer.state.exp_avg_sq.{QKV}"]
    assert _layout([QKV, f"optimizer.state.param.{QKV}", *moments]).optimizer_kind == DISTRIBUTED
    assert _layout([QKV, f"chained_0.optimizer.state.param.{QKV}", *moments]).optimizer_kind == DISTRIBUTED
    assert _layout([QKV, f"optimizer.state.fp32_param.{QKV}", *moments]).optimizer_kind == MIXED_PRECISION
    assert _layout([QKV, *moments]).optimizer_kind == FP32
    assert _layout([QKV]).optimizer_kind is None  # no optimizer state (Megatron-LM's --no-save-optim)


def test_a_missing_moment_is_an_error_not_a_fresh_start():
    with pytest.raises(KeyError, match="exp_avg_sq"):
        rekey_optimizer_template(_template(), OptimizerKeys([f"optimizer.state.param.{QKV}",
                                                             f"optimizer.state.exp_avg.{QKV}"]))


def test_the_adam_step_is_found_in_every_runtime_s_common_state():
    import torch

    assert saved_adam_step({"step": 7, "grad_scaler": None, "param_state": {}}) == 7  # hybrid
    assert saved_adam_step({"state": {"common_step": torch.tensor(5.0)}, "param_groups": [{"lr": 1.0}]}) == 5
    distributed = {"optimizer": {"param_groups": [{"step": 3.0, "lr": 0.1}, {"step": 3.0}]},
                   "param_state_sharding_type": "fully_reshardable"}
    assert saved_adam_step(distributed) == 3
    assert saved_adam_step({0: distributed, 1: {"optimizer": {"param_groups": [{"step": 3.0}]}}}) == 3
    assert saved_adam_step({"param_groups": [{"lr": 1.0}]}) == 0


def test_the_loss_scaler_is_found_at_any_depth():
    scaler = {"scale": 1024.0, "growth_tracker": 3, "hysteresis_tracker": 2}
    assert saved_grad_scaler({"grad_scaler": scaler, "step": 1}) == scaler
    assert saved_grad_scaler({0: {"optimizer": {}, "grad_scaler": scaler}}) == scaler
    assert saved_grad_scaler({"grad_scaler": None, "step": 1}) is None
