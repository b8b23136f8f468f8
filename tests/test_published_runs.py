"""megatron_auto/published_runs.py and benchmarks/published_h100.py: NVIDIA's published H100 runs, priced at
their own flags as `megatron-auto estimate` prices them."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.published_h100 import default_row_files, render
from megatron_auto.cost.flops import model_flops_per_iteration
from megatron_auto.published_runs import load_runs, megatron_lm_flops, price_run, run_from_row
from megatron_auto.specs.model import model_from_dict

SHARED = Path(__file__).resolve().parents[2] / "shared" / "reference" / "published_h100" / "runs.json"
ROW = {
    "id": "toy", "framework": "NeMo / Megatron-Core", "precision_class": "FP8", "num_layers": 32,
    "hidden_size": 4096, "num_attention_heads": 32, "num_query_groups": 8, "kv_channels": None,
    "ffn_hidden_size": 14336, "vocab_size": 128256, "swiglu": True, "untied_embeddings": True,
    "num_experts": None, "moe_router_topk": None, "moe_ffn_hidden_size": None, "seq_length": 8192,
    "num_gpus": 8, "gpus_per_node": 8, "global_batch_size": 128, "micro_batch_size": 1, "tp": 1, "pp": 1,
    "cp": 2, "vp": 1, "ep": None, "etp": None, "recompute": None,
    "measured": {"tokens_per_sec_per_gpu": 12273}, "derived": {"step_time_s_from_tokens": 10.68},
    "source": {"repo": "NVIDIA/NeMo", "path": "docs/x.md", "commit": "8e3d65dcfe"},
}


def test_megatron_lm_flops_is_our_count_for_a_gpt():
    gpt = {"num_layers": 24, "hidden_size": 2048, "num_attention_heads": 16, "seq_length": 4096,
           "vocab_size": 131072}
    assert megatron_lm_flops(gpt, 192) == pytest.approx(model_flops_per_iteration(model_from_dict(gpt), 192))


def test_a_row_becomes_estimate_flags_with_its_recipe_knobs():
    run = run_from_row(ROW)
    assert run.precision == "fp8" and run.measured_step_s == 10.68
    assert run.model["normalization"] == "RMSNorm" and run.model["untie_embeddings_and_output_weights"]
    flags = " ".join(run.flags)
    assert "--tp 1 --pp 1 --cp 2 --micro-batch-size 1 --virtual-stages 1" in flags
    # tp 1: no TP traffic to overlap; Megatron's fused bias + SwiGLU and TE's fused RoPE, as NeMo's configs run
    assert run.recipe == ("--grad-reduce-in-bf16", "--bias-fusions", "on", "--rope-fusion")
    assert "--tp-comm-overlap" in run_from_row({**ROW, "tp": 2}).recipe
    assert run.model["hidden_dropout"] == run.model["attention_dropout"] == 0.0  # NeMo's LlamaConfig
    gpt3 = run_from_row({**ROW, "model": "GPT3-175B", "swiglu": False}).model
    assert "hidden_dropout" not in gpt3  # Megatron-LM's default 0.1, as NeMo's gpt3 configs keep
    assert "--sequence-parallel" not in flags and "--distributed-optimizer" in flags


def test_a_rows_recipe_knobs_go_to_the_planner_and_its_layout_flags_to_estimate_alone():
    row = {**ROW, "estimate_flags": ["--fp8-recipe", "tensorwise", "--account-for-loss-in-pipeline-split",
                                     "--cross-entropy-loss-fusion", "--cross-entropy-fusion-impl", "te",
                                     "--use-megatron-fsdp"]}
    run = run_from_row(row)
    assert run.flags[-2:] == ("--account-for-loss-in-pipeline-split", "--use-megatron-fsdp")
    assert run.recipe[-5:] == ("--fp8-recipe", "tensorwise", "--cross-entropy-loss-fusion",
                               "--cross-entropy-fusion-impl", "te")
    assert "--fp8-recipe" not in run.flags


def test_cuda_graph_and_offload_knobs_of_a_row_are_recipe_knobs_with_all_their_values():
    knobs = ["--cuda-graph-impl", "transformer_engine", "--cuda-graph-scope", "attn", "moe_router",
             "--fine-grained-activation-offloading", "--offload-modules", "core_attn", "attn_proj"]
    run = run_from_row({**ROW, "estimate_flags": [*knobs, "--account-for-loss-in-pipeline-split"]})
    assert run.recipe[-len(knobs):] == tuple(knobs)
    assert run.flags[-1] == "--account-for-loss-in-pipeline-split" and "attn" not in run.flags


def test_a_row_is_priced_as_estimate_prices_it():
    priced = price_run(run_from_row(ROW))
    assert priced.error is None and priced.estimate.embedding.cp == 2
    assert priced.step_error == pytest.approx(priced.predicted_step_s / 10.68 - 1)
    half_node = run_from_row({**ROW, "num_gpus": 4, "global_batch_size": 64})
    assert half_node.num_nodes == 1 and half_node.gpus_per_node_used == 4
    assert price_run(half_node).estimate.world_size == 4


def test_every_row_is_priced_every_shared_one_fits_and_the_table_says_so():
    runs = load_runs(*default_row_files())
    assert len(runs) >= 27
    results = [price_run(run) for run in runs]
    assert all(r.error is None for r in results), [r.error for r in results if r.error]
    shared = [r for r in results if r.run.collection == "reference/published_h100/runs.json"]
    assert len(shared) == 27
    assert all(r.estimate.prediction.fits for r in shared), [r.run.id for r in shared if not r.estimate.prediction.fits]
    text = render(results)
    assert text.count("\n| ") == len(results) + 1 and "mean |error|" in text
    assert all(json.loads(SHARED.read_text())["rows"])


def test_an_unstated_layout_is_shown_at_every_micro_batch_and_virtual_stage_count_that_fits():
    """Estimate picks the fastest layout where the source is silent; the sensitivity lists the error at each
    micro-batch size and, with pipeline stages, each virtual stage count, the picked one among them at the error the
    row shows, and nothing for a row that states its micro-batch."""
    from megatron_auto.published_runs import unstated_layout_errors

    assert unstated_layout_errors(run_from_row(ROW)) == []
    silent = run_from_row({**ROW, "micro_batch_size": None, "cp": 1, "tp": 2})
    errors = {(size, chunks): error for size, chunks, error in unstated_layout_errors(silent)}
    priced = price_run(silent)
    picked = (priced.estimate.local_micro_batch(priced.estimate.embedding), priced.estimate.virtual_stages)
    assert len({size for size, _ in errors}) >= 2 and errors[picked] == pytest.approx(priced.step_error)
    assert errors[picked] == min(errors.values())  # the fastest that fits: the optimistic end
    staged = run_from_row({**ROW, "micro_batch_size": None, "vp": None, "cp": 1, "tp": 2, "pp": 2})
    chunks = {c for _, c, _ in unstated_layout_errors(staged)}
    assert chunks and chunks <= {1, 2, 4, 8, 16}  # the divisors of the 16 layers a stage holds
    assert len(chunks) >= 2  # the virtual stages the source leaves open are weighed too


@pytest.mark.parametrize("release, year", [("NeMo 24.07", 2024), ("NeMo 25.11 container (Megatron-Bridge)", 2025),
                                           ("NeMo 24.09 container (dgxc-benchmarking v24.11.1)", 2024),
                                           ("Megatron-Core r0.8.0 (README 2024-07)", 2024),
                                           ("MCore v0.9 (README commit c230e0d, 2024-11-21)", 2024), ("", None)])
def test_a_rows_release_gives_the_year_of_its_software(release, year):
    assert run_from_row({**ROW, "release": release}).release_year == year


def test_the_summary_gives_each_years_mean_error():
    from dataclasses import replace

    from types import SimpleNamespace

    from benchmarks.published_h100 import release_year_lines

    results = [SimpleNamespace(run=replace(run_from_row(ROW), release=release), step_error=error)
               for release, error in (("NeMo 24.07", -0.10), ("NeMo 24.03.01", -0.08), ("NeMo 25.04", 0.02))]
    assert release_year_lines(results) == ["- software of 2024: 2 rows, mean error -9.0%, mean |error| 9.0%",
                                           "- software of 2025: 1 rows, mean error +2.0%, mean |error| 2.0%"]


def test_the_same_job_measured_in_two_releases_is_set_side_by_side():
    from dataclasses import replace
    from types import SimpleNamespace

    from benchmarks.published_h100 import same_job_lines

    def priced(row_id, release, measured, predicted, **fields):
        run = replace(run_from_row({**ROW, "id": row_id, **fields}), release=release, measured_step_s=measured)
        return SimpleNamespace(run=run, estimate=object(), predicted_step_s=predicted)

    older, newer = priced("a", "NeMo 24.07", 10.68, 9.62), priced("b", "NeMo 25.02", 9.33, 9.61)
    lines = same_job_lines([older, newer, priced("c", "NeMo 25.02", 9.0, 9.0, micro_batch_size=2)])
    assert lines == ["- a (NeMo 24.07) measured 10.68 s, predicted 9.62 s, b (NeMo 25.02) measured 9.33 s, "
                     "predicted 9.61 s: measured 14.5% apart"]
    assert same_job_lines([older, priced("a_tokendrop", "NeMo 25.09", 9.0, 9.0)]) == []  # another workload


def test_the_summary_parts_rows_that_state_their_micro_batch_from_those_left_to_estimate():
    from types import SimpleNamespace

    from benchmarks.published_h100 import stated_layout_lines

    stated = run_from_row({**ROW, "micro_batch_size": 2})
    unstated = run_from_row({**ROW, "micro_batch_size": None})
    results = [SimpleNamespace(run=stated, step_error=-0.10), SimpleNamespace(run=stated, step_error=0.04),
               SimpleNamespace(run=unstated, step_error=-0.20), SimpleNamespace(run=unstated, step_error=None)]
    assert stated_layout_lines(results) == ["- micro-batch stated by the source: 2 rows, mean |error| 7.00%",
                                            "- micro-batch left to estimate: 1 rows, mean |error| 20.00%"]


def test_each_shared_row_s_recipe_audit_names_its_source_and_reaches_the_row():
    """data/published_h100/recipes/shared_rows.json: what the shared rows' recipes ran, with a cited source,
    applied to the row as its own estimate flags and fields (the 340B takes the DGX Cloud recipe of its layout)."""
    from megatron_auto.published_runs import SHARED_ROW_RECIPES, with_recipe_audit

    audits = json.loads(SHARED_ROW_RECIPES.read_text())["rows"]
    rows = {row["id"]: row for row in json.loads(SHARED.read_text())["rows"]}
    assert set(audits) <= set(rows) and all("@" in entry["source"] for entry in audits.values())
    nemotron = run_from_row(with_recipe_audit(rows["nemo2407_nemotron4_340b_fp8"], audits))
    assert "--fp8-param-gather" in nemotron.recipe and "--recompute selective" in " ".join(nemotron.flags)
    assert nemotron.model["add_bias_linear"] is False and nemotron.model["position_embedding_type"] == "rope"
    gpt3 = run_from_row(with_recipe_audit(rows["nemo2407_gpt3_175b_512gpu_fp8"], audits)).model
    assert gpt3["hidden_dropout"] == gpt3["attention_dropout"] == 0.0  # its 175b_mlperf.yaml
    fp32_grads = run_from_row(with_recipe_audit(rows["nemo2407_nemotron3_8b_fp8"], audits))
    assert "--grad-reduce-in-bf16" not in fp32_grads.recipe
    assert with_recipe_audit(ROW, audits) is ROW  # a row without an audit is left as it is
    assert "--fp8-param-gather" not in run_from_row(ROW).recipe


def test_fp8_param_gather_of_a_row_reaches_the_planner():
    run = run_from_row({**ROW, "estimate_flags": ["--fp8-param-gather"]})
    assert "--fp8-param-gather" in run.recipe and "--fp8-param-gather" not in run.flags


def test_a_recipe_that_turns_tp_overlap_off_and_keeps_low_precision_states_is_priced_so():
    """Megatron-Bridge's DeepSeek-V3 and Qwen3-235B perf configs set tp_comm_overlap False at TP 2, and the
    DeepSeek-V3 recipe keeps bf16 gradients and moments: a row's own knobs outrank NeMo's defaults and reach the
    planner's job too."""
    knobs = ["--tp-comm-overlap", "off", "--use-precision-aware-optimizer", "--main-grads-dtype", "bf16",
             "--exp-avg-dtype", "bf16"]
    plain, tuned = run_from_row({**ROW, "tp": 2, "cp": 1}), run_from_row({**ROW, "tp": 2, "cp": 1,
                                                                           "estimate_flags": knobs})
    assert tuned.recipe[-len(knobs):] == tuple(knobs) and "off" not in tuned.flags
    estimates = [price_run(run).estimate for run in (plain, tuned)]
    assert "--tp-comm-overlap" in estimates[0].prediction.recipe_flags
    assert "--tp-comm-overlap" not in estimates[1].prediction.recipe_flags
    assert "--use-precision-aware-optimizer" in estimates[1].prediction.recipe_flags
    assert estimates[1].prediction.breakdown.tp_comm_s > estimates[0].prediction.breakdown.tp_comm_s


def test_a_row_can_name_the_nemo_defaults_its_recipe_did_not_turn():
    """NeMo 1.x's Grok-1 config keeps moe_grouped_gemm false and NeMo 25.04's DeepSeek-V3 reduces gradients in
    fp32: `recipe_defaults_off` drops those defaults, and the shared-expert overlap its config turns is a knob."""
    moe = {**ROW, "num_experts": 8, "moe_router_topk": 2, "moe_ffn_hidden_size": 14336, "cp": 1}
    assert {"--grad-reduce-in-bf16", "--moe-grouped-gemm"} <= set(run_from_row(moe).recipe)
    kept = run_from_row({**moe, "recipe_defaults_off": ["--grad-reduce-in-bf16", "--moe-grouped-gemm"],
                         "estimate_flags": ["--moe-shared-expert-overlap"]})
    assert not {"--grad-reduce-in-bf16", "--moe-grouped-gemm"} & set(kept.recipe)
    assert "--moe-shared-expert-overlap" in kept.recipe and "--moe-shared-expert-overlap" not in kept.flags
