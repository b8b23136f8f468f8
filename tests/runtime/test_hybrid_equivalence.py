"""Hybrid plans (per-layer TP/DP/ZeRO-1/ZeRO-3/recompute, PP with differing stage layouts) on gloo ranks
match one process of the stock Megatron-space runtime, loss and gradient norm, step by step.

Three launches: the single-process reference (which saves its initial weights), one 4-rank
launch running every 4-rank case in turn (including PP2 with two virtual stages per stage and
dropout cases), and one 8-rank launch (PP2). The main 4-rank plans run in bf16 too, against a
bf16 process (tolerance derived in precision_checks), and fp16 with dynamic loss scaling trains
a plan of ZeRO-3 and DDP layers.
"""
from __future__ import annotations

import math

import pytest

import precision_checks
from validation.launcher import run_cases
from worker_stats import thread_bound
from megatron_auto.plan import save_plan
from megatron_auto.runtime.planning import cluster_for_world
from megatron_auto.search import search_plan
from megatron_auto.search.constraints import SearchConstraints
from megatron_auto.specs.loaders import load_cluster
from megatron_auto.specs.model import uniform_model
from megatron_auto.specs.training import TrainingSpec

LOSS_RTOL = 1e-6
NORM_RTOL = 1e-4
"""fp32 tolerances. A plan changes the order of fp32 sums (TP partial sums, DP and regrouped
micro-batches, per-token scaling); a re-associated sum moves by about sqrt(n) unit roundoffs
(u = 2^-24 = 6e-8; Higham & Mary, SIAM J. Sci. Comput. 2019). The loss, a mean of 256 token
losses, stays within 1 ulp: measured at most 8.6e-8 (relative) over every fp32 plan here, and
LOSS_RTOL = 1e-6 (16 u) leaves a 11x margin. The gradient norm drifts from step to step, as
Adam divides each update by its gradient's own scale (a weight whose gradient is near the
rounding noise moves by up to 2 x lr either way): measured 1.3e-7 at step 1 growing to 1.0e-5
by step 4 (dp4_then_tp4, the largest), so NORM_RTOL = 1e-4 is a 10x margin. Both still fail a
run that differs in substance: a bf16 run misses the fp32 loss by 2.3e-5 at step 1 (23x) and a
run without its data-parallel gradient reduction misses the norm by 0.2 or more (2000x)."""
STEPS = 5
TP4 = {"tp": 4, "sp": True}
TP2DP2 = {"tp": 2, "dp": 2, "sp": True, "zero": 1}
DP4 = {"dp": 4, "zero": 1}
DP4_DDP = {"dp": 4, "zero": 0}
FOUR_RANK = {
    "tp4_then_tp2dp2": {"chunks": [[TP4, TP4, TP2DP2, TP2DP2]], "embedding": TP2DP2},
    "dp4_then_tp4": {"chunks": [[DP4, DP4, TP4, TP4]], "embedding": DP4},
    "ddp_and_distopt_layers_tp2_embedding": {"chunks": [[DP4_DDP, TP2DP2, DP4_DDP, TP4]],
                                             "embedding": {"tp": 2, "dp": 2, "zero": 0}},
    "zero3_layers_mixed_with_ddp_layers": {
        "chunks": [[{"dp": 4, "zero": 3}, {**TP2DP2, "zero": 3}, DP4_DDP, {**TP2DP2, "zero": 3, "recompute": "full"}]],
        "embedding": {"tp": 2, "dp": 2, "zero": 0}},
    "vpp2_pp2_tp2_and_dp2_chunks": {
        "chunks": [[{"tp": 2, "sp": True}], [{"dp": 2, "zero": 1}], [{"dp": 2, "zero": 0}],
                   [{"tp": 2, "sp": True, "recompute": "full"}]],
        "embedding": {"tp": 2, "sp": True}, "virtual_stages": 2, "micro_batches": 4},
    "recompute_on_some_layers": {"chunks": [[{**TP2DP2, "recompute": "full"}, TP2DP2,
                                             {**TP4, "recompute": "selective"}, DP4]], "embedding": DP4},
}
LLAMA_FOUR_RANK = {
    # RoPE tables reach every segment; RMSNorm under SP; 2 KV groups split over TP2 (TP4 would not divide them).
    "llama_tp2dp2_then_dp4_then_tp2dp2": {"chunks": [[TP2DP2, DP4, {**TP2DP2, "sp": False}, TP2DP2]],
                                          "embedding": TP2DP2},
    "llama_pp2_vpp2_tp2_and_dp2_chunks": FOUR_RANK["vpp2_pp2_tp2_and_dp2_chunks"],
}
MLA_PLAN = {"chunks": [[TP2DP2, {"tp": 2, "dp": 2, "zero": 3}, DP4, TP4]], "embedding": TP2DP2}
"""Multi-latent attention (worker_models.mla_model) in layers of their own TP groups: TP2 with SP, ZeRO-3 at TP2
(whose latent norms' gradients each TP rank holds whole), DP4 and TP4 (heads and latents split four ways)."""
MLA_SETTINGS = {"rotary_scaling_factor": 40.0, "mscale": 0.707, "mscale_all_dim": 0.707}
"""DeepSeek-V2's YaRN, as tests/runtime/test_equivalence.py's MLA cases."""
DROPOUT_PLAN = {"chunks": [[{"tp": 4}, TP2DP2, DP4, TP4]], "embedding": TP2DP2}
"""TP4 without SP (attention dropout in the TP region), TP2xDP2 and TP4 with SP (hidden dropout too)."""
EIGHT_RANK = {
    "pp2_tp4_tp2dp2_then_dp4_tp4": {"chunks": [[TP4, TP2DP2], [DP4, TP4]], "embedding": TP2DP2},
}


def planner_plan(path) -> None:
    """The planner's hybrid-space plan for the test model on 4 cpu-gloo ranks (ZeRO 0/1/3 all allowed)."""
    model = uniform_model("hybrid-gpt", num_layers=4, hidden_size=64, num_attention_heads=4,
                          seq_length=32, vocab_size=256)
    training = TrainingSpec(global_batch_size=8, precision="fp32", param_bytes=4)
    result = search_plan(model, cluster_for_world(load_cluster("cpu-gloo"), 4), training, "hybrid",
                         SearchConstraints())
    save_plan(result.plan, path)


BF16_CASES = (*FOUR_RANK, "planner", "llama_tp2dp2_then_dp4_then_tp2dp2")
"""The layouts also run in bf16: every 4-rank GPT plan, the planner's, and one LLaMA plan."""
FP16_STEPS, FP16_SETTINGS = precision_checks.FP16_STEPS, precision_checks.FP16_PER_TOKEN_LOSS_SETTINGS


def bf16_case(case: dict) -> dict:
    """The same case in bf16, from the bf16 reference's initial weights."""
    out = {**case, "name": case["name"] + "_bf16", "settings": {"precision": "bf16"}}
    out["init"] = case["init"].replace(".pt", "_bf16.pt")
    return out


def _run(tmp, world_size: int, cases: list[dict], timeout_s: float) -> dict:
    return run_cases(tmp, world_size, "hybrid_worker.py", cases, timeout_s)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("hybrid")


@pytest.fixture(scope="module")
def references(workdir) -> dict:
    cases = [{"name": "reference", "reference": True, "init": str(workdir / "init.pt")},
             {"name": "llama_reference", "model": "llama", "reference": True, "init": str(workdir / "init_llama.pt")},
             {"name": "mla_reference", "model": "mla", "reference": True, "init": str(workdir / "init_mla.pt"),
              "settings": MLA_SETTINGS}]
    cases += [bf16_case(c) for c in cases if c["name"] != "mla_reference"]
    return _run(workdir, 1, cases, timeout_s=240)


@pytest.fixture(scope="module")
def reference(references) -> dict:
    return references["reference"]


@pytest.fixture(scope="module")
def four_rank(workdir, reference) -> dict:
    planner_plan(workdir / "planned.json")
    init = str(workdir / "init.pt")
    cases = [{"name": name, "plan": plan, "init": init} for name, plan in FOUR_RANK.items()]
    cases.append({"name": "planner", "plan": str(workdir / "planned.json"), "init": init})
    cases += [{"name": f"dropout_{run}", "plan": DROPOUT_PLAN, "init": init, "dropout": 0.1, "probe": True}
              for run in "ab"]
    cases += [{"name": name, "model": "llama", "plan": plan, "init": str(workdir / "init_llama.pt")}
              for name, plan in LLAMA_FOUR_RANK.items()]
    cases += [bf16_case(c) for c in cases if c["name"] in BF16_CASES]
    cases.append({"name": "mla_tp2_zero3_dp4_tp4", "model": "mla", "plan": MLA_PLAN,
                  "init": str(workdir / "init_mla.pt"), "settings": MLA_SETTINGS})
    cases.append({**bf16_case({"name": "dp4_then_tp4", "plan": FOUR_RANK["dp4_then_tp4"], "init": init}),
                  "name": "bf16_dropped_grad_sync", "drop_grad_sync": True})
    cases.append({"name": "fp16_zero3_mixed", "plan": FOUR_RANK["zero3_layers_mixed_with_ddp_layers"],
                  "steps": FP16_STEPS, "settings": FP16_SETTINGS, "data_vocab_size": precision_checks.LEARNABLE_VOCAB})
    return _run(workdir, 4, cases, timeout_s=480)


@pytest.fixture(scope="module")
def eight_rank(workdir, reference) -> dict:
    cases = [{"name": name, "plan": plan, "init": str(workdir / "init.pt")} for name, plan in EIGHT_RANK.items()]
    return _run(workdir, 8, cases, timeout_s=240)


def assert_matches(result: dict, reference: dict) -> None:
    assert len(result["losses"]) == STEPS
    for step, (loss, norm, ref_loss, ref_norm) in enumerate(
            zip(result["losses"], result["grad_norms"], reference["losses"], reference["grad_norms"]), 1):
        assert math.isclose(loss, ref_loss, rel_tol=LOSS_RTOL), f"step {step}: loss {loss} != {ref_loss}"
        assert math.isclose(norm, ref_norm, rel_tol=NORM_RTOL), f"step {step}: grad norm {norm} != {ref_norm}"


def test_reference_learns(reference):
    assert len(set(reference["losses"])) == STEPS and all(math.isfinite(x) for x in reference["grad_norms"])


@pytest.mark.parametrize("name", [*FOUR_RANK, "planner"])
def test_four_rank_hybrid_plans_match_single_process(four_rank, reference, name):
    assert_matches(four_rank[name], reference)


def test_dropout_runs_repeat_exactly_and_drop(four_rank, reference):
    a, b = four_rank["dropout_a"], four_rank["dropout_b"]
    assert a["losses"] == b["losses"] and a["grad_norms"] == b["grad_norms"]
    assert not math.isclose(a["losses"][0], reference["losses"][0], rel_tol=LOSS_RTOL)  # dropout is active


def test_tp_ranks_of_a_segment_draw_their_own_dropout_streams(four_rank):
    """Inside a TP region each TP rank has its own stream; outside it, a TP group draws alike."""
    probe = four_rank["dropout_a"]["probe"]
    assert [p["tp"] for p in probe] == [4, 2, 1, 4]
    for segment in probe:
        tp = segment["tp"]
        for first in range(0, 4, tp):
            inside = [tuple(x) for x in segment["inside"][first:first + tp]]
            outside = [tuple(x) for x in segment["outside"][first:first + tp]]
            assert len(set(inside)) == tp, f"tp{tp} ranks {first}..: shared TP-region masks {inside}"
            assert len(set(outside)) == 1, f"tp{tp} ranks {first}..: different masks outside TP regions"
    # Two segments with the same TP rank still draw different streams.
    assert probe[0]["inside"][0] != probe[3]["inside"][0]


@pytest.mark.parametrize("name", list(LLAMA_FOUR_RANK))
def test_llama_architecture_hybrid_plans_match_single_process(four_rank, references, name):
    assert_matches(four_rank[name], references["llama_reference"])


def test_multi_latent_attention_hybrid_plan_matches_single_process(four_rank, references):
    result = four_rank["mla_tp2_zero3_dp4_tp4"]
    assert "MLADotProductAttention" in result["kernels"]["cores"]
    assert_matches(result, references["mla_reference"])


@pytest.mark.parametrize("name", list(EIGHT_RANK))
def test_eight_rank_pipelined_hybrid_plans_match_single_process(eight_rank, reference, name):
    assert_matches(eight_rank[name], reference)


def assert_matches_in_bf16(result: dict, reference: dict) -> None:
    assert len(result["losses"]) == STEPS
    problems = precision_checks.bf16_mismatches(result, reference)
    assert not problems, "; ".join(problems)


@pytest.mark.parametrize("name", BF16_CASES)
def test_four_rank_hybrid_plans_match_single_process_in_bf16(four_rank, references, name):
    reference = references["llama_reference_bf16" if name.startswith("llama") else "reference_bf16"]
    assert_matches_in_bf16(four_rank[name + "_bf16"], reference)


def test_bf16_tolerance_rejects_the_fp32_run_and_a_dropped_gradient_reduction(four_rank, references):
    with pytest.raises(AssertionError):
        assert_matches_in_bf16(references["reference"], references["reference_bf16"])
    with pytest.raises(AssertionError):
        assert_matches_in_bf16(four_rank["bf16_dropped_grad_sync"], references["reference_bf16"])


def test_fp16_with_dynamic_loss_scaling_trains_zero3_and_ddp_parts(four_rank):
    precision_checks.assert_fp16_run_trains(four_rank["fp16_zero3_mixed"], FP16_SETTINGS)


def test_plan_after_plan_in_one_process_does_not_pile_up_threads(four_rank):
    """Each plan's groups (Megatron's and the hybrid runtime's own) are destroyed before the next plan's
    (distributed.destroy_parallel_groups). Without it, every plan left its gloo groups' threads behind, as in
    test_equivalence: the last rank ends no case with more than twice the threads of its first."""
    threads = [result["threads"] for result in four_rank.values()]
    assert len(threads) > 5 and max(threads) <= 2 * threads[0], threads


def test_closing_each_plans_session_ends_its_groups_threads(four_rank):
    """session.close destroys the groups a plan built (Megatron's and the hybrid runtime's own) and forgets what
    megatron-core and torch cache about them (runtime/teardown.py: groups parallel_state leaves set, RoPE's
    lru_cache'd forward, DTensor's mesh caches), so each plan ends where the first did: the main thread and the
    job's default group (4 threads, measured). The bound, stated by worker_stats.thread_bound, is the first
    plan's count plus less than one gloo group's threads: one group left alive per plan fails it. Without
    teardown.py the last rank grew from 7 to 28 threads over these plans."""
    closed = [result["threads_closed"] for result in four_rank.values()]
    assert len(closed) > 5 and max(closed) <= thread_bound(closed), (thread_bound(closed), closed)
