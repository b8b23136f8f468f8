"""plan_table and the CLI progress bar, in process."""
from __future__ import annotations

import io
from dataclasses import replace

import pytest

from megatron_auto.cli.progress import ProgressBar
from megatron_auto.cost.estimate import estimate_plan
from megatron_auto.plan import Chunk, LayerStrategy, Plan
from megatron_auto.report import micro_batch_line, plan_table, strategy_runs
from megatron_auto.search.uniform import UniformConfig, build_uniform_plan
from megatron_auto.specs import TrainingSpec, load_cluster, load_model

MODEL = load_model("tiny-gpt-8l")
CLUSTER = load_cluster("cpu-gloo")
TRAINING = TrainingSpec.fp32(16)


def test_strategy_runs_compress_equal_neighbours_with_global_layer_numbers():
    a, b = LayerStrategy(tp=2, dp=2), LayerStrategy(tp=2, dp=2, recompute="full")
    assert strategy_runs((a, a, b, a), first_layer=4) == [(4, 5, a), (6, 6, b), (7, 7, a)]


def test_megatron_plan_table_has_layout_prediction_and_exact_flags():
    plan = build_uniform_plan(MODEL, CLUSTER, TRAINING, UniformConfig(
        tp=2, pp=4, micro_batch_size=4, stage_layers=(1, 3, 3, 1), sequence_parallel=True))
    plan = replace(plan, prediction=estimate_plan(plan, MODEL, CLUSTER, TRAINING))
    table = plan_table(plan)
    assert "pipeline parallel   4" in table and "micro-batches       4" in table
    assert "    layers 1-3: tp2·dp1·sp\n" in table and "    layer 7: tp2·dp1·sp\n" in table
    assert f"iteration time      {plan.prediction.iteration_time_s:.3f} s" in table
    assert "--decoder-first-pipeline-num-layers 1" in table and "--sequence-parallel" in table
    assert table.count("; memory ") == 4 and "fits                yes" in table


def test_interleaved_stage_lists_its_chunks_and_layers():
    plan = build_uniform_plan(MODEL, CLUSTER, TRAINING, UniformConfig(tp=2, pp=2, micro_batch_size=2,
                                                                      vp=2))
    table = plan_table(plan)
    assert "stage 0: 4 layers in chunks 0, 2\n    layers 0-1, 4-5: tp2·dp2\n" in table
    assert "prediction" not in table  # no prediction recorded, none shown


def test_the_stage_that_runs_the_mtp_modules_says_so():
    model = replace(MODEL, position_embedding_type="rope", mtp_num_layers=2)
    plan = build_uniform_plan(model, CLUSTER, TRAINING, UniformConfig(tp=2, pp=2, micro_batch_size=2,
                                                                      vp=2))
    table = plan_table(plan)
    assert "stage 1: 4 layers in chunks 1, 3 + 2 MTP modules\n" in table
    assert table.count("MTP module") == 1


def test_hybrid_plan_table_shows_per_layer_runs_and_no_megatron_flags():
    a, b = LayerStrategy(tp=4, dp=1, sp=True), LayerStrategy(tp=1, dp=4, zero=3, recompute="full")
    plan = Plan(space="hybrid", world_size=8, pipeline_parallel=2, global_batch_size=16, num_micro_batches=4,
                chunks=(Chunk((a, a, b)), Chunk((b, b, b, a, a))), embedding=a, model=MODEL, cluster="cpu-gloo")
    table = plan_table(replace(plan, prediction=estimate_plan(plan, MODEL, CLUSTER, TRAINING)))
    assert "    layers 0-1: tp4·dp1·sp\n    layer 2: tp1·dp4·z3·rc=full\n" in table
    assert "    layers 3-5: tp1·dp4·z3·rc=full\n    layers 6-7: tp4·dp1·sp\n" in table
    assert "--tensor-model-parallel-size" not in table and "megatron-auto runtime" in table


def test_over_budget_stage_is_marked():
    plan = build_uniform_plan(MODEL, CLUSTER, TrainingSpec.fp32(16, memory_budget_bytes=1024),
                              UniformConfig(tp=1, pp=1, micro_batch_size=2))
    training = TrainingSpec.fp32(16, memory_budget_bytes=1024)
    table = plan_table(replace(plan, prediction=estimate_plan(plan, MODEL, CLUSTER, training)))
    assert "OVER BUDGET" in table and "fits                NO" in table


def test_progress_bar_waits_draws_and_erases(monkeypatch):
    monkeypatch.setenv("MEGATRON_AUTO_PROGRESS", "1")
    stream = io.StringIO()
    with ProgressBar("searching", stream=stream, delay_s=3600) as bar:
        bar(0.5)
    assert stream.getvalue() == ""  # a short task never shows a bar
    stream = io.StringIO()
    with ProgressBar("searching", stream=stream, delay_s=0, min_interval_s=0) as bar:
        bar(0.5)
        bar(2.0)
    text = stream.getvalue()
    assert "searching [###############...............]  50%" in text and " 100%" in text
    assert text.endswith("\r\033[K")


@pytest.mark.parametrize("forced, expected", [("0", False), ("1", True)])
def test_progress_bar_env_switch(monkeypatch, forced, expected):
    monkeypatch.setenv("MEGATRON_AUTO_PROGRESS", forced)
    assert ProgressBar("x", stream=io.StringIO()).enabled is expected


def test_progress_bar_is_off_when_stderr_is_not_a_terminal(monkeypatch):
    monkeypatch.delenv("MEGATRON_AUTO_PROGRESS", raising=False)
    assert ProgressBar("x", stream=io.StringIO()).enabled is False


def test_breakdown_lines_sum_to_the_iteration_when_ranks_share_cores():
    from megatron_auto.report import prediction_lines

    plan = build_uniform_plan(MODEL, CLUSTER, TRAINING, UniformConfig(tp=1, pp=2, micro_batch_size=4))
    prediction = estimate_plan(plan, MODEL, CLUSTER, TRAINING)
    assert not any("core sharing" in line for line in prediction_lines(prediction))
    parts = prediction.breakdown.total_s
    sliced = replace(prediction, iteration_time_s=0.7 * parts)
    lines = prediction_lines(sliced)
    sharing = next(line for line in lines if line.strip().startswith("core sharing"))
    assert float(sharing.split()[2]) == pytest.approx(-0.3 * parts, abs=1e-3)
    assert "cost/timeslice.py" in lines[-1]


def test_hybrid_micro_batch_line_says_what_the_layers_run():
    # Issue 12: the embedding on one TP-4 group sees all 4 samples of a micro-batch, the layers
    # (dp 4) one each; the line used to print the embedding's 4.
    a, b = LayerStrategy(tp=4, dp=1, sp=True), LayerStrategy(tp=1, dp=4)
    plan = Plan(space="hybrid", world_size=4, pipeline_parallel=1, global_batch_size=16, num_micro_batches=4,
                chunks=(Chunk((b,) * 8),), embedding=a, model=MODEL)
    assert micro_batch_line(plan) == ("  micro-batch size    1 per data-parallel rank (4 samples per micro-batch); "
                                      "embedding / head 4 per rank")
    mixed = replace(plan, chunks=(Chunk((a,) * 2 + (b,) * 6),))
    assert "micro-batch size    1-4 (by layer) per data-parallel rank" in plan_table(mixed)
    uniform = replace(plan, chunks=(Chunk((a,) * 8),))
    assert micro_batch_line(uniform) == "  micro-batch size    4 per data-parallel rank (4 samples per micro-batch)"
