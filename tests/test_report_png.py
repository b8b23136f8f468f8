"""`draw_plan_png` and `megatron-auto show --png`: a real PNG for megatron and hybrid plans."""
from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from megatron_auto import serde
from megatron_auto.cli.main import main
from megatron_auto.errors import UserError
from megatron_auto.plan import Chunk, LayerStrategy, Plan, save_plan
from megatron_auto.report_png import STRADDLE_HATCH, draw_plan_png, plan_figure
from megatron_auto.search import search_plan
from megatron_auto.search.uniform import UniformConfig, build_uniform_plan
from megatron_auto.specs.model import uniform_model
from megatron_auto.specs.presets import CLUSTER_PRESETS, mixed_cluster
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
    config = UniformConfig(tp=1, pp=2, micro_batch_size=1, vp=2, recompute="selective")
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


# ------------------------------------------------------------------ node groups of a mixed cluster (issue 39)

def _mixed():
    """8 GPUs in nodes of 2: ranks 0-5 on 3 H100 nodes, ranks 6-7 on 1 A100 node."""
    h100, a100 = (replace(CLUSTER_PRESETS[name], gpus_per_node=2) for name in ("dgx-h100-80gb", "dgx-a100-80gb"))
    return mixed_cluster("png-mixed", ((h100, 3), (a100, 1)))


def _mixed_plan(pp: int) -> Plan:
    return build_uniform_plan(MODEL, _mixed(), TrainingSpec(8), UniformConfig(tp=2, pp=pp, micro_batch_size=1))


def _group_legend(figure):
    """The legend of the node groups: the legend axes' own (the layout legend is added as an artist)."""
    legend = figure.axes[1].get_legend()
    assert legend.get_title().get_text().startswith("node groups")
    return legend


@pytest.mark.parametrize("pp, tags", [(2, ["g0", "g0+g1"]), (4, ["g0", "g0", "g0", "g1"])])
def test_mixed_plan_tags_each_stage_with_the_node_groups_its_ranks_lie_in(pp, tags):
    import matplotlib.pyplot as plt

    cluster = _mixed()
    figure = plan_figure(_mixed_plan(pp), cluster)
    try:
        drawn = [t.get_text() for t in figure.axes[0].texts if t.get_text().startswith("g")]
        assert drawn == tags == ["+".join(f"g{i}" for i in span) for span in cluster.stage_spans(pp)]
        assert all(tag == f"g{group}" for tag, group in zip(drawn, cluster.stage_groups(pp)) if "+" not in tag)
        legend = _group_legend(figure)
        labels = [t.get_text() for t in legend.get_texts()]
        assert labels[0].startswith("g0 dgx-h100-80gb: H100-SXM5-80GB\nnode ranks 0-2; stages 0-")
        assert labels[1].startswith("g1 dgx-a100-80gb: A100-SXM4-80GB\nnode rank 3; stage ")
        # each stage's strip (the bars above row 0) is in its groups' legend colours, hatched where it straddles
        colors = [handle.get_facecolor() for handle in legend.legend_handles[:2]]
        strips = [bar for bar in figure.axes[0].patches if bar.get_y() < 0]
        assert [(round(bar.get_x() + 0.4), bar.get_facecolor(), bar.get_hatch() or "") for bar in strips] == [
            (stage, colors[g], STRADDLE_HATCH if len(span) > 1 else "")
            for stage, span in enumerate(cluster.stage_spans(pp)) for g in span]
        assert any("straddle" in label for label in labels) == (pp == 2)
    finally:
        plt.close(figure)


def test_a_uniform_cluster_draws_the_plan_exactly_as_without_one(tmp_path):
    plan = _hybrid_plan()
    draw_plan_png(plan, tmp_path / "none.png")
    draw_plan_png(plan, tmp_path / "uniform.png", CLUSTER)
    assert (tmp_path / "none.png").read_bytes() == (tmp_path / "uniform.png").read_bytes()
    figure = plan_figure(plan, CLUSTER)
    assert figure.axes[1].get_legend().get_title().get_text() == "layer layout"
    assert all(bar.get_y() >= 0 for bar in figure.axes[0].patches)


def test_show_names_and_draws_the_node_groups_of_the_cluster_given(tmp_path, capsys):
    save_plan(_mixed_plan(2), tmp_path / "plan.json")
    (tmp_path / "mixed.json").write_text(serde.dumps(_mixed()))
    assert main(["show", str(tmp_path / "plan.json")]) == 0  # 'png-mixed' is no preset: nothing to name
    assert "node groups" not in capsys.readouterr().out
    assert main(["show", str(tmp_path / "plan.json"), "--cluster", str(tmp_path / "mixed.json"),
                 "--png", str(tmp_path / "plan.png")]) == 0
    assert "  png-mixed" not in (out := capsys.readouterr().out) and "node rank 3, A100-SXM4-80GB: stage 1" in out
    _assert_png(tmp_path / "plan.png")
    assert main(["show", str(tmp_path / "plan.json"), "--cluster", "mixed-h100-a100"]) == 2
    assert "has 32 GPUs, the plan 8" in capsys.readouterr().err
