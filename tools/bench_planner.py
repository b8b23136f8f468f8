"""Planner benchmarks for issue 2: search time, and plan quality on the published rows.

Command (writes two sections of docs/benchmarks.md):
    .venv/bin/python tools/bench_planner.py

Search time is the CPU time of the process (time.process_time) on this machine:
the search is single-threaded numpy, so this is its time on one core, and it does
not count time lost to other processes when the machine is busy. Plan quality compares, by our cost model, the published
SC21 configuration (its t, p, d and full recompute; micro-batch and virtual
stages chosen as `megatron-auto estimate` does) with the `megatron`-space and
`hybrid`-space plans for the same GPUs and batch.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.docs_sections import replace_section  # noqa: E402
from megatron_auto.calibration import load_rows, predict_row  # noqa: E402
from megatron_auto.search import search_plan  # noqa: E402
from megatron_auto.specs import load_cluster, load_model, TrainingSpec  # noqa: E402
from megatron_auto.specs.model import uniform_model  # noqa: E402
from megatron_auto.specs.presets import CLUSTER_PRESETS  # noqa: E402

COMMAND = "`.venv/bin/python tools/bench_planner.py`"
SEARCH_CASES = [("gpt3-175b", "dgx-a100-80gb", 8, 1536), ("gpt3-175b", "dgx-a100-80gb", 128, 1536),
                ("llama2-70b", "dgx-h100-80gb", 8, 512), ("gpt3-39.1b", "dgx-a100-80gb", 8, 256)]


def search_time_section() -> str:
    lines = ["## Search time", "", f"Command: {COMMAND}. CPU seconds (one core) of `search_plan` on this machine.", "",
             "| model | cluster | GPUs | batch | space | search s | predicted iteration s | TFLOP/s per GPU |",
             "|---|---|---|---|---|---|---|---|"]
    for model_name, cluster_name, nodes, batch in SEARCH_CASES:
        model, cluster = load_model(model_name), load_cluster(cluster_name, nodes)
        for space in ("megatron", "hybrid"):
            started = time.process_time()
            result = search_plan(model, cluster, TrainingSpec(batch), space)
            elapsed = time.process_time() - started
            p = result.plan.prediction
            lines.append(f"| {model_name} | {cluster_name} | {cluster.world_size} | {batch} | {space} | {elapsed:.2f} | "
                         f"{p.iteration_time_s:.3f} | {p.tflops_per_gpu:.1f} |")
    return "\n".join(lines) + "\n"


OUTER_LOOP_RULES = {
    "lower-bound": "hybrid: the candidate's memory-free bound cannot beat the best plan so far",
    "memory-relaxed-bound": "hybrid: the Lagrangian (memory-priced) bound of the candidate's stages, "
                            "over all partitions, cannot beat the best plan so far (search/relaxation.py)",
    "states-exceed-memory": "megatron: the layers' weights, gradients and optimizer states alone overflow a stage",
}


def pruning_section() -> str:
    """How many candidates each decision-tree rule removed (hybrid space, summed over the outer loop)."""
    from megatron_auto.search.space import RULES

    reasons = {rule.name: rule.reason for rule in RULES}
    cases = [("gpt3-39.1b", 8, 256), ("gpt3-175b", 128, 1536)]
    results = {f"{m} on {n * 8} GPUs": dict(search_plan(load_model(m), load_cluster("dgx-a100-80gb", n),
                                                        TrainingSpec(b), "hybrid").pruning) for m, n, b in cases}
    names = sorted({rule for counts in results.values() for rule in counts})
    lines = ["## Decision-tree pruning", "",
             f"Command: {COMMAND}. Candidates removed by each rule, summed over every (pipeline degree, "
             "micro-batch) pair the outer loop visits; `lower-bound` and `memory-relaxed-bound` count the "
             "(pipeline degree, micro-batch) pairs skipped because a bound proved them slower than the best "
             "plan so far, `states-exceed-memory` the megatron-space flag sets skipped unscored.", "",
             "| rule | why it is safe | " + " | ".join(results) + " |", "|---|---|" + "---|" * len(results)]
    for name in names:
        why = reasons.get(name) or OUTER_LOOP_RULES.get(name, "outer-loop rule (megatron space or bound)")
        lines.append(f"| {name} | {why} | " + " | ".join(str(r.get(name, 0)) for r in results.values()) + " |")
    return "\n".join(lines) + "\n"


def plan_quality_section(rows_path: Path) -> str:
    lines = ["## Plan quality on the published rows", "",
             f"Command: {COMMAND}. Predicted iteration seconds by our cost model; ratio = published config time / plan time.", "",
             "| model | GPUs | batch | published config s | megatron plan s | ratio | hybrid plan s | hybrid vs megatron | megatron plan |",
             "|---|---|---|---|---|---|---|---|---|"]
    base = CLUSTER_PRESETS["dgx-a100-80gb"]
    for row in load_rows(rows_path):
        published = predict_row(row, base).prediction.iteration_time_s
        model = uniform_model(f"gpt3-{row.params_b}b", row.layers, row.hidden, row.heads, 2048, 51200)
        cluster = base.with_nodes(row.gpus // base.gpus_per_node)
        training = TrainingSpec(global_batch_size=row.batch, precision="fp16")
        megatron = search_plan(model, cluster, training, "megatron").plan
        hybrid = search_plan(model, cluster, training, "hybrid").plan
        m, h = megatron.prediction.iteration_time_s, hybrid.prediction.iteration_time_s
        layout = megatron.embedding
        lines.append(f"| {row.params_b}B | {row.gpus} | {row.batch} | {published:.2f} | {m:.2f} | {published / m:.3f} | "
                     f"{h:.2f} | {m / h:.3f} ({hybrid.space}) | t{layout.tp} p{megatron.pipeline_parallel} "
                     f"mbs{megatron.local_micro_batch(layout)} v{megatron.virtual_stages} "
                     f"rc={megatron.layer_strategies[0].recompute} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    docs = ROOT / "docs" / "benchmarks.md"
    text = docs.read_text() if docs.exists() else "# Benchmarks\n"
    text = replace_section(text, "## Search time", search_time_section())
    text = replace_section(text, "## Decision-tree pruning", pruning_section())
    text = replace_section(text, "## Plan quality on the published rows",
                           plan_quality_section(ROOT.parent / "shared" / "reference" / "megatron_sc21_table1_subset.json"))
    docs.write_text(text)
    sys.stdout.write(text)


if __name__ == "__main__":
    main()
