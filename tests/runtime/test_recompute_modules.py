"""--recompute-modules: the bytes each module's selective recompute frees in the runtime's layer are the
bytes the cost model takes off (cost.layer_cost: the dense part's and the routed experts' activations), a
MoE layer keeps what the cost model counts, the gradients are unchanged, and a run recomputing them trains
as the plain run does."""
from __future__ import annotations

import re

import pytest

from validation.launcher import launch, run_cases
from worker_stats import thread_bound
from megatron_auto.cost.layer_cost import layer_cost
from megatron_auto.plan import LayerStrategy
from megatron_auto.specs.model import MLASpec, uniform_model
from megatron_auto.specs.presets import CLUSTER_PRESETS
from megatron_auto.specs.training import TrainingSpec

SEQ, BATCH = 16, 2  # recompute_modules_worker.py's
GPT = dict(num_layers=1, hidden_size=64, num_attention_heads=4, seq_length=SEQ, vocab_size=128)
# SwiGLU, no linear biases, GQA; LayerNorm, whose saved tensors are ATen's on every device (torch's eager
# RMSNorm keeps its normalized input too on CPU, which the formula does not count yet).
SWIGLU = dict(GPT, swiglu=True, add_bias_linear=False, num_query_groups=2, ffn_hidden_size=128)
# Attention as Llama-3 and Qwen3 run it: RoPE with grouped queries (and multi-query), and the q/k norms.
LLAMA = dict(SWIGLU, position_embedding_type="rope", rotary_base=500000)
QWEN = dict(LLAMA, qk_layernorm=True)
MQA = dict(GPT, num_query_groups=1, position_embedding_type="rope")
# Every kind of query grouping (multi-head, grouped, multi-query) with and without RoPE and q/k norms.
ATTENTION_CASES = [
    {"name": f"attention-g{groups}{'-rope' if rope else ''}{'-qknorm' if qk else ''}",
     "model": dict(GPT, num_query_groups=groups, qk_layernorm=qk,
                   position_embedding_type="rope" if rope else "learned_absolute"), "modules": ["core_attn"]}
    for groups in (4, 2, 1) for rope in (False, True) for qk in (False, True)]
# Every layer MoE: 4 experts, top-2, SwiGLU with a shared expert; 8 experts, top-3, GeLU with biases.
MOE = dict(GPT, swiglu=True, add_bias_linear=False, ffn_hidden_size=128, num_experts=4, moe_router_topk=2,
           moe_ffn_hidden_size=48, moe_shared_expert_intermediate_size=32)
GELU_MOE = dict(GPT, num_experts=8, moe_router_topk=3, moe_ffn_hidden_size=48)
# Multi-latent attention (MLASpec keywords under "mla"): a query latent with latent norms, and neither.
MLA_Q = dict(GPT, position_embedding_type="rope", qk_layernorm=True,
             mla=dict(kv_lora_rank=32, qk_head_dim=16, qk_pos_emb_head_dim=8, v_head_dim=12, q_lora_rank=24))
MLA_PLAIN = dict(GPT, position_embedding_type="rope",
                 mla=dict(kv_lora_rank=32, qk_head_dim=16, qk_pos_emb_head_dim=8, v_head_dim=12))
MLA_CASES = [{"name": f"mla-{name}-{'-'.join(modules)}", "model": model, "modules": modules}
             for name, model in (("q", MLA_Q), ("plain", MLA_PLAIN))
             for modules in (["core_attn"], ["mla_up_proj"], ["mla_up_proj", "core_attn"])]
CPU = CLUSTER_PRESETS["cpu-gloo"]
CASES = [
    {"name": "gpt-core_attn", "model": GPT, "modules": ["core_attn"]},
    {"name": "gpt-layernorm", "model": GPT, "modules": ["layernorm"]},
    {"name": "gpt-core_attn-layernorm", "model": GPT, "modules": ["core_attn", "layernorm"]},
    {"name": "swiglu-mlp", "model": SWIGLU, "modules": ["mlp"]},
    {"name": "swiglu-mlp-layernorm", "model": SWIGLU, "modules": ["mlp", "layernorm"]},
    {"name": "swiglu-all", "model": SWIGLU, "modules": ["core_attn", "mlp", "layernorm"]},
    {"name": "llama-core_attn", "model": LLAMA, "modules": ["core_attn"]},
    {"name": "qwen-core_attn-mlp", "model": QWEN, "modules": ["core_attn", "mlp"]},
    {"name": "mqa-core_attn-layernorm", "model": MQA, "modules": ["core_attn", "layernorm"]},
    {"name": "moe-moe", "model": MOE, "modules": ["moe"]},
    {"name": "moe-shared_experts", "model": MOE, "modules": ["shared_experts"]},
    {"name": "moe-core_attn-layernorm-shared_experts", "model": MOE,
     "modules": ["core_attn", "layernorm", "shared_experts"]},
    {"name": "moe-all", "model": MOE, "modules": ["core_attn", "layernorm", "moe", "shared_experts"]},
    {"name": "gelu-moe-moe", "model": GELU_MOE, "modules": ["moe"]},
    *ATTENTION_CASES,
    *MLA_CASES,
]


def case_layer(case: dict):
    """Layer 0 of the case's model (uniform_model keywords; "mla" holds MLASpec keywords)."""
    keywords = dict(case["model"])
    if "mla" in keywords:
        keywords["mla"] = MLASpec(**keywords["mla"])
    return uniform_model(case["name"], **keywords).layers[0]


def kept_bytes(case: dict, recompute: str) -> float:
    """The layer's activations as the cost model counts them: fp32 on cpu-gloo, unfused attention."""
    layer = case_layer(case)
    training = TrainingSpec(BATCH, precision="fp32", param_bytes=4, attention_backend="unfused",
                            recompute_modules=tuple(case["modules"]))
    strategy = LayerStrategy(tp=1, dp=1, recompute=recompute)
    return layer_cost(layer, strategy, BATCH, SEQ, CPU, training).activation_bytes


@pytest.fixture(scope="module")
def measured(tmp_path_factory) -> dict:
    return run_cases(tmp_path_factory.mktemp("recompute_modules"), 1, "recompute_modules_worker.py", CASES, 300)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c["name"])
def test_each_module_frees_the_bytes_the_cost_model_takes_off(measured, case):
    """Measured saved bytes (storages alive once the forward returned) without recompute minus with it,
    against the formula's same difference, fp32 on CPU (cpu-gloo's 4-byte dropout masks; dropout is
    outside every recomputed module, so it cancels). Exact for mlp and layernorm: the formula counts whole
    tensors. With core_attn the checkpoint also frees the cached s x s causal mask, which the formula
    leaves out on purpose (one per run, shared by the layers), and keeps one 4-byte scalar input."""
    result = measured[case["name"]]
    freed = result["none"] - result["selective"]
    causal_mask = SEQ * SEQ if "core_attn" in case["modules"] else 0
    assert freed == kept_bytes(case, "none") - kept_bytes(case, "selective") + causal_mask - (4 if causal_mask else 0)
    # The same fp32 ops on the same inputs; recomputing a norm moves its gradient's add into a hook, which
    # may reorder one sum: a few ulps of the largest gradient (fp32 epsilon 2^-23).
    assert result["gradient_max_diff"] <= 8 * 2.0**-23 * result["gradient_max"]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c["name"])
def test_each_layer_keeps_what_the_cost_model_counts(measured, case):
    """Without recompute, the layer's saved bytes are the cost model's, exactly, but for the cached s x s
    causal mask that the formula leaves out on purpose: Q, K and V as the attention keeps them with grouped
    queries, RoPE and q/k norms (cost.memory.qkv_kept_width), and for a MoE layer its dense part plus its
    routed experts (cost.moe.expert_activation_bytes: at EP1 every one of the k x T routed copies is
    processed, whatever the routing)."""
    assert measured[case["name"]]["none"] == kept_bytes(case, "none") + SEQ * SEQ


def test_case_after_case_in_one_process_does_not_pile_up_threads(measured):
    """One process builds the runtime's layer for every case in turn over one set of Megatron groups (made once):
    a case leaves nothing behind that holds threads, so every case ends within worker_stats.thread_bound of
    the first (its count plus less than one gloo group's threads)."""
    threads = [measured[case["name"]]["threads"] for case in CASES]
    assert len(threads) > 5 and max(threads) <= thread_bound(threads), (thread_bound(threads), threads)


def _split_cases(tp: int, ep: int, etp: int, models) -> list[dict]:
    return [{"name": f"{name}-tp{tp}-ep{ep}-etp{etp}-{dispatcher}", "model": model, "dispatcher": dispatcher,
             "tp": tp, "ep": ep, "etp": etp} for name, model in models for dispatcher in ("alltoall", "allgather")]


# Three ways to split a MoE layer over 2 ranks; expert TP needs experts without biases (Megatron's assert).
SPLIT_LAUNCHES = [_split_cases(1, 2, 1, (("moe", MOE), ("gelu-moe", GELU_MOE))),
                  _split_cases(1, 1, 2, (("moe", MOE),)),
                  _split_cases(2, 1, 2, (("moe", MOE),))]


@pytest.fixture(scope="module")
def measured_splits(tmp_path_factory) -> dict:
    """{case name: every rank's result}, one 2-rank launch per split."""
    results = {}
    for cases in SPLIT_LAUNCHES:
        ranks = run_cases(tmp_path_factory.mktemp("moe_split"), 2, "moe_saved_worker.py", cases, 300)
        results.update({case["name"]: [rank[case["name"]] for rank in ranks] for case in cases})
    return results


@pytest.mark.parametrize("case", [case for cases in SPLIT_LAUNCHES for case in cases], ids=lambda c: c["name"])
def test_a_moe_layer_split_over_ranks_keeps_what_the_cost_model_counts(measured_splits, case):
    """EP2, expert-TP 2, or TP2 with SP (whose experts default to expert-TP 2), on 2 ranks, each routing its own
    tokens: the busiest rank, whose experts process `imbalance` times the mean k x T x etp copies (T: its
    s/tp tokens), keeps the cost model's bytes for that imbalance exactly (but for the cached s x s causal mask,
    as above). The dispatchers differ in what they keep: alltoall the permutation's sorted index per routed
    copy at the source, allgather per processed copy, which only the imbalance shows, and the routing map of
    the tokens it gathered, which only expert TP shows."""
    ranks, tp, etp = measured_splits[case["name"]], case["tp"], case["etp"]
    busiest = max(ranks, key=lambda rank: rank["processed"])
    layer = uniform_model(case["name"], **case["model"]).layers[0]
    routed = layer.moe.router_topk * SEQ // tp * BATCH
    assert sum(rank["processed"] for rank in ranks) == 2 * routed * etp
    training = TrainingSpec(BATCH, precision="fp32", param_bytes=4, attention_backend="unfused",
                            moe_token_dispatcher=case["dispatcher"],
                            moe_load_imbalance=busiest["processed"] / (routed * etp))
    strategy = LayerStrategy(tp=tp, sp=tp > 1, dp=2 // tp, ep=case["ep"], etp=etp)
    assert busiest["saved"] == layer_cost(layer, strategy, BATCH, SEQ, CPU, training).activation_bytes + SEQ * SEQ


def _losses(output: str) -> list[str]:
    return re.findall(r"iteration +\d+/ +\d+ \|.*\| lm loss: (\S+) \|", output)


def test_a_run_recomputing_every_module_trains_as_the_plain_one(tmp_path):
    """TP2 with SP on 2 ranks, Llama-style (no linear biases): recomputing core_attn, mlp and layernorm
    re-runs the same fp32 ops on the same inputs and dropout streams; only a norm gradient's summation order
    may move (a few fp32 ulps, as above), which Adam carries into the weights at lr x that relative change:
    the logged losses (about 5.5, printed to 7 digits) agree within 1e-5."""
    job = ["tools/pretrain_gpt.py", "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
           "--seq-length", "64", "--max-position-embeddings", "64", "--micro-batch-size", "2",
           "--global-batch-size", "8", "--train-iters", "4", "--lr", "3e-3", "--mock-data", "--tokenizer-type",
           "NullTokenizer", "--vocab-size", "128", "--log-interval", "1", "--eval-iters", "0", "--swiglu",
           "--normalization", "RMSNorm", "--disable-bias-linear", "--tensor-model-parallel-size", "2",
           "--sequence-parallel"]
    plain = launch(2, job, 300, tmp_path / "plain")
    recomputed = launch(2, job + ["--recompute-granularity", "selective", "--recompute-modules", "core_attn", "mlp",
                                  "layernorm"], 300, tmp_path / "recomputed")
    assert plain.ok and recomputed.ok, (plain.output + recomputed.output)[-5000:]
    assert "selective recompute re-runs: core_attn mlp layernorm" in recomputed.output
    plain_losses, recomputed_losses = _losses(plain.output), _losses(recomputed.output)
    assert len(plain_losses) == 4 and len(recomputed_losses) == 4
    assert all(abs(float(a) - float(b)) <= 1e-5 for a, b in zip(plain_losses, recomputed_losses))


def test_a_moe_run_recomputing_its_moe_layers_trains_as_the_plain_one(tmp_path):
    """EP2 on 2 ranks, every layer MoE with a shared expert and an auxiliary loss: recomputing the MoE layers
    (moe, which covers the shared expert) re-runs the router, dispatch and experts on the same inputs in
    fp32, with the same ops in the same order. The checkpointed forward runs without grad, so the router adds
    its auxiliary loss in the re-run alone, once per step as the plain run does. What may move is the order
    of a gradient sum where the checkpoint's backward joins the residual stream: a few fp32 ulps, which Adam
    carries into the weights at lr x that relative change. The run is deterministic (fixed seeds, one
    thread per rank, gloo's fixed reduction order), and the logged losses (about 6, printed to 7 digits)
    agree within 1e-5, ten steps of their last digit."""
    job = ["tools/pretrain_gpt.py", "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
           "--seq-length", "64", "--max-position-embeddings", "64", "--micro-batch-size", "2",
           "--global-batch-size", "8", "--train-iters", "4", "--lr", "3e-3", "--mock-data", "--tokenizer-type",
           "NullTokenizer", "--vocab-size", "128", "--log-interval", "1", "--eval-iters", "0", "--swiglu",
           "--disable-bias-linear", "--num-experts", "4", "--moe-router-topk", "2", "--moe-ffn-hidden-size", "48",
           "--moe-shared-expert-intermediate-size", "32", "--moe-aux-loss-coeff", "1e-2",
           "--expert-model-parallel-size", "2"]
    plain = launch(2, job, 300, tmp_path / "plain")
    recomputed = launch(2, job + ["--recompute-granularity", "selective", "--recompute-modules", "moe"], 300,
                        tmp_path / "recomputed")
    assert plain.ok and recomputed.ok, (plain.output + recomputed.output)[-5000:]
    assert "selective recompute re-runs: moe" in recomputed.output
    plain_losses, recomputed_losses = _losses(plain.output), _losses(recomputed.output)
    assert len(plain_losses) == 4 and len(recomputed_losses) == 4
    assert all(abs(float(a) - float(b)) <= 1e-5 for a, b in zip(plain_losses, recomputed_losses))


def test_split_layer_case_after_case_does_not_pile_up_threads(measured_splits):
    """Each 2-rank launch builds its split's layer for case after case: every rank ends each case within
    worker_stats.thread_bound of the launch's first case (its count plus less than one gloo group's threads)."""
    for cases in SPLIT_LAUNCHES:
        for rank in range(2):
            threads = [measured_splits[case["name"]][rank]["threads"] for case in cases]
            assert max(threads) <= thread_bound(threads), (thread_bound(threads), threads)


# MLA at TP2 with SP on 2 ranks: the latents' sequence shards (the query's a view of the whole gathered latent).
MLA_TP2_CASES = [{"name": f"mla-{name}-tp2{'-' + '-'.join(modules) if modules else ''}", "model": model,
                  "dispatcher": "alltoall", "tp": 2, "ep": 1, "etp": 1, **({"modules": modules} if modules else {})}
                 for name, model in (("q", MLA_Q), ("plain", MLA_PLAIN)) for modules in ([], ["mla_up_proj"])]


@pytest.fixture(scope="module")
def measured_mla_tp2(tmp_path_factory) -> dict:
    ranks = run_cases(tmp_path_factory.mktemp("mla_tp2"), 2, "moe_saved_worker.py", MLA_TP2_CASES, 300)
    return {case["name"]: [rank[case["name"]] for rank in ranks] for case in MLA_TP2_CASES}


@pytest.mark.parametrize("case", MLA_TP2_CASES, ids=lambda c: c["name"])
def test_an_mla_layer_under_tp2_sp_keeps_what_the_cost_model_counts(measured_mla_tp2, case):
    """Each rank of an MLA layer at TP2 with SP keeps the cost model's bytes exactly (cost/mla.py
    mla_latent_bytes; but for the cached s x s causal mask, as above), with and without mla_up_proj."""
    modules = tuple(case.get("modules", ("core_attn",)))
    training = TrainingSpec(BATCH, precision="fp32", param_bytes=4, attention_backend="unfused",
                            recompute_modules=modules)
    strategy = LayerStrategy(tp=2, sp=True, dp=1, recompute="selective" if "modules" in case else "none")
    expected = layer_cost(case_layer(case), strategy, BATCH, SEQ, CPU, training).activation_bytes + SEQ * SEQ
    assert [rank["saved"] for rank in measured_mla_tp2[case["name"]]] == [expected, expected]
