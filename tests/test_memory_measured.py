"""The activation formula against what profile-model measured on this machine's CPU ranks.

docs/profiles/cpu4_model.json holds the saved-tensor bytes of Megatron-Core's
TransformerLayer (local spec, fp32, dropout 0.1) per TP shard and micro-batch.
On CPU ATen keeps dropout noise in fp32 (ClusterSpec.dropout_mask_bytes = 4 on
cpu-gloo); the formula then matches up to what it leaves out on purpose: the
cached causal mask (s^2 bools, shared by all layers).
"""
from __future__ import annotations

from pathlib import Path

import pytest

from megatron_auto.cost.memory import layer_activation_bytes
from megatron_auto.plan import LayerStrategy
from megatron_auto.specs.presets import CLUSTER_PRESETS
from megatron_auto.specs.profiles import load_profile

PROFILE = load_profile(str(Path(__file__).resolve().parents[1] / "docs" / "profiles" / "cpu4_model.json"))
CPU = CLUSTER_PRESETS["cpu-gloo"]


@pytest.mark.parametrize("timing", PROFILE.layers[0].timings, ids=lambda t: f"tp{t.tp}-mbs{t.micro_batch}")
def test_layer_activation_formula_matches_the_measured_saved_tensors(timing):
    entry = PROFILE.layers[0]
    strategy = LayerStrategy(tp=timing.tp, dp=1)
    predicted = layer_activation_bytes(entry.layer, timing.seq_length, timing.micro_batch, strategy, 4,
                                       CPU.dropout_mask_bytes)
    left_out = timing.seq_length ** 2
    assert predicted + left_out == pytest.approx(timing.activation_bytes, rel=1e-3)


def test_one_byte_masks_would_miss_the_cpu_measurement():
    timing = PROFILE.layers[0].timings[0]
    predicted = layer_activation_bytes(PROFILE.layers[0].layer, timing.seq_length, timing.micro_batch,
                                       LayerStrategy(tp=timing.tp, dp=1), 4, 1)
    assert predicted < 0.9 * timing.activation_bytes
