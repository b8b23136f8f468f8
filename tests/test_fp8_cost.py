"""FP8 (cost/fp8.py), TE's TP communication overlap (cost/tp_overlap.py) and gradients reduced in bf16,
priced term by term and through `megatron-auto estimate`."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest

from megatron_auto.cli.main import main
from megatron_auto.cost.compute import gemm_compute_time
from megatron_auto.cost.fp8 import (cast_bytes, fp8_gemm_time, fp8_layer_delta, fp8_problem, fp8_saved_input_savings,
                                    fp8_weight_copy_bytes)
from megatron_auto.cost.flops import Gemm
from megatron_auto.cost.tp_overlap import exposed_tp_seconds
from megatron_auto.specs.presets import CLUSTER_PRESETS, MODEL_PRESETS

H100 = CLUSTER_PRESETS["dgx-h100-80gb"]
A100 = CLUSTER_PRESETS["dgx-a100-80gb"]
LAYER = MODEL_PRESETS["llama3-70b"].layers[0]


def test_a_large_fp8_gemm_runs_near_twice_as_fast_and_a_small_one_gains_less():
    big, small = Gemm(16384, 8192, 8192), Gemm(256, 1024, 1024)
    big_ratio = gemm_compute_time(big, H100) / fp8_gemm_time(big, H100)
    small_ratio = gemm_compute_time(small, H100) / fp8_gemm_time(small, H100)
    assert 1.8 < big_ratio < 2.0  # the same max_fraction of a twice higher peak, less the longer half_dim
    assert 1.0 < small_ratio < big_ratio


def test_fp8_saves_layer_time_net_of_its_casts():
    delta = fp8_layer_delta(LAYER, 4096, 1, 4, True, H100, "delayed")
    assert delta.backward_s < delta.forward_s < 0  # dgrad + wgrad save twice the GEMM time, less more casts
    # Current scaling reads every input once more for its amax: it saves less.
    current = fp8_layer_delta(LAYER, 4096, 1, 4, True, H100, "tensorwise")
    assert delta.forward_s < current.forward_s < 0
    forward, backward = cast_bytes(LAYER, 4096, 1, 4, True, "delayed")
    # Forward: the projection input (a d / tp) and fc2 input (f / tp) cast with their transposes, 4 bytes each.
    assert forward == pytest.approx(4096 * 4 * (LAYER.attention_width / 4 + LAYER.ffn_hidden_size / 4))
    assert backward > forward


def test_fp8_memory_terms():
    assert fp8_weight_copy_bytes(1e9, 4, param_gather=False) == pytest.approx(2 * 1e9 / 4)
    assert fp8_weight_copy_bytes(1e9, 4, param_gather=True) == 0.0
    kept = fp8_saved_input_savings(LAYER, 4096, 1, 4, True, norms_kept=True, mlp_inner_kept=True)
    assert kept == pytest.approx(4096 * (2 * 8192 / 4 + LAYER.attention_width / 4 + LAYER.ffn_hidden_size / 4))


def test_fp8_needs_fp8_tensor_cores_and_mxfp8_needs_blackwell():
    assert "no FP8 tensor cores" in fp8_problem(A100, "delayed")
    assert fp8_problem(H100, "delayed") is None and fp8_problem(H100, "blockwise") is None
    assert "MXFP8" in fp8_problem(H100, "mxfp8")
    assert fp8_problem(replace(H100, gpu=replace(H100.gpu, mxfp8=True)), "mxfp8") is None


def test_tp_overlap_leaves_the_first_chunk_or_what_the_gemms_cannot_cover():
    assert exposed_tp_seconds(0.8, 10.0, 8) == pytest.approx(0.1)
    assert exposed_tp_seconds(0.8, 0.2, 8) == pytest.approx(0.6)


ESTIMATE = ["estimate", "--model", "llama3-70b", "--cluster", "dgx-h100-80gb", "--num-nodes", "8",
            "--global-batch-size", "128", "--tp", "4", "--pp", "4", "--virtual-stages", "5", "--micro-batch-size", "1",
            "--sequence-parallel", "--distributed-optimizer", "--json"]


def estimate(capsys, *extra: str) -> dict:
    assert main([*ESTIMATE, *extra]) == 0
    return json.loads(capsys.readouterr().out)


def test_estimate_prices_fp8_and_the_recipe_knobs(capsys):
    bf16 = estimate(capsys)
    fp8 = estimate(capsys, "--precision", "fp8")
    assert estimate(capsys, "--fp8-format", "hybrid")["iteration_time_s"] == pytest.approx(fp8["iteration_time_s"])
    assert fp8["iteration_time_s"] < 0.85 * bf16["iteration_time_s"]
    assert fp8["memory_breakdown"]["states_gib"] > bf16["memory_breakdown"]["states_gib"]  # TE's FP8 weight copies
    gathered = estimate(capsys, "--precision", "fp8", "--fp8-param-gather")
    assert gathered["memory_breakdown"]["states_gib"] == pytest.approx(bf16["memory_breakdown"]["states_gib"])
    overlapped = estimate(capsys, "--tp-comm-overlap")
    assert overlapped["breakdown"]["tp_comm_s"] < 0.5 * bf16["breakdown"]["tp_comm_s"]
    assert overlapped["iteration_time_s"] < bf16["iteration_time_s"]
    bf16_grads = estimate(capsys, "--grad-reduce-in-bf16")
    assert bf16_grads["memory_breakdown"]["states_gib"] < bf16["memory_breakdown"]["states_gib"]


@pytest.mark.parametrize("flags, message", [
    (["--cluster", "dgx-a100-80gb", "--precision", "fp8"], "no FP8 tensor cores"),
    (["--precision", "fp8", "--fp8-recipe", "mxfp8"], "MXFP8"),
    (["--precision", "bf16", "--fp8-format", "e4m3"], "asks for FP8"),
    (["--fp8-param-gather"], "needs FP8 training"),
])
def test_fp8_refusals_are_one_line_and_exit_2(capsys, flags, message):
    assert main([*ESTIMATE, *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err


def test_plan_refuses_fp8_on_a_gpu_without_fp8_tensor_cores_before_searching(capsys):
    """The search prices FP8 GEMMs at the GPU's FP8 peak, zero on an A100: it must refuse, not divide by it."""
    job = ["plan", "--model", "llama2-7b", "--cluster", "dgx-a100-80gb", "--global-batch-size", "8"]
    assert main([*job, "--precision", "fp8"]) == 2
    err = capsys.readouterr().err.strip()
    assert "no FP8 tensor cores" in err and "\n" not in err


def test_the_plans_flags_carry_the_knobs_it_was_priced_with(capsys):
    plain = estimate(capsys)["megatron_flags"]
    assert not {"--fp8-format", "--tp-comm-overlap", "--grad-reduce-in-bf16"} & set(plain)
    flags = estimate(capsys, "--fp8-format", "e4m3", "--fp8-recipe", "tensorwise", "--tp-comm-overlap",
                     "--grad-reduce-in-bf16")["megatron_flags"]
    assert flags[-6:] == ["--fp8-format", "e4m3", "--fp8-recipe", "tensorwise", "--tp-comm-overlap",
                          "--grad-reduce-in-bf16"]
    # TP overlap needs layers with tp > 1 under SP: at tp 1 there is nothing to overlap and no flag.
    tp1 = ["estimate", "--model", "gpt3-1.7b", "--cluster", "dgx-h100-80gb", "--global-batch-size", "64",
           "--tp", "1", "--pp", "1", "--tp-comm-overlap", "--json"]
    assert main(tp1) == 0 and "--tp-comm-overlap" not in json.loads(capsys.readouterr().out)["megatron_flags"]


def test_interleaved_p2p_runs_beside_the_next_chunk_and_plain_1f1b_waits():
    from megatron_auto.cost.pipeline import exposed_p2p_time

    assert exposed_p2p_time(0.01, 0.5, virtual_stages=1) == 0.01
    assert exposed_p2p_time(0.01, 0.5, virtual_stages=4) == 0.0
    assert exposed_p2p_time(0.01, 0.004, virtual_stages=4) == pytest.approx(0.006)
    assert exposed_p2p_time(0.01, 0.5, virtual_stages=4, overlap=0.0) == 0.01  # cpu-gloo hides nothing
