"""Check the cost model against the H100 measurements shipped in data/reference/h100/.

Run from the repository root:

    .venv/bin/python -m validation.check_h100_reference

Prints, and writes into docs/benchmarks.md under "H100 reference: predicted vs measured"
(that section replaced, every other left alone; `--no-write` only prints):

- the GEMM law (H100_COMPUTE) against the 160 measured bf16 GEMMs: mean and worst |error|;
- the forward + backward of one layer against both layer profiles (every TP / micro-batch
  point), and the attention core's forward, priced with `--attention-backend unfused`;
- the six GPT 1.7B runs on one H100, estimated as
  `megatron-auto estimate --model gpt3-1.7b --cluster dgx-h100-80gb --num-nodes 1
  --gpus-per-node 1 --global-batch-size 16 --tp 1 --pp 1 --micro-batch-size M --recompute R
  --attention-backend unfused --optimizer-impl foreach`: seconds per iteration, and the
  peak memory and fit that `estimate_plan` reports beside the measured peak allocation;
- the README's plain-PyTorch reference (SDPA flash attention, fused AdamW) at micro-batch 2
  and 4, priced with `--attention-backend flash --optimizer-impl fused`.
Targets (tests/test_h100_reference.py): GEMM, layer and run-time mean |error| at most 7%, 10%, 10%.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from benchmarks.docs_sections import write_section
from megatron_auto.h100_reference import (PROFILES, flash_reference_errors, gemm_errors, layer_points,
                                          mape, run_points)
from megatron_auto.specs.presets import H100_COMPUTE

REPO = Path(__file__).resolve().parents[1]

HEADING = "## H100 reference: predicted vs measured"
COMMAND = ".venv/bin/python -m validation.check_h100_reference"


def gemm_lines() -> list[str]:
    errors = gemm_errors(H100_COMPUTE)
    return [f"GEMM law (`H100_COMPUTE`: max_fraction {H100_COMPUTE.max_fraction}, half_dim "
            f"{H100_COMPUTE.half_dim:g}, latency {H100_COMPUTE.latency_s * 1e6:g} us) over {len(errors)} "
            f"measured bf16 GEMMs: mean |error| **{mape(errors):.1%}**, worst {abs(errors).max():.1%}.", ""]


def layer_lines() -> list[str]:
    lines = ["| profile | t | b | fwd+bwd measured ms | predicted ms | error | attention core measured ms | "
             "predicted ms |", "|---|---|---|---|---|---|---|---|"]
    summary = []
    for name in PROFILES:
        points = layer_points(name)
        for p in points:
            lines.append(f"| {name} | {p.tp} | {p.micro_batch} | {p.measured_s * 1e3:.2f} | {p.predicted_s * 1e3:.2f} "
                         f"| {p.error:+.1%} | {p.measured_core_s * 1e3:.2f} | {p.predicted_core_s * 1e3:.2f} |")
        summary.append(f"{name}: **{mape(p.error for p in points):.1%}**")
    return ["Layer forward + backward, mean |error| per profile: " + ", ".join(summary) + ".", ""] + lines + [""]


def run_lines() -> list[str]:
    points = run_points()
    lines = ["| run | b | recompute | measured s/iter | predicted s/iter | error | measured peak alloc. GiB | "
             "predicted peak GiB | OOM measured | predicted fits |", "|---|---|---|---|---|---|---|---|---|---|"]
    for p in points:
        measured = "OOM" if p.measured_s is None else f"{p.measured_s:.3f}"
        error = "" if p.error is None else f"{p.error:+.1%}"
        lines.append(f"| {p.name} | {p.micro_batch} | {p.recompute} | {measured} | {p.predicted_s:.3f} | {error} | "
                     f"{p.measured_allocated_gib:.1f} | {p.predicted_peak_gib:.1f} | {p.out_of_memory} | "
                     f"{p.predicted_fits} |")
    memory = [p.predicted_peak_gib / p.measured_allocated_gib - 1 for p in points if not p.out_of_memory]
    return [f"GPT 1.7B on one H100, seconds per iteration over the {sum(p.measured_s is not None for p in points)} "
            f"runs that ran: mean |error| **{mape(p.error for p in points):.1%}**. Peak memory (the memory "
            f"model, reported as is): mean |error| {mape(memory):.1%} against the peak allocation.", ""] + lines


def flash_lines() -> list[str]:
    lines = ["", "Flash attention and fused Adam, against the plain-PyTorch reference script of the README "
             "(`scripts/torch_reference.py`, SDPA flash, fused AdamW; not a Megatron run), priced with "
             "`--attention-backend flash --optimizer-impl fused`:", "",
             "| micro-batch | measured s/iter | predicted s/iter | error |", "|---|---|---|---|"]
    for micro_batch, (measured, predicted) in flash_reference_errors().items():
        lines.append(f"| {micro_batch} | {measured:.3f} | {predicted:.3f} | {predicted / measured - 1:+.1%} |")
    return lines


def report() -> str:
    body = [HEADING, "", "Data: data/reference/h100/ (one H100 80GB, megatron-core 0.16.1, unfused attention, "
            "torch foreach Adam, bf16). Priced with `--attention-backend unfused --optimizer-impl foreach` on "
            "dgx-h100-80gb, one GPU. Calibration: docs/cost_model.md, \"H100 calibration\".", "",
            "    " + COMMAND, ""]
    return "\n".join(body + gemm_lines() + layer_lines() + run_lines() + flash_lines()) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()
    text = report()
    print(text)
    if not args.no_write:
        write_section(REPO / "docs" / "benchmarks.md", HEADING, text)


if __name__ == "__main__":
    main()
