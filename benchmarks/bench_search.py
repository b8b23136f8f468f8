"""Search time (issues 2, 6 and 14): CPU time and peak memory of search_plan, its pruning, and how both grow.

Command (writes its sections of docs/benchmarks.md; about 10 minutes on a 2-core machine for all four):
    .venv/bin/python -m benchmarks.bench_search [--only time pruning growth limits]

Each part writes one section as soon as it is measured:
- time, "## Search time" (about 2 minutes): four published jobs in both spaces, timed in this process, and every
  job README.md and docs/ plan with `plan`'s default flags (PLAN_CASES), each timed in PLAN_RUNS fresh
  interpreters, as a user's `megatron-auto plan` runs it: the least and the most of those runs.
- pruning, "## Decision-tree pruning" (seconds): the candidates each rule removed in two hybrid-space searches.
- growth, "## Search cost: time and memory vs GPUs and layers" (about 2 minutes): 8 to 4096 A100 GPUs x
  24 to 128 layers (hidden 4096, 32 heads, s 2048, V 51200; batch = max(512, GPUs)) x both spaces, and the
  least-squares power law time ~ GPUs^alpha x layers^beta per space.
- limits, "## Planning limits: search cost up to the caps" (about 6 minutes): 128 to MAX_LAYERS layers on
  256 A100s, then MAX_LAYERS layers on MAX_GPUS A100s (the corner of what `plan` accepts, megatron_auto/limits.py),
  model and batch as in growth, and the power law in layers per space.
Search time is the CPU time of the process (time.process_time): the search is single-threaded numpy, so this is
its time on one core, and it does not count time lost to other processes when the machine is busy. In growth and
limits each search runs twice, each time in a fresh interpreter so that no cache is warm: once plain for the
time, once under tracemalloc for the peak memory (tracemalloc slows it down, so its time is not used).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np

from benchmarks.docs_sections import write_section
from megatron_auto.cli.job import load_job
from megatron_auto.cli.parser import build_parser
from megatron_auto.errors import UserError
from megatron_auto.limits import MAX_GPUS, MAX_LAYERS
from megatron_auto.search import search_plan
from megatron_auto.specs import TrainingSpec, load_cluster, load_model
from megatron_auto.specs.model import uniform_model

ROOT = Path(__file__).resolve().parents[1]
MODULE = "benchmarks.bench_search"
SPACES = ("megatron", "hybrid")
TIME_CASES = [("gpt3-175b", "dgx-a100-80gb", 8, 1536), ("gpt3-175b", "dgx-a100-80gb", 128, 1536),
              ("llama2-70b", "dgx-h100-80gb", 8, 512), ("gpt3-39.1b", "dgx-a100-80gb", 8, 256)]
PLAN_CASES = [("deepseek-v3", "dgx-h100-80gb", 128, 8192), ("mixtral-8x7b", "dgx-h100-80gb", 8, 256),
              ("llama3-70b", "dgx-h100-80gb", 8, 128), ("deepseek-v3", "dgx-h100-80gb", 128, 4096),
              ("deepseek-moe-16b", "dgx-h100-80gb", 32, 1024), ("deepseek-v2-lite", "dgx-h100-80gb", 2, 512),
              ("mixtral-8x7b", "dgx-h100-80gb", 4, 128), ("llama3-70b", "dgx-h100-80gb", 16, 512),
              ("llama3-8b", "dgx-h100-80gb", 1, 128), ("gpt3-1.7b", "dgx-h100-80gb", 1, 64),
              ("gpt3-175b", "dgx-a100-80gb", 128, 1536)]
"""Every job README.md and docs/ plan with `megatron-auto plan`'s default flags (issue 37: each under 2 s on one
core)."""
PLAN_RUNS = 3
"""Fresh-interpreter runs of each PLAN_CASES search: this virtual machine's pace drifts by up to 1.7x within an
hour, and other tenants only add time, so the least run is the search's own cost and the most shows the drift."""
PRUNING_CASES = [("gpt3-39.1b", 8, 256), ("gpt3-175b", 128, 1536)]
GROWTH_GPUS = (8, 64, 512, 4096)
GROWTH_LAYERS = (24, 48, 96, 128)
LIMITS_GPUS = 256
LIMITS_LAYERS = (128, 256, 512, MAX_LAYERS)
HEADINGS = {"time": "## Search time", "pruning": "## Decision-tree pruning",
            "growth": "## Search cost: time and memory vs GPUs and layers",
            "limits": "## Planning limits: search cost up to the caps"}
"""Each part's section of docs/benchmarks.md."""


def command(part: str) -> str:
    """The command that rewrites the section of `part`."""
    return f"`.venv/bin/python -m {MODULE} --only {part}`"


def time_section() -> str:
    """'## Search time': CPU seconds of `search_plan` on TIME_CASES, both spaces, in this process, and of `plan`'s
    search with its default flags on PLAN_CASES, each in PLAN_RUNS fresh interpreters (issue 37: under 2 s each)."""
    lines = [HEADINGS["time"], "", f"Command: {command('time')}. CPU seconds (one core) of `search_plan` on this "
             "machine, run one after the other in one process.", "",
             "| model | cluster | GPUs | batch | space | search s | predicted iteration s | TFLOP/s per GPU |",
             "|---|---|---|---|---|---|---|---|"]
    for model_name, cluster_name, nodes, batch in TIME_CASES:
        model, cluster = load_model(model_name), load_cluster(cluster_name, nodes)
        for space in SPACES:
            lines.append(_time_row(model, cluster, TrainingSpec(batch), space, False))
    lines += ["", f"`megatron-auto plan` with its default flags (it also chooses `--recompute-modules`, one search "
              "per set) on every job README.md and docs/ plan that way: CPU seconds of its search, the least and "
              f"the most of {PLAN_RUNS} runs, each in a fresh interpreter as the command runs. This virtual "
              "machine's pace drifts by up to 1.7x within an hour; other work only adds time. "
              "`.venv/bin/python -m benchmarks.search_instructions` counts a search's instructions, which do not "
              "drift.", "",
              "| model | cluster | GPUs | batch | search s, least | search s, most | predicted iteration s | "
              "TFLOP/s per GPU |", "|---|---|---|---|---|---|---|---|"]
    for case in PLAN_CASES:
        lines.append(_plan_row(case))
    load = os.getloadavg()[0]
    if load > (os.cpu_count() or 1):
        lines += ["", f"Taken on a shared machine: load average {load:.1f} on {os.cpu_count()} cores at the end of the "
                  "run, so other processes' work on the same cores inflates these CPU times."]
    return "\n".join(lines) + "\n"


def _time_row(model, cluster, training, space: str, choose_modules: bool) -> str:
    """One row of the time table: CPU seconds of one search in this process."""
    started = time.process_time()
    result = search_plan(model, cluster, training, space, choose_recompute_modules=choose_modules)
    elapsed = time.process_time() - started
    p = result.plan.prediction
    return (f"| {model.name} | {cluster.name} | {cluster.world_size} | {training.global_batch_size} | {space} | "
            f"{elapsed:.2f} | {p.iteration_time_s:.3f} | {p.tflops_per_gpu:.1f} |")


def _plan_row(case: tuple) -> str:
    """One `plan` row: PLAN_RUNS fresh-interpreter searches of `case` (one_plan_search)."""
    model_name, cluster_name, nodes, batch = case
    argv = [sys.executable, "-m", MODULE, "--one-plan", model_name, cluster_name, str(nodes), str(batch)]
    runs = [json.loads(subprocess.run(argv, check=True, capture_output=True, text=True, cwd=ROOT).stdout)
            for _ in range(PLAN_RUNS)]
    seconds = [run["seconds"] for run in runs]
    return (f"| {model_name} | {cluster_name} | {runs[0]['gpus']} | {batch} | {min(seconds):.2f} | "
            f"{max(seconds):.2f} | {runs[0]['iteration_s']:.3f} | {runs[0]['tflops']:.1f} |")


def one_plan_search(model_name: str, cluster_name: str, nodes: int, batch: int) -> dict:
    """`megatron-auto plan`'s search with its default flags, in this (fresh) process: CPU seconds and its plan."""
    argv = ["plan", "--model", model_name, "--cluster", cluster_name, "--num-nodes", str(nodes),
            "--global-batch-size", str(batch)]
    model, cluster, training = load_job(build_parser().parse_args(argv))
    started = time.process_time()
    result = search_plan(model, cluster, training, "megatron", choose_recompute_modules=True)
    p = result.plan.prediction
    return {"seconds": time.process_time() - started, "gpus": cluster.world_size,
            "iteration_s": p.iteration_time_s, "tflops": p.tflops_per_gpu}


OUTER_LOOP_RULES = {
    "lower-bound": "hybrid: the candidate's memory-free bound cannot beat the best plan so far",
    "memory-relaxed-bound": "hybrid: the Lagrangian (memory-priced) bound of the candidate's stages, "
                            "over all partitions, cannot beat the best plan so far (search/relaxation.py)",
    "states-exceed-memory": "megatron: the layers' weights, gradients and optimizer states alone overflow a stage",
    "selective-never-fits": "megatron: with every layer selectively recomputed, the memory floor overflows at every "
                            "micro-batch size and chunk count under every --recompute-modules set",
}


def pruning_section() -> str:
    """'## Decision-tree pruning': candidates each rule removed (hybrid space, summed over the outer loop)."""
    from megatron_auto.search.space import RULES

    reasons = {rule.name: rule.reason for rule in RULES}
    results = {f"{m} on {n * 8} GPUs": dict(search_plan(load_model(m), load_cluster("dgx-a100-80gb", n),
                                                        TrainingSpec(b), "hybrid").pruning)
               for m, n, b in PRUNING_CASES}
    names = sorted({rule for counts in results.values() for rule in counts})
    lines = [HEADINGS["pruning"], "",
             f"Command: {command('pruning')}. Candidates removed by each rule, summed over every (pipeline degree, "
             "micro-batch) pair the outer loop visits; `lower-bound` and `memory-relaxed-bound` count the "
             "(pipeline degree, micro-batch) pairs skipped because a bound proved them slower than the best "
             "plan so far, `states-exceed-memory` the megatron-space flag sets skipped unscored.", "",
             "| rule | why it is safe | " + " | ".join(results) + " |", "|---|---|" + "---|" * len(results)]
    for name in names:
        why = reasons.get(name) or OUTER_LOOP_RULES.get(name, "outer-loop rule (megatron space or bound)")
        lines.append(f"| {name} | {why} | " + " | ".join(str(r.get(name, 0)) for r in results.values()) + " |")
    return "\n".join(lines) + "\n"


def job(gpus: int, layers: int):
    """Model, cluster and training of one growth or limits search."""
    model = uniform_model(f"bench-{layers}l", layers, 4096, 32, 2048, 51200)
    return model, load_cluster("dgx-a100-80gb", gpus // 8), TrainingSpec(max(512, gpus))


def one_search(gpus: int, layers: int, space: str, traced: bool) -> dict:
    """Run one search in this (fresh) process: seconds, or peak traced MiB when `traced`."""
    model, cluster, training = job(gpus, layers)
    if traced:
        tracemalloc.start()
    started = time.process_time()
    try:
        result = search_plan(model, cluster, training, space)
        found = f"{result.plan.prediction.iteration_time_s:.2f} s ({result.plan.space})"
        candidates = result.candidates_evaluated
    except UserError:
        found, candidates = "nothing fits", 0
    out = {"seconds": time.process_time() - started, "found": found, "candidates": candidates}
    if traced:
        out["peak_mib"] = tracemalloc.get_traced_memory()[1] / 2**20
        tracemalloc.stop()
    return out


def measure(gpus: int, layers: int, space: str) -> dict:
    """Seconds and peak traced MiB of one search, each in a fresh interpreter (no warm caches)."""
    runs = []
    for traced in (False, True):
        argv = [sys.executable, "-m", MODULE, "--one", str(gpus), str(layers), space, str(int(traced))]
        done = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT)
        if done.returncode:  # one retry: another process may have been rewriting a source file
            done = subprocess.run(argv, check=True, capture_output=True, text=True, cwd=ROOT)
        runs.append(json.loads(done.stdout))
    return {"gpus": gpus, "layers": layers, "space": space, **runs[0], "peak_mib": runs[1]["peak_mib"]}


def sweep(jobs: list[tuple[int, int]], started: float) -> list[dict]:
    """`measure` of every (GPUs, layers) job in both spaces, each row reported as it comes."""
    rows = []
    for gpus, layers in jobs:
        for space in SPACES:
            rows.append(measure(gpus, layers, space))
            r = rows[-1]
            sys.stdout.write(f"{gpus:6d} GPUs {layers:4d} layers {space:8s} {r['seconds']:7.2f} s "
                             f"{r['peak_mib']:7.1f} MiB  {r['found']}  [{time.perf_counter() - started:.0f} s]\n")
            sys.stdout.flush()
    return rows


def power_law(rows: list[dict], key: str) -> tuple[float, float]:
    """(alpha, beta) of key ~ c * GPUs^alpha * layers^beta, least squares in log space."""
    a = np.array([[1.0, math.log(r["gpus"]), math.log(r["layers"])] for r in rows])
    y = np.array([math.log(r[key]) for r in rows])
    coef, *_ = np.linalg.lstsq(a, y, rcond=None)
    return float(coef[1]), float(coef[2])


def layer_exponent(rows: list[dict], key: str) -> float:
    """beta of key ~ c * layers^beta, least squares in log space."""
    slope, _ = np.polyfit([math.log(r["layers"]) for r in rows], [math.log(r[key]) for r in rows], 1)
    return float(slope)


def search_rows(rows: list[dict]) -> list[str]:
    """The table of fresh-interpreter searches that growth and limits share."""
    lines = ["| GPUs | layers | space | search s | peak MiB | candidates | best plan |",
             "|---|---|---|---|---|---|---|"]
    return lines + [f"| {r['gpus']} | {r['layers']} | {r['space']} | {r['seconds']:.2f} | {r['peak_mib']:.1f} | "
                    f"{r['candidates']} | {r['found']} |" for r in rows]


def growth_section(rows: list[dict], total_s: float) -> str:
    """'## Search cost: time and memory vs GPUs and layers' from the growth grid."""
    lines = [HEADINGS["growth"], "",
             f"Command: {command('growth')} ({total_s / 60:.1f} minutes on this 2-core machine, one process). Model: "
             "hidden 4096, 32 heads, s 2048, V 51200, L layers; dgx-a100-80gb; batch max(512, GPUs). Time: CPU "
             "seconds of `search_plan`; memory: peak Python allocations (tracemalloc) of a second run; each run in a "
             "fresh interpreter.", "", *search_rows(rows),
             "", "Growth, least-squares power law over the grid above (per space): "
             "time ∝ GPUs^α × layers^β, memory ∝ GPUs^α' × layers^β'.", "",
             "| space | α (time vs GPUs) | β (time vs layers) | α' (memory vs GPUs) | β' (memory vs layers) |",
             "|---|---|---|---|---|"]
    for space in SPACES:
        subset = [r for r in rows if r["space"] == space]
        (alpha, beta), (alpha_m, beta_m) = power_law(subset, "seconds"), power_law(subset, "peak_mib")
        lines.append(f"| {space} | {alpha:.2f} | {beta:.2f} | {alpha_m:.2f} | {beta_m:.2f} |")
    return "\n".join(lines) + "\n"


def limits_section(rows: list[dict], total_s: float) -> str:
    """'## Planning limits: search cost up to the caps' from the limits rows."""
    lines = [HEADINGS["limits"], "",
             f"Command: {command('limits')} ({total_s / 60:.1f} minutes on this 2-core machine). `plan` refuses "
             f"models of more than {MAX_LAYERS} layers and jobs of more than {MAX_GPUS} GPUs with one line "
             "(megatron_auto/limits.py). Model: hidden 4096, 32 heads, s 2048, V 51200; dgx-a100-80gb; batch "
             "max(512, GPUs). Time: CPU seconds of `search_plan`; memory: peak Python allocations (tracemalloc) "
             "of a second run; each run in a fresh interpreter.", "", *search_rows(rows),
             "", f"Growth in layers on {LIMITS_GPUS} GPUs, least-squares power law: time ∝ layers^β, "
             "memory ∝ layers^β'.", "", "| space | β (time) | β' (memory) |", "|---|---|---|"]
    for space in SPACES:
        subset = [r for r in rows if r["space"] == space and r["gpus"] == LIMITS_GPUS]
        lines.append(f"| {space} | {layer_exponent(subset, 'seconds'):.2f} | "
                     f"{layer_exponent(subset, 'peak_mib'):.2f} |")
    return "\n".join(lines) + "\n"


def part_section(part: str) -> str:
    """The section of one part of HEADINGS, measured now."""
    started = time.perf_counter()
    if part == "time":
        return time_section()
    if part == "pruning":
        return pruning_section()
    if part == "growth":
        rows = sweep([(gpus, layers) for gpus in GROWTH_GPUS for layers in GROWTH_LAYERS], started)
        return growth_section(rows, time.perf_counter() - started)
    rows = sweep([(LIMITS_GPUS, layers) for layers in LIMITS_LAYERS] + [(MAX_GPUS, MAX_LAYERS)], started)
    return limits_section(rows, time.perf_counter() - started)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", choices=list(HEADINGS), default=list(HEADINGS),
                        help="the parts to run (default: all)")
    parser.add_argument("--one", nargs=4, metavar=("GPUS", "LAYERS", "SPACE", "TRACED"), help=argparse.SUPPRESS)
    parser.add_argument("--one-plan", nargs=4, metavar=("MODEL", "CLUSTER", "NODES", "BATCH"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:  # one fresh-interpreter search of `measure`
        gpus, layers, space, traced = args.one
        sys.stdout.write(json.dumps(one_search(int(gpus), int(layers), space, traced == "1")))
        return 0
    if args.one_plan:  # one fresh-interpreter search of `_plan_row`
        model_name, cluster_name, nodes, batch = args.one_plan
        sys.stdout.write(json.dumps(one_plan_search(model_name, cluster_name, int(nodes), int(batch))))
        return 0
    for part in args.only:
        body = part_section(part)
        write_section(ROOT / "docs" / "benchmarks.md", HEADINGS[part], body)
        sys.stdout.write(body)
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
