"""Megatron-LM's model and loss flags under parallel layouts agree with one process.

A Qwen3-style model (tests/runtime/worker_models.qwen3_model: --kv-channels twice hidden / heads,
--qk-layernorm, --add-qkv-bias alone, --apply-layernorm-1p, GQA) runs under tensor (with SP) and
pipeline parallelism on four gloo ranks, and with --calculate-per-token-loss and --decoupled-lr,
against single-process runs from the same initial weights; and in the hybrid runtime, with ZeRO-3
tensor-parallel layers (whose q/k norm gradients are summed over TP by hybrid/sharded.py).
"""
from __future__ import annotations

import math

import pytest

from validation.launcher import run_cases

RTOL = 1e-5
"""fp32 on CPU: the layouts sum the same products in other orders (TP splits the GEMMs, DP the batch),
which moves a loss or gradient norm by a few ulps (~1e-7 relative) per step; five Adam steps amplify
that to below 1e-6 in the existing layout tests (tests/runtime/test_equivalence.py uses the same 1e-5)."""
BATCH = {"global_batch_size": 8, "micro_batch_size": 1}
DECOUPLED = {"decoupled_lr": 5e-3, "decoupled_min_lr": 5e-4}


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("model_flags")
    init = str(tmp / "init")
    one = [{"name": "reference", "model": "qwen3", "flags": {"global_batch_size": 8, "micro_batch_size": 2},
            "save_initial": init},
           {"name": "decoupled_reference", "model": "qwen3", "flags": {"global_batch_size": 8, "micro_batch_size": 2},
            "load_weights": init, "settings": DECOUPLED}]
    four = [{"name": "tp2_sp_dp2", "model": "qwen3", "flags": {**BATCH, "tp": 2, "sequence_parallel": True},
             "load_weights": init},
            {"name": "pp2_dp2", "model": "qwen3", "flags": {**BATCH, "pp": 2}, "load_weights": init},
            {"name": "per_token_tp2_dp2", "model": "qwen3", "flags": {**BATCH, "tp": 2},
             "load_weights": init, "settings": {"calculate_per_token_loss": True}},
            {"name": "decoupled_tp2_pp2", "model": "qwen3",
             "flags": {**BATCH, "tp": 2, "pp": 2}, "load_weights": init,
             "settings": DECOUPLED}]
    return {**run_cases(tmp, 1, "equivalence_worker.py", one, timeout_s=300),
            **run_cases(tmp, 4, "equivalence_worker.py", four, timeout_s=400)}


def _assert_matches(result: dict, reference: dict) -> None:
    assert "error" not in result, result.get("error")
    assert len(result["losses"]) == len(reference["losses"]) == 5
    for step, (ours, theirs) in enumerate(zip(result["losses"] + result["grad_norms"],
                                              reference["losses"] + reference["grad_norms"])):
        assert math.isclose(ours, theirs, rel_tol=RTOL), f"value {step}: {ours} != {theirs}"


@pytest.mark.parametrize("name", ["tp2_sp_dp2", "pp2_dp2", "per_token_tp2_dp2"])
def test_qwen3_flags_match_one_process(results, name):
    assert len(set(results["reference"]["losses"])) == 5  # it learns: equality is not trivial
    _assert_matches(results[name], results["reference"])


def test_decoupled_lr_changes_training_and_matches_one_process(results):
    assert results["decoupled_reference"]["losses"][1:] != results["reference"]["losses"][1:]
    _assert_matches(results["decoupled_tp2_pp2"], results["decoupled_reference"])


HYBRID_PLAN = {"chunks": [[{"tp": 2, "dp": 2, "zero": 3}, {"tp": 2, "dp": 2, "zero": 3}, {"dp": 4, "zero": 0},
                           {"tp": 2, "dp": 2, "sp": True, "zero": 3}]],
               "embedding": {"tp": 2, "dp": 2, "zero": 0}}
HYBRID_LOSS_RTOL, HYBRID_NORM_RTOL = 1e-6, 1e-4
"""The tolerances tests/runtime/test_hybrid_equivalence.py derives for these tiny models (loss: 16 ulp
of drift with an 11x margin; gradient norm: 10x margin over the largest drift measured there)."""


@pytest.fixture(scope="module")
def hybrid_results(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("model_flags_hybrid")
    init = str(tmp / "init.pt")
    reference = run_cases(tmp, 1, "hybrid_worker.py", [{"name": "reference", "model": "qwen3", "reference": True,
                                                         "init": init}], timeout_s=240)
    hybrid = run_cases(tmp, 4, "hybrid_worker.py", [{"name": "zero3_tp2", "model": "qwen3", "plan": HYBRID_PLAN,
                                                     "init": init}], timeout_s=300)
    return {**reference, **hybrid}


def test_qwen3_flags_in_zero3_tensor_parallel_layers_match_one_process(hybrid_results):
    reference, result = hybrid_results["reference"], hybrid_results["zero3_tp2"]
    assert len(result["losses"]) == len(reference["losses"]) == 5
    for step in range(5):
        assert math.isclose(result["losses"][step], reference["losses"][step], rel_tol=HYBRID_LOSS_RTOL), step
        assert math.isclose(result["grad_norms"][step], reference["grad_norms"][step], rel_tol=HYBRID_NORM_RTOL), step
