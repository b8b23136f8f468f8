"""Fit the GEMM-efficiency law (ComputeEfficiency): A100 to SC21 Table 1, H100 to measured GEMMs.

Run from the repository root:

    .venv/bin/python -m validation.calibrate_compute            # A100, SC21 Table 1
    .venv/bin/python -m validation.calibrate_compute --gemms    # H100, data/reference/h100/gemm_bf16.jsonl

With --gemms: the 160 bf16 GEMMs measured on one H100 (data/reference/h100/README.md).
time = max(latency_s, 2mkn / (peak x max_fraction x prod d/(d + half_dim))); on a grid of
half_dim (0-396, step 4) and latency_s (10-30 us, step 0.5 us), max_fraction is the least-squares
fit in relative error over the GEMMs above the floor (megatron_auto.h100_reference.fit_gemm_law),
and the grid point of least mean |error| wins (about 1 s). Prints the constants (shipped as
H100_COMPUTE in megatron_auto/specs/presets.py) and the mean and worst |error| of the fit and of
the shipped constants.

Each of the five published rows of shared/reference/megatron_sc21_table1_subset.json
(Narayanan et al. SC21, Table 1) is estimated with its (t, p, d, batch) and full
recomputation by `megatron_auto.calibration.row_errors`, exactly as
`megatron-auto estimate` would (micro-batch size and virtual stages chosen as the
fastest that fit). One pair of constants serves all five rows; the fit minimises
the maximum absolute relative error over the rows, first on a coarse grid and
then on a fine grid around the coarse optimum (about 420 evaluations, ~1 minute
on one core). Ties are broken by the smaller sum of absolute errors.

Options: --rows PATH (default ../shared/reference/...), --base PRESET (default
dgx-a100-80gb), --efficiency-table (skip the fit; print the per-GEMM and
per-layer efficiency of GPT-3 layers under the preset's constants, the table
in docs/cost_model.md). Prints the fitted constants, the per-row errors and, for
comparison, the errors of the constants shipped in megatron_auto/specs/presets.py.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

from megatron_auto.calibration import load_rows, row_errors
from megatron_auto.specs.cluster import ComputeEfficiency
from megatron_auto.specs.presets import CLUSTER_PRESETS

DEFAULT_ROWS = Path(__file__).resolve().parents[2] / "shared" / "reference" / "megatron_sc21_table1_subset.json"
if not DEFAULT_ROWS.exists():
    DEFAULT_ROWS = Path("/work/shared/reference/megatron_sc21_table1_subset.json")


def frange(start: float, stop: float, step: float) -> list[float]:
    """Inclusive arithmetic range, rounded so grid points print cleanly."""
    count = int(round((stop - start) / step))
    return [round(start + i * step, 6) for i in range(count + 1)]


def score(errors: list[float]) -> tuple[float, float]:
    """(max |error|, sum |error|): what the fit minimises, in that order."""
    return max(abs(e) for e in errors), sum(abs(e) for e in errors)


def grid_search(rows, base: str, fractions: list[float], half_dims: list[float], best=None):
    """Best (score, fraction, half_dim, errors) over the grid, starting from `best`."""
    for fraction in fractions:
        for half_dim in half_dims:
            if not 0.0 < fraction <= 1.0 or half_dim <= 0:
                continue
            errors = row_errors(rows, ComputeEfficiency(fraction, half_dim), base)
            candidate = (score(errors), fraction, half_dim, errors)
            if best is None or candidate[0] < best[0]:
                best = candidate
    return best


def fit(rows, base: str):
    """Coarse grid (step 0.02 x 16), then a fine grid (0.005 x 4) around its optimum."""
    coarse = grid_search(rows, base, frange(0.50, 0.90, 0.02), frange(16.0, 256.0, 16.0))
    _, fraction, half_dim, _ = coarse
    fine = grid_search(rows, base, frange(fraction - 0.02, fraction + 0.02, 0.005),
                       frange(half_dim - 16.0, half_dim + 16.0, 4.0), best=coarse)
    return fine


def print_errors(rows, errors: list[float]) -> None:
    print(f"  {'model':>8} {'t':>2} {'p':>3} {'d':>3} {'batch':>5}  {'error':>7}")
    for row, error in zip(rows, errors):
        print(f"  {row.params_b:>7}B {row.tp:>2} {row.pp:>3} {row.dp:>3} {row.batch:>5}  {error:+7.2%}")


# (preset, t, micro-batch) as the published-row estimates pick them (docs/benchmarks.md).
EFFICIENCY_ROWS = (("gpt3-1.7b", 1, 16), ("gpt3-7.5b", 4, 16), ("gpt3-39.1b", 8, 6),
                   ("gpt3-145.6b", 8, 4), ("gpt3-530b", 8, 1))


def print_efficiency_table(base: str) -> None:
    """Efficiency of the QKV and QK^T GEMMs and of a whole layer (FLOP-weighted) per shard."""
    from megatron_auto.cost.compute import gemm_efficiency
    from megatron_auto.cost.flops import layer_gemms
    from megatron_auto.specs.presets import MODEL_PRESETS

    cluster = CLUSTER_PRESETS[base]
    print("| model | t | b | QKV GEMM | QK^T GEMM | layer | TFLOP/s |")
    print("|---|---|---|---|---|---|---|")
    for name, tp, samples in EFFICIENCY_ROWS:
        gemms = layer_gemms(MODEL_PRESETS[name].layers[0], 2048, samples, tp)
        efficiencies = [gemm_efficiency(g, cluster.compute) for g in gemms]
        layer = sum(g.flops for g in gemms) / sum(g.flops / e for g, e in zip(gemms, efficiencies))
        print(f"| {name} | {tp} | {samples} | {efficiencies[0]:.3f} | {efficiencies[1]:.3f} | {layer:.3f} | "
              f"{layer * cluster.gpu.peak_flops / 1e12:.0f} |")


def fit_measured_gemms() -> None:
    """Fit and print the H100 GEMM law on data/reference/h100/gemm_bf16.jsonl."""
    from megatron_auto.h100_reference import fit_gemm_law, gemm_errors

    cluster = CLUSTER_PRESETS["dgx-h100-80gb"]
    fitted, _ = fit_gemm_law(cluster.gpu.peak_flops)
    for label, compute in (("fitted", fitted), ("shipped", cluster.compute)):
        errors = gemm_errors(compute)
        print(f"{label}: max_fraction={compute.max_fraction}, half_dim={compute.half_dim}, "
              f"latency_s={compute.latency_s:g}  mean |error| {abs(errors).mean():.2%}, "
              f"worst {abs(errors).max():.2%} over {len(errors)} GEMMs")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default=str(DEFAULT_ROWS))
    parser.add_argument("--base", default="dgx-a100-80gb")
    parser.add_argument("--efficiency-table", action="store_true")
    parser.add_argument("--gemms", action="store_true", help="fit the H100 law to the measured GEMMs")
    args = parser.parse_args()
    if args.efficiency_table:
        print_efficiency_table(args.base)
        return
    if args.gemms:
        fit_measured_gemms()
        return
    rows = load_rows(args.rows)
    start = time.perf_counter()
    (max_err, sum_err), fraction, half_dim, errors = fit(rows, args.base)
    elapsed = time.perf_counter() - start
    print(f"fitted: ComputeEfficiency(max_fraction={fraction:.3f}, half_dim={half_dim:.1f})")
    print(f"  max |error| {max_err:.2%}, mean |error| {sum_err / len(rows):.2%}, fit took {elapsed:.1f} s")
    print_errors(rows, errors)
    shipped = CLUSTER_PRESETS[args.base].compute
    shipped_errors = row_errors(rows, shipped, args.base)
    print(f"shipped: ComputeEfficiency(max_fraction={shipped.max_fraction:.3f}, half_dim={shipped.half_dim:.1f})"
          f"  max |error| {score(shipped_errors)[0]:.2%}")
    print_errors(rows, shipped_errors)


if __name__ == "__main__":
    main()
