"""The GEMM rates the cost model rests on, measured on one GPU and compared with the GEMM law.

Commands:
    python3 -m validation.gemm_rates --out gemm_rates.jsonl [--seconds 60]   # on the GPU machine, about 2 minutes
    python3 -m validation.gemm_rates --compare gemm_rates.jsonl              # anywhere: measured against predicted

What it measures, each as one JSON line (kind, m, k, n, groups, seconds per GEMM, TFLOP/s):
- `dense`: bf16 `a @ b` at shapes of NVIDIA's published runs (their layers' QKV, projection and MLP GEMMs on one
  TP shard, and the 1/tp pieces that TE's ring-exchange TP overlap multiplies: cost/tp_overlap.py);
- `fp8`: the same shapes through `torch._scaled_mm` (E4M3 inputs, per-tensor scales, bf16 output), what
  cost/fp8.py prices with its own half_dim and the FP8 peak;
- `grouped`: bf16 `torch._grouped_mm` over the local experts of MoE rows (Qwen3 30B-A3B, DeepSeek-V3, Mixtral,
  GPT-OSS), what cost/moe.py prices as one grouped kernel at the per-expert shape;
- `sustained`: an 8192-cubed bf16 GEMM back to back for `--seconds`, its rate per 5-second window with the SM
  clock and power nvidia-smi reports: the GEMM law was fitted to short bursts (data/reference/h100/gemm_bf16.jsonl),
  while a training step keeps the GPU at its power limit for minutes.

`--compare` prints each line beside the cost model's rate for the same GEMM on `dgx-h100-80gb`
(kernel_rates.gemm_compute_time, fp8.fp8_gemm_time, moe.expert_gemm_time) and, for the sustained run, each
window against the first. Without CUDA the measurement refuses with one line (exit status 2).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from megatron_auto.cost.flops import Gemm
from megatron_auto.cost.fp8 import fp8_gemm_time
from megatron_auto.cost.kernel_rates import gemm_compute_time
from megatron_auto.cost.moe import expert_gemm_time
from megatron_auto.specs.presets import CLUSTER_PRESETS

CLUSTER = CLUSTER_PRESETS["dgx-h100-80gb"]
DENSE = {  # (m, k, n) on one shard: m the micro-batch's tokens (after SP's gather), k x n the weight shard
    "gpt3-175b tp4 qkv": (2048, 12288, 9216), "gpt3-175b tp4 proj": (2048, 3072, 12288),
    "gpt3-175b tp4 fc1": (2048, 12288, 12288), "gpt3-175b tp4 fc2": (2048, 12288, 12288),
    "llama3.1-405b tp8 cp2 qkv": (4096, 16384, 2304), "llama3.1-405b tp8 cp2 fc1": (4096, 16384, 13312),
    "llama3.1-405b tp8 cp2 fc2": (4096, 6656, 16384), "llama3.1-405b tp8 fc1, 1/8 piece": (512, 16384, 13312),
    "llama3-8b tp1 s8192 fc1": (8192, 4096, 28672), "gpt-1.7b mbs4 fc1": (16384, 2048, 8192),
}
GROUPED = {  # (rows per expert, k, n, local experts): balanced routing, one micro-batch
    "qwen3-30b-a3b ep8 fc1": (4096, 2048, 1536, 16), "qwen3-30b-a3b ep8 fc2": (4096, 768, 2048, 16),
    "deepseek-v3 ep64 fc1": (4096, 7168, 4096, 4), "deepseek-v3 ep64 fc2": (4096, 2048, 7168, 4),
    "mixtral-8x7b ep8 fc1": (8192, 4096, 28672, 1), "gpt-oss-120b ep8 fc1": (1024, 2880, 5760, 16),
    "gpt-oss-120b ep8 fc2": (1024, 2880, 2880, 16),
}
SUSTAINED_SIZE, WINDOW_S = 8192, 5.0


def _timed(run, min_seconds: float = 0.2) -> float:
    """Seconds per call of `run` (CUDA events, after a warm-up), over at least `min_seconds`."""
    import torch

    for _ in range(3):
        run()
    torch.cuda.synchronize()
    calls, elapsed = 1, 0.0
    while elapsed < min_seconds:
        calls *= 2
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            run()
        end.record()
        torch.cuda.synchronize()
        elapsed = start.elapsed_time(end) / 1e3
    return elapsed / calls


def _row(kind: str, name: str, m: int, k: int, n: int, groups: int, seconds: float, **extra) -> dict:
    return dict(kind=kind, name=name, m=m, k=k, n=n, groups=groups, seconds=seconds,
                tflops=2.0 * groups * m * k * n / seconds / 1e12, **extra)


def _refused(kind: str, name: str, m: int, k: int, n: int, groups: int, error: Exception) -> dict:
    """A shape the GPU's kernel would not run, with the first line of why."""
    return dict(kind=kind, name=name, m=m, k=k, n=n, groups=groups, error=str(error).splitlines()[0])


def measure_dense(torch) -> list[dict]:
    rows = []
    for name, (m, k, n) in DENSE.items():
        a, b = (torch.randn(m, k, device="cuda", dtype=torch.bfloat16),
                torch.randn(k, n, device="cuda", dtype=torch.bfloat16))
        rows.append(_row("dense", name, m, k, n, 1, _timed(lambda: a @ b)))
    return rows


def measure_fp8(torch) -> list[dict]:
    rows, one = [], torch.ones((), device="cuda")
    for name, (m, k, n) in DENSE.items():
        a = torch.randn(m, k, device="cuda").to(torch.float8_e4m3fn)
        b = torch.randn(n, k, device="cuda").to(torch.float8_e4m3fn).t()  # column-major, as _scaled_mm wants
        try:
            seconds = _timed(lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16))
        except (RuntimeError, AttributeError) as error:
            rows.append(_refused("fp8", name, m, k, n, 1, error))
            continue
        rows.append(_row("fp8", name, m, k, n, 1, seconds))
    return rows


def measure_grouped(torch) -> list[dict]:
    rows = []
    for name, (m, k, n, groups) in GROUPED.items():
        a = torch.randn(m * groups, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(groups, n, k, device="cuda", dtype=torch.bfloat16).transpose(-2, -1)
        offsets = torch.arange(1, groups + 1, device="cuda", dtype=torch.int32) * m
        try:
            seconds = _timed(lambda: torch._grouped_mm(a, b, offs=offsets, out_dtype=torch.bfloat16))
        except (RuntimeError, AttributeError, TypeError) as error:
            rows.append(_refused("grouped", name, m, k, n, groups, error))
            continue
        rows.append(_row("grouped", name, m, k, n, groups, seconds))
    return rows


def _gpu_state() -> dict:
    """The SM clock (MHz), power draw (W) and temperature (C) nvidia-smi reports now, or {} without it."""
    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,power.draw,temperature.gpu",
                               "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=10)
        clock, power, temperature = (float(x) for x in done.stdout.splitlines()[0].split(","))
    except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
        return {}
    return dict(sm_clock_mhz=clock, power_w=power, temperature_c=temperature)


def measure_sustained(torch, seconds: float) -> list[dict]:
    size = SUSTAINED_SIZE
    a, b = (torch.randn(size, size, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    per_call, rows, began = _timed(lambda: a @ b), [], time.time()
    calls = max(1, int(WINDOW_S / per_call))
    while time.time() - began < seconds:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            a @ b
        end.record()
        torch.cuda.synchronize()
        rows.append(_row("sustained", f"{size}^3 at {time.time() - began:.0f} s", size, size, size, 1,
                         start.elapsed_time(end) / 1e3 / calls, **_gpu_state()))
    return rows


def measure_all(seconds: float) -> list[dict]:
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    return measure_dense(torch) + measure_fp8(torch) + measure_grouped(torch) + measure_sustained(torch, seconds)


def predicted_seconds(row: dict) -> float:
    """The cost model's seconds for the row's GEMM on dgx-h100-80gb."""
    gemm = Gemm(row["m"], row["k"], row["n"], batch=row["groups"])
    if row["kind"] == "fp8":
        return fp8_gemm_time(gemm, CLUSTER)
    if row["kind"] == "grouped":
        return expert_gemm_time((gemm,), True, CLUSTER)
    return gemm_compute_time(gemm, CLUSTER)


def comparison_lines(rows: list[dict]) -> list[str]:
    """A markdown table: each measured row beside the cost model's rate; sustained windows against the first."""
    lines = ["| kind | GEMM | m x k x n (groups) | measured TFLOP/s | predicted TFLOP/s | measured / predicted | note |",
             "|---|---|---|---|---|---|---|"]
    first = next((row["tflops"] for row in rows if row["kind"] == "sustained" and "tflops" in row), None)
    for row in rows:
        shape = f"{row['m']} x {row['k']} x {row['n']}" + (f" ({row['groups']})" if row["groups"] > 1 else "")
        if "error" in row:
            lines.append(f"| {row['kind']} | {row['name']} | {shape} | - | - | - | {row['error']} |")
            continue
        predicted = 2.0 * row["groups"] * row["m"] * row["k"] * row["n"] / predicted_seconds(row) / 1e12
        note = ""
        if row["kind"] == "sustained":
            note = f"{row['tflops'] / first:.3f} of the first window"
            if "sm_clock_mhz" in row:
                note += f"; SM {row['sm_clock_mhz']:.0f} MHz, {row['power_w']:.0f} W, {row['temperature_c']:.0f} C"
        lines.append(f"| {row['kind']} | {row['name']} | {shape} | {row['tflops']:.1f} | {predicted:.1f} | "
                     f"{row['tflops'] / predicted:.3f} | {note} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="measure on this machine's GPU; write the rows here (JSON lines)")
    parser.add_argument("--seconds", type=float, default=60.0, help="length of the sustained run")
    parser.add_argument("--compare", type=Path, help="print the rows of this file beside the cost model's")
    args = parser.parse_args(argv)
    if args.compare is not None:
        try:
            rows = [json.loads(line) for line in args.compare.read_text().splitlines() if line.strip()]
        except (OSError, ValueError) as error:
            print(f"gemm_rates: cannot read {args.compare}: {error}", file=sys.stderr)
            return 2
        print("\n".join(comparison_lines(rows)))
        return 0
    if args.out is None:
        print("gemm_rates: give --out FILE (measure) or --compare FILE", file=sys.stderr)
        return 2
    import torch

    if not torch.cuda.is_available():
        print("gemm_rates: no CUDA device here; run it on the GPU machine (validation/gpu_session.sh gemm)",
              file=sys.stderr)
        return 2
    rows = measure_all(args.seconds)
    args.out.write_text("".join(json.dumps(row) + "\n" for row in rows))
    print("\n".join(comparison_lines(rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
