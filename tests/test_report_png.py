"""`draw_plan_png` and `megatron-auto show --png`: a real PNG for megatron and hybrid plans."""
from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from megatron_auto.errors import UserError
from megatron_auto.plan import Chunk, LayerStrategy, Plan, save_plan
from megatron_auto.report_png import draw_plan_png
from megatron_auto.search import search_plan
from megatron_auto.search.uniform import UniformConfig, build_uniform_plan
from megatron_auto.specs.model import uniform_model
from megatron_auto.specs.presets import CLUSTER_PRESETS
from megatron_auto.specs.training import TrainingSpec

REPO = Path(__file__).resolve().parents[1]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
MODEL = uniform_model("png-test", 8, 512, 8, seq_length=512, vocab_size=4096)
CLUSTER = replace(CLUSTER_PRESETS["dgx-a100-80gb"], num_nodes=1, gpus_per_node=4)


def _assert_png(path: Path) -> None:
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC
    assert len(data) > 10_000  # a drawn figure, not an empty canvas


def _hybrid_plan() -> Plan:
    """Per-layer layouts, recompute kinds and an uneven split, with a prediction."""
    a = LayerStrategy(tp=2, dp=1, sp=True, recompute="full")
    b = LayerStrategy(tp=1, dp=2, zero=3)
    plan = Plan(space="hybrid", world_size=4, pipeline_parallel=2, global_batch_size=8, num_micro_batches=4,
                chunks=(Chunk((a, a, b)), Chunk((b,) * 5)), embedding=LayerStrategy(tp=2, dp=1, sp=True),
                model=MODEL, cluster="dgx-a100-80gb")
    from megatron_auto.cost.estimate import estimate_plan
    return replace(plan, prediction=estimate_plan(plan, MODEL, CLUSTER, TrainingSpec(8)))


def test_png_of_a_searched_megatron_plan(tmp_path):
    plan = search_plan(MODEL, CLUSTER, TrainingSpec(8), "megatron").plan
    draw_plan_png(plan, tmp_path / "m.png")
    _assert_png(tmp_path / "m.png")


def test_png_of_a_hybrid_plan(tmp_path):
    draw_plan_png(_hybrid_plan(), tmp_path / "h.png")
    _assert_png(tmp_path / "h.png")


def test_png_of_an_interleaved_plan_without_prediction(tmp_path):
    config = UniformConfig(tp=1, pp=2, micro_batch_size=1, virtual_stages=2, recompute="selective")
    plan = replace(build_uniform_plan(MODEL, CLUSTER, TrainingSpec(8), config), prediction=None)
    draw_plan_png(plan, tmp_path / "v.png")
    _assert_png(tmp_path / "v.png")


def test_png_to_an_unwritable_path_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="cannot write picture"):
        draw_plan_png(_hybrid_plan(), tmp_path / "missing-dir" / "x.png")


def test_show_png_writes_the_picture_and_still_prints_the_table(tmp_path):
    save_plan(_hybrid_plan(), tmp_path / "plan.json")
    env = {**os.environ, "PYTHONPATH": str(REPO), "MEGATRON_AUTO_PROGRESS": "0"}
    result = subprocess.run([sys.executable, "-m", "megatron_auto", "show", str(tmp_path / "plan.json"),
                             "--png", str(tmp_path / "plan.png")], cwd=REPO, env=env, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "stage 1: 5 layers" in result.stdout
    _assert_png(tmp_path / "plan.png")


def test_the_planner_does_not_import_matplotlib():
    code = ("import sys, megatron_auto.search, megatron_auto.report, megatron_auto.cli.show_command; "
            "sys.exit('matplotlib' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}).returncode == 0
