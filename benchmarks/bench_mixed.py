"""Benchmark (issue 39): plans for a mixed cluster against the uniform plans the same nodes allow.

Run from the repository root (about half a minute on one core):

    .venv/bin/python -m benchmarks.bench_mixed            # writes "## Mixed clusters" in docs/benchmarks.md
    .venv/bin/python -m benchmarks.bench_mixed --no-write

For each job on the `mixed-h100-a100` preset (2 DGX-H100 nodes at node ranks 0-1, 2 DGX-A100 80GB nodes at 2-3),
`megatron-auto plan`'s search (megatron space, its default flags) prices three plans: the one for the mixed
cluster as it is (each stage on its own group, the layers balanced over the groups: search/mixed_splits.py), the
best plan for 4 DGX-A100 nodes (every GPU taken as the slower kind, what a planner that assumes one kind of GPU
can do on these nodes), and the best plan for the 2 DGX-H100 nodes alone (leaving the A100 nodes idle). These are
predictions of the cost model; no mixed cluster has been measured here.
"""
from __future__ import annotations

import argparse
import sys
import time

from benchmarks.docs_sections import BENCHMARKS_MD, write_section
from megatron_auto.errors import UserError
from megatron_auto.megatron_flags import megatron_flags
from megatron_auto.search import search_plan
from megatron_auto.cli.job import load_job
from megatron_auto.cli.parser import build_parser

HEADING = "## Mixed clusters: 2 DGX-H100 + 2 DGX-A100 nodes against the uniform plans"
COMMAND = ".venv/bin/python -m benchmarks.bench_mixed"
JOBS = (("llama3-8b", 128), ("llama2-13b", 256), ("llama3-70b", 128), ("mixtral-8x7b", 256))
MIXED = "mixed-h100-a100"


def best(name: str, cluster: list[str], batch: int, space: str = "megatron"):
    """(the plan `megatron-auto plan --model NAME CLUSTER... --global-batch-size BATCH --space SPACE` finds, the CPU
    seconds its search took), or None when nothing fits."""
    argv = ["plan", "--model", name, *cluster, "--global-batch-size", str(batch)]
    model, found_cluster, training = load_job(build_parser().parse_args(argv))[:3]
    started = time.process_time()
    try:
        plan = search_plan(model, found_cluster, training, space, choose_recompute_modules=True).plan
    except UserError:
        return None
    return plan, time.process_time() - started


def _seconds(found) -> float | None:
    return found[0].prediction.iteration_time_s if found else None


def job_line(name: str, batch: int) -> str:
    mixed = best(name, ["--cluster", MIXED], batch)
    hybrid = best(name, ["--cluster", MIXED], batch, "hybrid")
    a100 = _seconds(best(name, ["--cluster", "dgx-a100-80gb", "--num-nodes", "4"], batch))
    h100 = _seconds(best(name, ["--cluster", "dgx-h100-80gb", "--num-nodes", "2"], batch))
    if mixed is None:
        return f"| {name} | {batch} | nothing fits | | {a100 or 'nothing fits'} | {h100 or 'nothing fits'} | | |"
    plan, seconds = mixed
    ours = _seconds(mixed)
    flags = megatron_flags(plan)
    tp = flags[flags.index("--tensor-model-parallel-size") + 1]
    split = ", ".join(map(str, plan.stage_layer_counts()))
    chunks = f" in {plan.virtual_stages} chunks each" if plan.virtual_stages > 1 else ""
    cell = lambda t: f"{t:.2f} s ({t / ours:.2f}x)" if t is not None else "nothing fits"  # noqa: E731
    per_layer = f"{cell(_seconds(hybrid))}, {hybrid[0].space} plan" if hybrid else "nothing fits"
    return (f"| {name} | {batch} | {ours:.2f} s | tp{tp} pp{plan.pipeline_parallel}, layers {split}{chunks} | "
            f"{per_layer} | {cell(a100)} | {cell(h100)} | {seconds:.2f} |")


def render() -> str:
    lines = [HEADING, "",
             f"Command: `{COMMAND}`. Predicted iteration time of the planner's plan for the `{MIXED}` preset "
             "(each stage on its own node group, H100 stages first), beside the best plan for 4 DGX-A100 nodes "
             "(every GPU as the slower kind) and for the 2 DGX-H100 nodes alone; in parentheses, how many times "
             "the mixed plan's time. The hybrid space (`--space hybrid`: a strategy per layer, each stage's layer DP "
             "on its own group's tables and memory) may give a stage another TP degree than its neighbours; it "
             "also weighs the megatron space's best, so its cell names the space whose plan won. Predictions only: "
             "no mixed cluster has been measured. Search: CPU seconds of the mixed cluster's megatron-space search "
             "on this machine.", "",
             "| model | batch | mixed plan | its layout | hybrid space | 4 x DGX-A100 | 2 x DGX-H100 | search s |",
             "|---|---|---|---|---|---|---|---|"]
    return "\n".join(lines + [job_line(name, batch) for name, batch in JOBS]) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-write", action="store_true", help="print only; leave docs/benchmarks.md alone")
    args = parser.parse_args(argv)
    text = render()
    sys.stdout.write(text)
    if not args.no_write:
        write_section(BENCHMARKS_MD, HEADING, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
