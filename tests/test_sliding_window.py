"""Sliding-window attention (Megatron-Core's window_size and window_attn_skip_freq): which layers get a window,
what the flash core computes under one, where Transformer Engine does not run it (its CP ring) and where it is not
run (the runtime)."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest

from megatron_auto.cli.main import main
from megatron_auto.cost.layer_kernels import attended_pairs, attention_core_times
from megatron_auto.errors import UserError
from megatron_auto.specs.model import LayerSpec, model_from_dict, window_pattern
from megatron_auto.specs.presets import CLUSTER_PRESETS

H100 = CLUSTER_PRESETS["dgx-h100-80gb"]
# GPT-OSS's attention (NeMo GPTOSSConfig: hidden 2880, 64 heads of 64, 8 query groups, window (127, 0)).
OSS = LayerSpec(hidden_size=2880, num_attention_heads=64, num_query_groups=8, ffn_hidden_size=2880,
                kv_channels=64, swiglu=True)
COMPACT = {"num_layers": 6, "hidden_size": 64, "num_attention_heads": 4, "seq_length": 256, "vocab_size": 128}


@pytest.mark.parametrize("seq, window", [(16, 0), (16, 3), (16, 15), (17, 5), (64, 63), (64, 100), (33, None)])
def test_attended_pairs_count_the_band_pair_by_pair(seq, window):
    band = sum(min(i, window) + 1 for i in range(seq)) if window is not None and window < seq - 1 else None
    if band is None:
        assert attended_pairs(seq, window) == 0.5 * seq * seq  # the whole causal prefix, as before
    else:
        assert attended_pairs(seq, window) == band


def test_megatron_cores_skip_frequency_windows_the_layers_it_names():
    # is_layer_window_attention: an int N windows every 1-based layer number that N does not divide.
    assert window_pattern([127, 0], 2, 4) == (127, None, 127, None)
    assert window_pattern(127, None, 3) == (127, 127, 127)
    assert window_pattern([127, 0], [0, 1, 1], 3) == (None, 127, 127)
    assert window_pattern(None, None, 2) == (None, None)
    model = model_from_dict({**COMPACT, "window_size": [127, 0], "window_attn_skip_freq": 2})
    assert [layer.attention_window for layer in model.layers] == [127, None] * 3
    assert len(model.distinct_layers) == 2


@pytest.mark.parametrize("keys, message", [
    ({"window_size": [127, 4]}, "only causal windows"),
    ({"window_size": [127, 0, 1]}, "window_size must be"),
    ({"window_attn_skip_freq": 2}, "needs window_size"),
    ({"window_size": 16, "window_attn_skip_freq": [1, 0]}, "lists 2 layers but the model has 6"),
])
def test_windows_megatron_core_would_not_take_are_user_errors(keys, message):
    with pytest.raises(UserError, match=message):
        model_from_dict({**COMPACT, **keys})


def test_a_window_cuts_the_flash_cores_work_to_its_band_and_leaves_the_unfused_core_alone():
    windowed = replace(OSS, attention_window=127)
    full_forward, full_backward = attention_core_times(OSS, 4096, 1, 1, H100, 2, "flash")
    forward, backward = attention_core_times(windowed, 4096, 1, 1, H100, 2, "flash")
    band = attended_pairs(4096, 127) / attended_pairs(4096, None)  # 128 keys a query against 2,048 on average
    assert band == pytest.approx((128 * (4096 - 63.5)) / (0.5 * 4096 ** 2))
    rate = H100.gpu.peak_flops * H100.compute.flash_fraction
    moved = 2 * 4096 * (64 + 8) * 128  # bf16 Q, K, V in and O out: heads and groups of d_q + d_v = 128
    assert forward == pytest.approx(max(full_forward * band, moved / _bandwidth()))
    assert backward == pytest.approx(max(full_backward * band, 2 * moved / _bandwidth()))
    assert forward < 0.1 * full_forward and backward < 0.1 * full_backward
    assert full_forward == pytest.approx(2.0 * 64 * 0.5 * 4096 ** 2 * 128 / rate)
    assert attention_core_times(windowed, 4096, 1, 1, H100, 2, "unfused") == attention_core_times(
        OSS, 4096, 1, 1, H100, 2, "unfused")  # the unfused core masks the s x s scores it computes anyway
    assert attention_core_times(replace(OSS, attention_window=5000), 4096, 1, 1, H100, 2, "flash") == (
        full_forward, full_backward)


def _bandwidth() -> float:
    from megatron_auto.cost.kernel_rates import elementwise_bandwidth

    return elementwise_bandwidth(H100)


def test_a_zero_window_is_bound_by_the_bytes_the_kernel_moves():
    forward, backward = attention_core_times(replace(OSS, attention_window=0), 4096, 1, 1, H100, 2, "flash")
    moved = 2 * 4096 * (64 + 8) * 128
    assert forward == pytest.approx(moved / _bandwidth()) and backward == pytest.approx(2 * moved / _bandwidth())


def test_estimate_prices_a_windowed_model_and_refuses_the_cp_ring_beside_a_window_in_one_line(tmp_path, capsys):
    path = tmp_path / "oss.json"
    path.write_text(json.dumps({"num_layers": 8, "hidden_size": 2880, "num_attention_heads": 64,
                                "num_query_groups": 8, "kv_channels": 64, "ffn_hidden_size": 2880, "swiglu": True,
                                "seq_length": 8192, "vocab_size": 32768, "position_embedding_type": "rope",
                                "normalization": "RMSNorm", "add_bias_linear": False,
                                "window_size": [127, 0], "window_attn_skip_freq": 2}))
    job = ["estimate", "--model", str(path), "--cluster", "dgx-h100-80gb", "--num-nodes", "1",
           "--global-batch-size", "16", "--tp", "1", "--pp", "1", "--micro-batch-size", "1", "--json"]
    assert main(job) == 0
    windowed = json.loads(capsys.readouterr().out)["iteration_time_s"]
    full = json.loads(path.read_text())
    for key in ("window_size", "window_attn_skip_freq"):
        full.pop(key)
    path.write_text(json.dumps(full))
    assert main(job) == 0
    assert windowed < json.loads(capsys.readouterr().out)["iteration_time_s"]
    path.write_text(json.dumps({**full, "window_size": 127}))
    assert main([*job[:-1], "--cp", "2"]) == 2  # Transformer Engine's p2p ring, the default type, runs no window
    err = capsys.readouterr().err.strip()
    assert "needs --cp-comm-type a2a or all_gather" in err and "\n" not in err
    for kind in ("a2a", "all_gather"):  # the types that do run one (tests/test_cp_comm_type.py prices them)
        assert main([*job, "--cp", "2", "--cp-comm-type", kind]) == 0
        assert json.loads(capsys.readouterr().out)["megatron_flags"][-2:] == ["--cp-comm-type", kind]
