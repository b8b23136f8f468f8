"""Search cost (issue 6): CPU time (one core) and peak Python memory of search_plan, and how they grow.

Command (about 5-10 minutes on a 2-core machine; writes a section of docs/benchmarks.md):
    .venv/bin/python tools/bench_search.py

Grid: 8 to 4096 A100 GPUs x 24 to 128 layers (hidden 4096, 32 heads, s 2048, V 51200;
batch = max(512, GPUs)) x both spaces. Each search runs twice, each time in a fresh
interpreter so that no cache is warm: once plain for the time, once under
tracemalloc for the peak memory (tracemalloc slows it down, so its time is not used). The growth is a least-squares power law
time ~ GPUs^alpha x layers^beta per space.
"""
from __future__ import annotations

import json
import math
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.docs_sections import write_section  # noqa: E402
from megatron_auto.errors import UserError  # noqa: E402
from megatron_auto.search import search_plan  # noqa: E402
from megatron_auto.specs import TrainingSpec, load_cluster  # noqa: E402
from megatron_auto.specs.model import uniform_model  # noqa: E402

COMMAND = "`.venv/bin/python tools/bench_search.py`"
HEADING = "## Search cost: time and memory vs GPUs and layers"
GPUS = (8, 64, 512, 4096)
LAYERS = (24, 48, 96, 128)
SPACES = ("megatron", "hybrid")


def job(gpus: int, layers: int):
    model = uniform_model(f"bench-{layers}l", layers, 4096, 32, 2048, 51200)
    return model, load_cluster("dgx-a100-80gb", gpus // 8), TrainingSpec(max(512, gpus))


def _one_search(gpus: int, layers: int, space: str, traced: bool) -> dict:
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
        command = [sys.executable, __file__, "--one", str(gpus), str(layers), space, str(int(traced))]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode:  # one retry: another process may have been rewriting a source file
            done = subprocess.run(command, check=True, capture_output=True, text=True)
        runs.append(json.loads(done.stdout))
    return {"gpus": gpus, "layers": layers, "space": space, **runs[0], "peak_mib": runs[1]["peak_mib"]}


def power_law(rows: list[dict], key: str) -> tuple[float, float]:
    """(alpha, beta) of key ~ c * GPUs^alpha * layers^beta, least squares in log space."""
    a = np.array([[1.0, math.log(r["gpus"]), math.log(r["layers"])] for r in rows])
    y = np.array([math.log(r[key]) for r in rows])
    coef, *_ = np.linalg.lstsq(a, y, rcond=None)
    return float(coef[1]), float(coef[2])


def section(rows: list[dict], total_s: float) -> str:
    lines = [HEADING, "",
             f"Command: {COMMAND} ({total_s / 60:.1f} minutes on this 2-core machine, one process). Model: hidden 4096, "
             "32 heads, s 2048, V 51200, L layers; dgx-a100-80gb; batch max(512, GPUs). Time: CPU "
             "seconds of `search_plan`; memory: peak Python allocations (tracemalloc) of a second run; each run in a fresh interpreter.", "",
             "| GPUs | layers | space | search s | peak MiB | candidates | best plan |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['gpus']} | {r['layers']} | {r['space']} | {r['seconds']:.2f} | {r['peak_mib']:.1f} | "
                     f"{r['candidates']} | {r['found']} |")
    lines += ["", "Growth, least-squares power law over the grid above (per space): "
              "time ∝ GPUs^α × layers^β, memory ∝ GPUs^α' × layers^β'.", "",
              "| space | α (time vs GPUs) | β (time vs layers) | α' (memory vs GPUs) | β' (memory vs layers) |",
              "|---|---|---|---|---|"]
    for space in SPACES:
        subset = [r for r in rows if r["space"] == space]
        (alpha, beta), (alpha_m, beta_m) = power_law(subset, "seconds"), power_law(subset, "peak_mib")
        lines.append(f"| {space} | {alpha:.2f} | {beta:.2f} | {alpha_m:.2f} | {beta_m:.2f} |")
    return "\n".join(lines) + "\n"


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


def main() -> None:
    if sys.argv[1:2] == ["--one"]:
        gpus, layers, space, traced = sys.argv[2:6]
        sys.stdout.write(json.dumps(_one_search(int(gpus), int(layers), space, traced == "1")))
        return
    started = time.perf_counter()
    rows = sweep([(gpus, layers) for gpus in GPUS for layers in LAYERS], started)
    body = section(rows, time.perf_counter() - started)
    write_section(ROOT / "docs" / "benchmarks.md", HEADING, body)
    sys.stdout.write(body)


if __name__ == "__main__":
    main()
