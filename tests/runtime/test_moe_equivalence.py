"""Megatron-Core's MoE layers under expert parallelism agree with one process, step by step.

One process trains each tiny MoE model (worker_models: a Mixtral-like model, every layer MoE without
biases, plus a shared expert; and GPT layers with biases where every second one is a MoE) and saves
its initial weights; every parallel case on 4 gloo ranks loads them (through dist_checkpointing,
which reshards the experts over EP), trains the same 5 global batches and must match:

- EP2 x expert-DP2 (dense DP4), alltoall dispatcher;
- EP2 with TP2 + sequence parallel (expert TP defaults to TP: EP2 x ETP2), alltoall;
- EP2 with PP2, alltoall;
- the mixed dense/MoE model at EP2 x DP4 with the allgather dispatcher, and at TP2 + SP with EP2 and
  expert TP 1 (biases need it) and the allgather dispatcher;
- under context parallelism 2 (flash core attention): the SwiGLU model at EP2 x DP2 (aux_loss) and the
  DeepSeek-style model at EP2 x TP2 + SP (seq_aux_loss, expert bias), the experts' groups spanning the
  tp x cp x dp ranks and the router's losses reduced over the tp-cp group;
- the DeepSeek-style model at EP2 x TP2 + SP with --moe-shared-expert-overlap (the shared expert's own
  sequence-parallel gather and reduce-scatter, run beside the dispatcher; the SwiGLU model's ep2_tp2_sp runs
  it in the layer).

Every case starts from the single process's weights (EP1), resharded onto its EP degree; a full
checkpoint (weights, optimizer, schedule) saved at iteration 3 under EP2 resumes under EP4, and
iterations 4 and 5 continue the uninterrupted run.

Every case uses micro-batches of one sequence, as the reference does: the load-balancing loss is
computed per micro-batch (over the TP/SP ranks' tokens), so its value and gradient depend on
which tokens share a micro-batch, not on the layout.

Hybrid plans (per-layer layouts, runtime/hybrid) train a DeepSeek-style model (a dense first layer, then
MoE layers, routed as DeepSeek-V3 routes: DEEPSEEK_ROUTER; the stock runtime trains it under EP2 x TP2 too)
whose load-balancing loss is sequence-level (seq_aux_loss): a hybrid layer's ranks hold
micro-batches of 1 or 2 sequences depending on its DP degree, and only a per-sequence loss is the same
whatever the grouping. The cases give dense and MoE layers different layouts (TP2 + SP beside DP4),
MoE layers different EP and expert-TP degrees (EP4, EP2 x ETP1 under TP2, EP2 x ETP2), and PP2.
"""
from __future__ import annotations

import math

import pytest

from validation.launcher import run_cases
from worker_stats import thread_bound

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
HYBRID_RTOL = 1e-6
"""Hybrid cases, relative. Measured at most 1.2e-7 (2 fp32 ulps) over every loss, gradient norm and
logged aux loss of their 5 steps, so 1e-6 leaves an 8x margin. It is tighter than RTOL because two
faults this runtime had sit between the two: the experts of a MoE layer reduced in the DDP of a dense
layer with the same TP/DP (over the wrong group: 2.4e-6 on the gradient norm) and megatron-core's
per-token aux-loss weighting under SP (3.2e-5; patches/moe_per_token_aux_loss_tp.py)."""
BATCH = {"global_batch_size": 8, "micro_batch_size": 1}
ROUTER = {"router_dtype": "fp32"}
DEEPSEEK_ROUTER = {**ROUTER, "router_score_function": "sigmoid", "router_topk_scaling_factor": 2.5,
                   "router_expert_bias": True, "router_bias_update_rate": 1e-2, "router_num_groups": 2,
                   "router_group_topk": 1}
"""DeepSeek-V3's router at test size: sigmoid scores, auxiliary-loss-free balancing (an expert bias moved by
the rate after every global batch) and group-limited routing (2 groups of 2 experts, a token's 2 experts from
1 group). The rate is 10x Megatron-LM's default so that each update moves a bias by 0.01, past the gaps
between the scores (sigmoid of logits ~0.1): the bias changes routes, and a layout that counted the tokens
wrongly or lost the bias in a checkpoint would route differently (DEEPSEEK_OTHER_RATE shows it does). With
both experts of a group picked together, the groups' counts alternate, and so does the bias (0 or 0.01)."""
DEEPSEEK_SEED = {"seed": 1}
"""Sigmoid scores sit near 0.5 and move at a quarter of the logits' rate, so the selection margins are small:
over seeds 1-8 the reference's smallest margin was 1.1e-6 to 3.6e-5 (seed 1: 3.6e-5, the widest; the others
fall below or near ROUTER_GAP_MIN, which the reference's check would report)."""
DEEPSEEK = {"model": "deepseek_moe", "settings": DEEPSEEK_SEED}
FLASH = {"attention_backend": "flash"}


def _reference_cases(tmp) -> list[dict]:
    return [
        {"name": "swiglu_reference", "model": "swiglu_moe", "flags": BATCH, "moe": ROUTER, "settings": SWIGLU_SEED,
         "save_initial": str(tmp / "init_swiglu")},
        {"name": "mixed_reference", "model": "mixed_moe", "flags": BATCH, "moe": ROUTER,
         "save_initial": str(tmp / "init_mixed")},
        {"name": "deepseek_reference", **DEEPSEEK, "flags": BATCH, "moe": DEEPSEEK_ROUTER,
         "save_state": str(tmp / "init_deepseek.pt"), "save_initial": str(tmp / "init_deepseek")},
    ]


TP2DP2 = {"tp": 2, "dp": 2, "sp": True, "zero": 1}
HYBRID_PLANS = {
    "hybrid_dense_tp2dp2_moe_ep4_ep2_and_ep2etp1_tp2": {
        "chunks": [[TP2DP2, {"dp": 4, "ep": 4, "zero": 1}, {"dp": 4, "ep": 2},
                    {"tp": 2, "dp": 2, "sp": True, "ep": 2, "etp": 1}]], "embedding": TP2DP2},
    "hybrid_dense_dp4_moe_ep2etp2_tp2dp2_ep4": {
        "chunks": [[{"dp": 4}, {"tp": 2, "dp": 2, "sp": True, "ep": 2, "etp": 2, "zero": 1}, TP2DP2,
                    {"dp": 4, "ep": 4}]], "embedding": {"dp": 4, "zero": 1}},
    "hybrid_pp2_dense_dp2_moe_tp2ep2etp1_then_ep2_tp2": {
        "chunks": [[{"dp": 2}, {"tp": 2, "sp": True, "ep": 2, "etp": 1}],
                   [{"dp": 2, "ep": 2, "zero": 1}, {"tp": 2, "sp": True}]], "embedding": {"dp": 2, "zero": 1}},
}


DEEPSEEK_OTHER_RATE = "deepseek_ep2_bias_rate_2e-2"
"""The negative control of the expert bias: the same run with twice the bias update rate."""


def _hybrid_cases(tmp) -> list[dict]:
    return [{"name": name, **DEEPSEEK, "flags": BATCH, "moe": DEEPSEEK_ROUTER, "hybrid": plan,
             "init_state": str(tmp / "init_deepseek.pt")} for name, plan in HYBRID_PLANS.items()]


def _four_rank_cases(tmp) -> list[dict]:
    swiglu = {"model": "swiglu_moe", "load_weights": str(tmp / "init_swiglu"), "settings": SWIGLU_SEED}
    mixed = {"model": "mixed_moe", "load_weights": str(tmp / "init_mixed")}
    allgather = {**ROUTER, "token_dispatcher": "allgather"}
    deepseek = {**DEEPSEEK, "moe": DEEPSEEK_ROUTER, "load_weights": str(tmp / "init_deepseek")}
    return [
        {"name": "ep2_dp4", "flags": {**BATCH, "ep": 2}, "moe": ROUTER, **swiglu,
         "save": str(tmp / "swiglu_ep2"), "save_interval": 3},
        {"name": "ep2_tp2_sp", "flags": {**BATCH, "ep": 2, "tp": 2,
                                          "sequence_parallel": True}, "moe": ROUTER, **swiglu},
        {"name": "ep2_pp2", "flags": {**BATCH, "ep": 2, "pp": 2}, "moe": ROUTER,
         **swiglu},
        {"name": "mixed_ep2_dp4_allgather", "flags": {**BATCH, "ep": 2}, "moe": allgather, **mixed},
        {"name": "mixed_ep2_etp1_tp2_sp_allgather",
         "flags": {**BATCH, "ep": 2, "etp": 1, "tp": 2,
                   "sequence_parallel": True}, "moe": allgather, **mixed},
        {"name": "resume_ep2_ckpt_as_ep4", "model": "swiglu_moe",
         "flags": {**BATCH, "ep": 4}, "moe": ROUTER,
         "settings": SWIGLU_SEED, "resume": str(tmp / "swiglu_ep2"), "resume_step": 3},
        {"name": "resume_ep2_ckpt_at_ep1", "model": "swiglu_moe", "flags": BATCH, "moe": ROUTER,
         "settings": SWIGLU_SEED, "resume": str(tmp / "swiglu_ep2"), "resume_step": 3},
        {"name": "deepseek_ep2_tp2_sp", "flags": {**BATCH, "ep": 2, "tp": 2,
                                                   "sequence_parallel": True}, **deepseek,
         "moe": {**DEEPSEEK_ROUTER, "shared_expert_overlap": True},
         "save": str(tmp / "deepseek_ep2"), "save_interval": 3},
        {"name": "resume_deepseek_ep2_ckpt_as_ep4", **DEEPSEEK, "flags": {**BATCH, "ep": 4},
         "moe": DEEPSEEK_ROUTER, "resume": str(tmp / "deepseek_ep2"), "resume_step": 3},
        {**deepseek, "name": DEEPSEEK_OTHER_RATE, "flags": {**BATCH, "ep": 2},
         "moe": {**DEEPSEEK_ROUTER, "router_bias_update_rate": 2e-2}},
        # Context parallelism (the flash core, which CP runs on): each rank routes its half of every sequence.
        {"name": "ep2_cp2_dp2", "flags": {**BATCH, "ep": 2, "cp": 2}, "moe": ROUTER,
         **swiglu, "settings": {**SWIGLU_SEED, **FLASH}},
        {"name": "deepseek_ep2_cp2_tp2_sp", "flags": {**BATCH, "ep": 2, "cp": 2,
                                                       "tp": 2, "sequence_parallel": True},
         **deepseek, "settings": {**DEEPSEEK_SEED, **FLASH}},
    ]


REFERENCE_OF = {"swiglu_moe": "swiglu_reference", "mixed_moe": "mixed_reference",
                "deepseek_moe": "deepseek_reference"}
FOUR_RANK_NAMES = [c["name"] for c in _four_rank_cases(__import__("pathlib").Path("."))
                   if "at_ep1" not in c["name"] and c["name"] != DEEPSEEK_OTHER_RATE]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("moe_equivalence")


@pytest.fixture(scope="module")
def references(workdir) -> dict:
    return run_cases(workdir, 1, "equivalence_worker.py", _reference_cases(workdir), timeout_s=300)


@pytest.fixture(scope="module")
def four_rank(workdir, references) -> dict:
    return run_cases(workdir, 4, "equivalence_worker.py", _four_rank_cases(workdir) + _hybrid_cases(workdir),
                     timeout_s=600)


def relative_gaps(result: dict, reference: dict) -> list[float]:
    """|ours - reference| / |reference| of every loss, gradient norm and load-balancing loss compared."""
    gaps = []
    for index, iteration in enumerate(result["iterations"]):
        logged = reference["moe_losses"][iteration - 1]
        pairs = [(result["losses"][index], reference["losses"][iteration - 1]),
                 (result["grad_norms"][index], reference["grad_norms"][iteration - 1])]
        pairs += [(result["moe_losses"][index][name], logged[name]) for name in LOAD_BALANCING if name in logged]
        gaps += [abs(ours - ref) / abs(ref) for ours, ref in pairs]
    return gaps


LOAD_BALANCING = ("load_balancing_loss", "seq_load_balancing_loss")


def assert_matches(result: dict, reference: dict, rtol: float = RTOL) -> None:
    assert "error" not in result, result.get("error")
    assert result["iterations"], "the case ran no iteration"
    worst = max(relative_gaps(result, reference))
    assert worst <= rtol, f"relative difference {worst:.2e} > {rtol:g}: {result} vs {reference}"


@pytest.mark.parametrize("which", list(REFERENCE_OF.values()))
def test_references_learn_with_aux_losses_and_clear_routing(references, which):
    reference = references[which]
    assert reference["iterations"] == list(range(1, STEPS + 1))
    assert len(set(reference["losses"])) == STEPS and all(map(math.isfinite, reference["losses"]))
    assert all(any(step.get(name, 0) > 0 for name in LOAD_BALANCING) for step in reference["moe_losses"])
    assert reference["router_gap"] > ROUTER_GAP_MIN, reference["router_gap"]


def test_swiglu_reference_logs_its_z_loss(references):
    assert all(step["z_loss"] > 0 for step in references["swiglu_reference"]["moe_losses"])


@pytest.mark.parametrize("name", FOUR_RANK_NAMES)
def test_four_ranks_match_single_process(four_rank, references, name):
    case = next(c for c in _four_rank_cases(__import__("pathlib").Path(".")) if c["name"] == name)
    assert_matches(four_rank[name], references[REFERENCE_OF[case["model"]]])


@pytest.mark.parametrize("name", list(HYBRID_PLANS))
def test_hybrid_plans_match_single_process(four_rank, references, name):
    """Every loss, gradient norm and logged load-balancing loss within HYBRID_RTOL, routing clear of ties."""
    result = four_rank[name]
    assert_matches(result, references["deepseek_reference"], HYBRID_RTOL)
    assert result["router_gap"] > ROUTER_GAP_MIN, result["router_gap"]


def test_hybrid_plan_logs_the_z_loss_of_one_process(four_rank, references):
    """The per-layer reduction of the logged losses (moe_metrics.reduce_per_layer): the z-loss too."""
    result = four_rank["hybrid_dense_tp2dp2_moe_ep4_ep2_and_ep2etp1_tp2"]
    ours = [step["z_loss"] for step in result["moe_losses"]]
    theirs = [step["z_loss"] for step in references["deepseek_reference"]["moe_losses"]]
    assert ours == pytest.approx(theirs, rel=HYBRID_RTOL)


def test_shared_expert_overlap_runs_where_asked(four_rank):
    """--moe-shared-expert-overlap reached every MoE layer of its case (and its match is checked above) and no
    other case's."""
    assert four_rank["deepseek_ep2_tp2_sp"]["shared_expert_overlap_layers"] == 3
    assert four_rank["ep2_tp2_sp"]["shared_expert_overlap_layers"] == 0


def test_context_parallel_cases_split_every_sequence(four_rank):
    for name in ("ep2_cp2_dp2", "deepseek_ep2_cp2_tp2_sp"):
        assert four_rank[name]["cp_size"] == 2, name
        assert four_rank[name]["router_gap"] > ROUTER_GAP_MIN, name


def test_checkpoint_of_ep2_resumes_under_ep4(four_rank, references):
    """The experts' weights and optimizer states are redistributed from EP2 to EP4."""
    result = four_rank["resume_ep2_ckpt_as_ep4"]
    assert result["iterations"] == [4, 5]
    assert_matches(result, references["swiglu_reference"])


def test_checkpoint_of_ep2_resumes_fully_at_ep1(four_rank, references):
    """At EP2 megatron-core steps the experts with an optimizer of their own, at EP1 one optimizer steps
    everything, and their optimizer states are laid out differently: the load reads it per parameter in model
    space (runtime/model_space_optimizer.py), and iterations 4 and 5 match the uninterrupted run."""
    result = four_rank["resume_ep2_ckpt_at_ep1"]
    assert result["iterations"] == [4, 5]
    assert_matches(result, references["swiglu_reference"])


def test_tolerance_rejects_another_model(references):
    """The comparison can fail: the two reference models' runs are far apart."""
    with pytest.raises(AssertionError):
        assert_matches(references["mixed_reference"], references["swiglu_reference"])


def test_expert_bias_moves_and_steers_the_routes(four_rank, references):
    """The reference's bias moved (by whole steps of the rate), each layout's moved with it (checked through the
    losses above), and a run whose bias moves at another rate leaves the tolerance: the bias changes routes."""
    reference = references["deepseek_reference"]
    assert reference["expert_bias_max"] >= 1e-2 - 1e-9, reference["expert_bias_max"]
    for name in ("deepseek_ep2_tp2_sp", *HYBRID_PLANS):
        assert four_rank[name]["expert_bias_max"] >= 1e-2 - 1e-9, name
    other = four_rank[DEEPSEEK_OTHER_RATE]
    assert "error" not in other and other["expert_bias_max"] >= 2e-2 - 1e-9, other
    with pytest.raises(AssertionError, match="relative difference"):
        assert_matches(other, reference)


def test_checkpoint_keeps_the_expert_bias(four_rank, references):
    """A checkpoint saved under EP2 x TP2 at iteration 3 resumes under EP4 with the bias it had learned."""
    result = four_rank["resume_deepseek_ep2_ckpt_as_ep4"]
    assert result["iterations"] == [4, 5]
    assert_matches(result, references["deepseek_reference"])


def test_closing_each_moe_layouts_session_ends_its_groups_threads(four_rank):
    """A closed MoE model outlived its session through its token dispatchers' last routing probabilities, whose
    autograd graph holds DDP's hooks and so the model and its gloo groups (runtime/teardown.py,
    forget_autograd_graphs): each 4-rank case left its groups' threads behind. The bound, stated by
    worker_stats.thread_bound, is the first case's count plus less than one gloo group's threads."""
    closed = [result["threads_closed"] for result in four_rank.values() if "threads_closed" in result]
    assert len(closed) > 5 and max(closed) <= thread_bound(closed), (thread_bound(closed), closed)
