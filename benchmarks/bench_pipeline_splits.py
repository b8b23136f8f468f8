"""Interleaved splits that count the embedding and the loss as layers: what they win in the megatron space.

Command (under a minute on a 2-core machine; writes a section of docs/benchmarks.md):
    .venv/bin/python -m benchmarks.bench_pipeline_splits

For models of the gpt3-39.1b layer shape (hidden 8192, 64 heads, s 2048, V 51200) with 44 to 50 layers on
64 H100s (dgx-h100-80gb, 8 nodes) at a global batch of 512, the megatron-space search runs twice: with
every split it knows, and without the splits of --account-for-embedding/loss-in-pipeline-split
(megatron_space.ACCOUNTED emptied). Predicted iteration seconds by our cost model.
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from benchmarks.docs_sections import write_section
from megatron_auto.megatron_flags import megatron_flags
from megatron_auto.search import megatron_space, search_plan
from megatron_auto.specs.presets import CLUSTER_PRESETS, MODEL_PRESETS
from megatron_auto.specs.training import TrainingSpec

ROOT = Path(__file__).resolve().parents[1]
COMMAND = "`.venv/bin/python -m benchmarks.bench_pipeline_splits`"
HEADING = "## Interleaved splits that count the embedding and the loss"
LAYERS = range(44, 51)
NODES, BATCH = 8, 512


def best_plan(layers: int, with_accounted: bool):
    """The megatron-space plan for `layers` layers of the gpt3-39.1b shape, with or without the splits that
    count the embedding and the loss."""
    base = MODEL_PRESETS["gpt3-39.1b"]
    model = replace(base, layers=(base.layers[0],) * layers, name=f"gpt3-39.1b-shape-{layers}l")
    cluster = replace(CLUSTER_PRESETS["dgx-h100-80gb"], num_nodes=NODES)
    saved = megatron_space.ACCOUNTED
    megatron_space.ACCOUNTED = saved if with_accounted else ()
    try:
        return search_plan(model, cluster, TrainingSpec(global_batch_size=BATCH), "megatron").plan
    finally:
        megatron_space.ACCOUNTED = saved


def split_text(plan) -> str:
    """TP, PP, the chunks per stage and the split flags of a plan."""
    flags = megatron_flags(plan)
    value = {flag: flags[i + 1] for i, flag in enumerate(flags[:-1]) if not flags[i + 1].startswith("--")}
    text = f"TP{value['--tensor-model-parallel-size']} PP{value['--pipeline-model-parallel-size']}"
    if plan.virtual_stages > 1:
        text += f", {plan.virtual_stages} chunks of {value['--num-layers-per-virtual-pipeline-stage']}"
    split = [f for f in flags if f.startswith("--account-for") or f.startswith("--decoder-")]
    return text + "".join(f", {f}" + (f" {value[f]}" if f in value else "") for f in split)


def main() -> None:
    rows = []
    for layers in LAYERS:
        both, without = best_plan(layers, True), best_plan(layers, False)
        gain = without.prediction.iteration_time_s / both.prediction.iteration_time_s
        rows.append(f"| {layers} | {both.prediction.iteration_time_s:.3f} | {split_text(both)} | "
                    f"{without.prediction.iteration_time_s:.3f} | {split_text(without)} | {gain:.3f} |")
        print(rows[-1], flush=True)
    text = "\n".join([
        HEADING, "",
        f"Command: {COMMAND}. The gpt3-39.1b layer shape with L layers, dgx-h100-80gb x {NODES} nodes, global "
        f"batch {BATCH}: the megatron-space plan with every split, and without those that count the embedding "
        "and/or the loss as a layer (--account-for-embedding/loss-in-pipeline-split). Predicted iteration "
        "seconds by our cost model; gain = time without / time with.", "",
        "| L | with: s | with: split | without: s | without: split | gain |",
        "|---|---|---|---|---|---|", *rows, ""])
    write_section(ROOT / "docs" / "benchmarks.md", HEADING, text)


if __name__ == "__main__":
    main()
