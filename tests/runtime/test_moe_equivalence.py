"""Megatron-Core's MoE layers under expert parallelism agree with one process, step by step.

One process trains each tiny MoE model (worker_models: a Mixtral-like model, every layer MoE without
biases, plus a shared expert; and GPT layers with biases where every second one is a MoE) and saves
its initial weights; every parallel case on 4 gloo ranks loads them (through dist_checkpointing,
which reshards the experts over EP), trains the same 5 global batches and must match:

- EP2 x expert-DP2 (dense DP4), alltoall dispatcher;
- EP2 with TP2 + sequence parallel (expert TP defaults to TP: EP2 x ETP2), alltoall;
- EP2 with PP2, alltoall;
- the mixed dense/MoE model at EP2 x DP4 with the allgather dispatcher, and at TP2 + SP with EP2 and
  expert TP 1 (biases need it) and the allgather dispatcher.

Every case starts from the single process's weights (EP1), resharded onto its EP degree; a full
checkpoint (weights, optimizer, schedule) saved at iteration 3 under EP2 resumes under EP4, and
iterations 4 and 5 continue the uninterrupted run.

Every case uses micro-batches of one sequence, as the reference does: the load-balancing loss is
computed per micro-batch (over the TP/SP ranks' tokens), so its value and gradient depend on
which tokens share a micro-batch, not on the layout.
"""
from __future__ import annotations

import math

import pytest

from launcher import run_cases

STEPS = 5
RTOL = 1e-5
"""Loss, gradient norm and logged load-balancing loss, relative. With every token routed to the same
experts, the layouts differ only in fp32 summation order (TP reductions, the order in which the
dispatchers gather tokens, gradient all-reduce over DP and expert DP): relative differences of a few
1e-7 per step (measured here: at most MEASURED), so 1e-5 leaves a wide margin and still rejects any
error of the size a misrouted token or a dropped aux-loss gradient makes (>= 1e-4, see ROUTER_GAP)."""
ROUTER_GAP_MIN = 1e-5
"""Routing is discrete: a token whose k-th and (k+1)-th router logits were within the layouts' fp32
differences could pick different experts. The router runs in fp32 (--moe-router-dtype fp32) with random
weights, so exact ties have probability zero, and the test asserts that the smallest margin the reference
meets over all its 2,560 (SwiGLU model) / 1,280 (mixed model) routing decisions is above 1e-5. The logits
are ~0.1 (router weights of std 0.02 over 32 unit-RMS hidden features) and the layouts' hidden states
differ by at most ~1e-6 relative (RTOL is 10x that), so a logit moves by ~1e-7 between layouts: 100x
below the margin, and no choice can flip. The margin depends on the seed: seed 1234 gives the SwiGLU
model a 7e-7 margin (measured), too close, so its cases run with seed 2 (2.4e-5); if a change of
megatron-core moves the margin below the bound, this test says so instead of comparing flipped routes."""
SWIGLU_SEED = {"seed": 2}
BATCH = {"global_batch_size": 8, "micro_batch_size": 1}
ROUTER = {"router_dtype": "fp32"}


def _reference_cases(tmp) -> list[dict]:
    return [
        {"name": "swiglu_reference", "model": "swiglu_moe", "flags": BATCH, "moe": ROUTER, "settings": SWIGLU_SEED,
         "save_initial": str(tmp / "init_swiglu")},
        {"name": "mixed_reference", "model": "mixed_moe", "flags": BATCH, "moe": ROUTER,
         "save_initial": str(tmp / "init_mixed")},
    ]


def _four_rank_cases(tmp) -> list[dict]:
    swiglu = {"model": "swiglu_moe", "load_weights": str(tmp / "init_swiglu"), "settings": SWIGLU_SEED}
    mixed = {"model": "mixed_moe", "load_weights": str(tmp / "init_mixed")}
    allgather = {**ROUTER, "token_dispatcher": "allgather"}
    return [
        {"name": "ep2_dp4", "flags": {**BATCH, "expert_parallel": 2}, "moe": ROUTER, **swiglu,
         "save": str(tmp / "swiglu_ep2"), "save_interval": 3},
        {"name": "ep2_tp2_sp", "flags": {**BATCH, "expert_parallel": 2, "tensor_parallel": 2,
                                          "sequence_parallel": True}, "moe": ROUTER, **swiglu},
        {"name": "ep2_pp2", "flags": {**BATCH, "expert_parallel": 2, "pipeline_parallel": 2}, "moe": ROUTER,
         **swiglu},
        {"name": "mixed_ep2_dp4_allgather", "flags": {**BATCH, "expert_parallel": 2}, "moe": allgather, **mixed},
        {"name": "mixed_ep2_etp1_tp2_sp_allgather",
         "flags": {**BATCH, "expert_parallel": 2, "expert_tensor_parallel": 1, "tensor_parallel": 2,
                   "sequence_parallel": True}, "moe": allgather, **mixed},
        {"name": "resume_ep2_ckpt_as_ep4", "model": "swiglu_moe",
         "flags": {**BATCH, "expert_parallel": 4}, "moe": ROUTER,
         "settings": SWIGLU_SEED, "resume": str(tmp / "swiglu_ep2"), "resume_step": 3},
    ]


REFERENCE_OF = {"swiglu_moe": "swiglu_reference", "mixed_moe": "mixed_reference"}
FOUR_RANK_NAMES = [c["name"] for c in _four_rank_cases(__import__("pathlib").Path("."))]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("moe_equivalence")


@pytest.fixture(scope="module")
def references(workdir) -> dict:
    return run_cases(workdir, 1, "equivalence_worker.py", _reference_cases(workdir), timeout_s=300)


@pytest.fixture(scope="module")
def four_rank(workdir, references) -> dict:
    return run_cases(workdir, 4, "equivalence_worker.py", _four_rank_cases(workdir), timeout_s=600)


def relative_gaps(result: dict, reference: dict) -> list[float]:
    """|ours - reference| / |reference| of every loss, gradient norm and load-balancing loss compared."""
    gaps = []
    for index, iteration in enumerate(result["iterations"]):
        pairs = [(result["losses"][index], reference["losses"][iteration - 1]),
                 (result["grad_norms"][index], reference["grad_norms"][iteration - 1]),
                 (result["moe_losses"][index]["load_balancing_loss"],
                  reference["moe_losses"][iteration - 1]["load_balancing_loss"])]
        gaps += [abs(ours - ref) / abs(ref) for ours, ref in pairs]
    return gaps


def assert_matches(result: dict, reference: dict) -> None:
    assert "error" not in result, result.get("error")
    assert result["iterations"], "the case ran no iteration"
    worst = max(relative_gaps(result, reference))
    assert worst <= RTOL, f"relative difference {worst:.2e} > {RTOL:g}: {result} vs {reference}"


@pytest.mark.parametrize("which", list(REFERENCE_OF.values()))
def test_references_learn_with_aux_losses_and_clear_routing(references, which):
    reference = references[which]
    assert reference["iterations"] == list(range(1, STEPS + 1))
    assert len(set(reference["losses"])) == STEPS and all(map(math.isfinite, reference["losses"]))
    assert all(step["load_balancing_loss"] > 0 for step in reference["moe_losses"])
    assert reference["router_gap"] > ROUTER_GAP_MIN, reference["router_gap"]


def test_swiglu_reference_logs_its_z_loss(references):
    assert all(step["z_loss"] > 0 for step in references["swiglu_reference"]["moe_losses"])


@pytest.mark.parametrize("name", FOUR_RANK_NAMES)
def test_four_ranks_match_single_process(four_rank, references, name):
    case = next(c for c in _four_rank_cases(__import__("pathlib").Path(".")) if c["name"] == name)
    assert_matches(four_rank[name], references[REFERENCE_OF[case["model"]]])


def test_checkpoint_of_ep2_resumes_under_ep4(four_rank, references):
    """The experts' weights and optimizer states are redistributed from EP2 to EP4."""
    result = four_rank["resume_ep2_ckpt_as_ep4"]
    assert result["iterations"] == [4, 5]
    assert_matches(result, references["swiglu_reference"])


def test_tolerance_rejects_another_model(references):
    """The comparison can fail: the two reference models' runs are far apart."""
    with pytest.raises(AssertionError):
        assert_matches(references["mixed_reference"], references["swiglu_reference"])
