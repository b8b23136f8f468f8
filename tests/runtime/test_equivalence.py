"""Multi-process gloo runs of Megatron-Core layouts agree with one process, step by step.

Three launches (1, 4 and 8 ranks) run every case of the issue in turn inside
one process group each: the single-process reference saves its initial weights
(which every parallel case loads, so all start from the same model) and a
checkpoint at iteration 3 (which other layouts and world sizes resume from).
Loss and gradient norm of all 5 steps must agree within fp32 tolerance.
"""
from __future__ import annotations

import math

import pytest

from launcher import run_cases

RTOL = 1e-5
STEPS = 5
BATCH = {"global_batch_size": 8, "micro_batch_size": 1}


def _four_rank_cases(tmp) -> list[dict]:
    init = {"load_weights": str(tmp / "init")}
    return [
        {"name": "dp4", "flags": BATCH, **init},
        {"name": "tp2_dp2", "flags": {**BATCH, "tensor_parallel": 2}, **init},
        {"name": "tp2_sp_dp2", "flags": {**BATCH, "tensor_parallel": 2, "sequence_parallel": True}, **init},
        {"name": "pp2_uneven_3_1", "flags": {**BATCH, "pipeline_parallel": 2, "first_stage_layers": 3,
                                             "last_stage_layers": 1}, **init},
        {"name": "pp2_vp2", "flags": {**BATCH, "pipeline_parallel": 2, "layers_per_virtual_stage": 1}, **init},
        {"name": "distopt_tp2_dp2", "flags": {**BATCH, "tensor_parallel": 2, "distributed_optimizer": True},
         "save": str(tmp / "distopt"), "save_interval": 3, **init},
        {"name": "selective_recompute_tp2_dp2", "flags": {**BATCH, "tensor_parallel": 2,
                                                          "recompute_granularity": "selective"}, **init},
        {"name": "full_recompute_pp2_dp2", "flags": {**BATCH, "pipeline_parallel": 2, "recompute_granularity": "full",
                                                     "recompute_method": "uniform", "recompute_num_layers": 1},
         **init},
        {"name": "resume_1rank_ckpt_as_tp2_pp2", "flags": {**BATCH, "tensor_parallel": 2, "pipeline_parallel": 2},
         "resume": str(tmp / "reference"), "resume_step": 3},
        {"name": "llama_tp2_sp_dp2", "model": "llama", "flags": {**BATCH, "tensor_parallel": 2,
                                                                 "sequence_parallel": True},
         "load_weights": str(tmp / "init_llama")},
        {"name": "llama_pp2_dp2", "model": "llama", "flags": {**BATCH, "pipeline_parallel": 2},
         "load_weights": str(tmp / "init_llama")},
        {"name": "vpp_batched_p2p_refused", "flags": {**BATCH, "pipeline_parallel": 2, "layers_per_virtual_stage": 1},
         "force_batch_p2p": True, "expect_error": True, "steps": 1, **init},
    ]


def _eight_rank_cases(tmp) -> list[dict]:
    layout = {**BATCH, "tensor_parallel": 2, "pipeline_parallel": 2}
    return [
        {"name": "tp2_pp2_dp2", "flags": layout, "load_weights": str(tmp / "init")},
        {"name": "resume_4rank_distopt_ckpt_as_tp2_pp2_dp2", "flags": {**layout, "distributed_optimizer": True},
         "resume": str(tmp / "distopt"), "resume_step": 3},
    ]


def _run(tmp, world_size: int, cases: list[dict], timeout_s: float) -> dict:
    return run_cases(tmp, world_size, "equivalence_worker.py", cases, timeout_s)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("equivalence")


@pytest.fixture(scope="module")
def references(workdir) -> dict:
    flags = {"global_batch_size": 8, "micro_batch_size": 2}
    cases = [{"name": "reference", "flags": flags, "save_initial": str(workdir / "init"),
              "save": str(workdir / "reference"), "save_interval": 3},
             # The LLaMA architecture (GQA, SwiGLU, RMSNorm, no biases, RoPE, untied head).
             {"name": "llama_reference", "model": "llama", "flags": flags, "save_initial": str(workdir / "init_llama")}]
    return _run(workdir, 1, cases, timeout_s=180)


@pytest.fixture(scope="module")
def reference(references) -> dict:
    return references["reference"]


@pytest.fixture(scope="module")
def four_rank(workdir, references) -> dict:
    return _run(workdir, 4, _four_rank_cases(workdir), timeout_s=360)


@pytest.fixture(scope="module")
def eight_rank(workdir, four_rank) -> dict:
    return _run(workdir, 8, _eight_rank_cases(workdir), timeout_s=420)


def assert_matches_reference(result: dict, reference: dict) -> None:
    assert "error" not in result, result.get("error")
    assert result["iterations"], "the case ran no iteration"
    for iteration, loss, grad_norm in zip(result["iterations"], result["losses"], result["grad_norms"]):
        ref_loss = reference["losses"][iteration - 1]
        ref_norm = reference["grad_norms"][iteration - 1]
        assert math.isclose(loss, ref_loss, rel_tol=RTOL), f"iteration {iteration}: loss {loss} != {ref_loss}"
        assert math.isclose(grad_norm, ref_norm, rel_tol=RTOL), \
            f"iteration {iteration}: grad norm {grad_norm} != {ref_norm}"


@pytest.mark.parametrize("which", ["reference", "llama_reference"])
def test_reference_learns(references, which):
    reference = references[which]
    assert reference["iterations"] == list(range(1, STEPS + 1))
    assert all(math.isfinite(x) for x in reference["losses"] + reference["grad_norms"])
    # Distinct steps: equality below is not the trivial equality of constant numbers.
    assert len(set(reference["losses"])) == STEPS


def test_llama_architecture_differs_from_gpt(references):
    assert references["llama_reference"]["losses"][0] != references["reference"]["losses"][0]


@pytest.mark.parametrize("name", [c["name"] for c in _four_rank_cases(__import__("pathlib").Path("."))
                                  if not c.get("expect_error")])
def test_four_ranks_match_single_process(four_rank, references, name):
    model = next(c.get("model", "gpt") for c in _four_rank_cases(__import__("pathlib").Path(".")) if c["name"] == name)
    assert_matches_reference(four_rank[name], references["llama_reference" if model == "llama" else "reference"])


def test_resumed_run_continues_the_uninterrupted_one(four_rank):
    assert four_rank["resume_1rank_ckpt_as_tp2_pp2"]["iterations"] == [4, 5]


def test_virtual_stages_with_batched_p2p_over_gloo_are_refused(four_rank):
    error = four_rank["vpp_batched_p2p_refused"].get("error", "")
    assert "VirtualPipelineBatchedP2PError" in error and "gloo" in error


@pytest.mark.parametrize("name", ["tp2_pp2_dp2", "resume_4rank_distopt_ckpt_as_tp2_pp2_dp2"])
def test_eight_ranks_match_single_process(eight_rank, reference, name):
    assert_matches_reference(eight_rank[name], reference)
    if name.startswith("resume"):
        assert eight_rank[name]["iterations"] == [4, 5]
