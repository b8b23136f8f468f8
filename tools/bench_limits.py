"""Planning limits (issue 14): time and memory of search_plan up to the caps of megatron_auto/limits.py.

Command (about 10 minutes on a 2-core machine; writes a section of docs/benchmarks.md):
    .venv/bin/python tools/bench_limits.py

Rows: 128 to MAX_LAYERS layers on 256 A100s, then MAX_LAYERS layers on MAX_GPUS A100s (the
corner of what `plan` accepts), both spaces; model and batch as in tools/bench_search.py
(hidden 4096, 32 heads, s 2048, V 51200; batch max(512, GPUs)). Each search runs in a fresh
interpreter, once for the CPU seconds and once under tracemalloc for the peak memory
(bench_search.measure). The growth in layers is a least-squares power law per space.
"""
from __future__ import annotations

import math
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench_search import SPACES, sweep  # noqa: E402
from benchmarks.docs_sections import write_section  # noqa: E402
from megatron_auto.limits import MAX_GPUS, MAX_LAYERS  # noqa: E402

COMMAND = "`.venv/bin/python tools/bench_limits.py`"
HEADING = "## Planning limits: search cost up to the caps"
SWEEP_GPUS = 256
SWEEP_LAYERS = (128, 256, 512, MAX_LAYERS)


def layer_exponent(rows: list[dict], key: str) -> float:
    """beta of key ~ c * layers^beta, least squares in log space."""
    slope, _ = np.polyfit([math.log(r["layers"]) for r in rows], [math.log(r[key]) for r in rows], 1)
    return float(slope)


def section(rows: list[dict], total_s: float) -> str:
    lines = [HEADING, "",
             f"Command: {COMMAND} ({total_s / 60:.1f} minutes on this 2-core machine). `plan` refuses models of more "
             f"than {MAX_LAYERS} layers and jobs of more than {MAX_GPUS} GPUs with one line "
             "(megatron_auto/limits.py). Model: hidden 4096, 32 heads, s 2048, V 51200; dgx-a100-80gb; batch "
             "max(512, GPUs). Time: CPU seconds of `search_plan`; memory: peak Python allocations (tracemalloc) "
             "of a second run; each run in a fresh interpreter.", "",
             "| GPUs | layers | space | search s | peak MiB | candidates | best plan |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['gpus']} | {r['layers']} | {r['space']} | {r['seconds']:.2f} | {r['peak_mib']:.1f} | "
                     f"{r['candidates']} | {r['found']} |")
    lines += ["", f"Growth in layers on {SWEEP_GPUS} GPUs, least-squares power law: time ∝ layers^β, "
              "memory ∝ layers^β'.", "", "| space | β (time) | β' (memory) |", "|---|---|---|"]
    for space in SPACES:
        sweep = [r for r in rows if r["space"] == space and r["gpus"] == SWEEP_GPUS]
        lines.append(f"| {space} | {layer_exponent(sweep, 'seconds'):.2f} | {layer_exponent(sweep, 'peak_mib'):.2f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    started = time.perf_counter()
    rows = sweep([(SWEEP_GPUS, layers) for layers in SWEEP_LAYERS] + [(MAX_GPUS, MAX_LAYERS)], started)
    body = section(rows, time.perf_counter() - started)
    write_section(ROOT / "docs" / "benchmarks.md", HEADING, body)
    sys.stdout.write(body)


if __name__ == "__main__":
    main()
