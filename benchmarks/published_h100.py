"""Benchmark: NVIDIA's published H100 runs, each priced at its own configuration, against their measured step time.

Run from the repository root:

    .venv/bin/python -m benchmarks.published_h100            # every row, with the planner's own plan
    .venv/bin/python -m benchmarks.published_h100 --no-plan --no-write

Rows: ../shared/reference/published_h100/runs.json and data/published_h100/*.json (each row cites its
source). Each is priced as `megatron-auto estimate` prices the row's flags (megatron_auto/published_runs.py):
its TP, PP, CP, EP, virtual stages and micro-batch where the source gives them (else the fastest that
fits, as estimate picks), SP with TP, the distributed optimizer, and the knobs its recipe turns. The
planner's own plan for the same job (`megatron-auto plan`, megatron space) is priced beside it. The table
goes into docs/benchmarks.md under "Published H100 runs"; every other section is left alone.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import fields
from pathlib import Path

from benchmarks.docs_sections import write_section
from megatron_auto.plan import TimeBreakdown
from megatron_auto.published_runs import PricedRun, load_runs, price_run, unstated_layout_errors

REPO = Path(__file__).resolve().parents[1]
HEADING = "## Published H100 runs: predicted vs measured step time"
COMMAND = ".venv/bin/python -m benchmarks.published_h100"


def default_row_files() -> list[Path]:
    shared = REPO.parent / "shared" / "reference" / "published_h100" / "runs.json"
    return [path for path in (shared, *sorted((REPO / "data" / "published_h100").glob("*.json"))) if path.exists()]


def _layout(priced: PricedRun) -> str:
    plan = priced.estimate
    if plan is None:
        return " ".join(priced.run.flags)
    s = plan.embedding
    return (f"tp{s.tp} pp{plan.pipeline_parallel} cp{s.cp} v{plan.virtual_stages} "
            f"mbs{plan.local_micro_batch(s)}")


def _planned_cell(priced: PricedRun) -> str:
    plan = priced.planned
    if plan is None or priced.estimate is None:
        return "-"
    speedup = priced.estimate.prediction.iteration_time_s / plan.prediction.iteration_time_s
    s = plan.embedding
    return f"tp{s.tp} pp{plan.pipeline_parallel} cp{s.cp} v{plan.virtual_stages} ({speedup:.2f}x)"


def row_line(priced: PricedRun) -> str:
    run = priced.run
    if priced.error:
        return f"| {run.id} | {run.precision} | {run.num_gpus} | {_layout(priced)} | {run.measured_step_s:.2f} | " \
               f"not priced: {priced.error} | | | | |"
    prediction = priced.estimate.prediction
    return (f"| {run.id} | {run.precision} | {run.num_gpus} | {_layout(priced)} | {run.measured_step_s:.2f} | "
            f"{prediction.iteration_time_s:.2f} | {priced.step_error:+.1%} | {'yes' if prediction.fits else 'no'} | "
            f"{prediction.device_memory_gib:.1f} | {_planned_cell(priced)} |")


def summary_lines(results: list[PricedRun]) -> list[str]:
    lines = []
    collections = sorted({r.run.collection for r in results})
    for collection in (*collections, "all") if len(collections) > 1 else collections:
        for precision in ("bf16", "fp8"):
            errors = [abs(r.step_error) for r in results if r.run.precision == precision and r.step_error is not None
                      and collection in ("all", r.run.collection)]
            if errors:
                lines.append(f"- {collection}, {precision}: {len(errors)} rows, mean |error| "
                             f"{sum(errors) / len(errors):.1%}, worst {max(errors):.1%}")
    lines += release_year_lines(results) + stated_layout_lines(results)
    priced = [r for r in results if r.estimate is not None]
    fits = sum(r.estimate.prediction.fits for r in priced)
    lines.append(f"- predicted to fit: {fits} of {len(results)} ({len(results) - len(priced)} not priced)")
    return lines


def release_year_lines(results: list[PricedRun]) -> list[str]:
    """The signed and absolute step error of the rows whose software came out in each year: the same job measured
    in two releases can differ by more than the model's error (the rows' `release`)."""
    lines = []
    for year in sorted({r.run.release_year for r in results if r.run.release_year}):
        errors = [r.step_error for r in results if r.run.release_year == year and r.step_error is not None]
        if errors:
            lines.append(f"- software of {year}: {len(errors)} rows, mean error {sum(errors) / len(errors):+.1%}, "
                         f"mean |error| {sum(map(abs, errors)) / len(errors):.1%}")
    return lines


def stated_layout_lines(results: list[PricedRun]) -> list[str]:
    """The mean |error| of the rows whose source states its micro-batch, beside those that leave it (and the virtual
    stages) to estimate's fastest pick, the optimistic end (`unstated_layout_errors`)."""
    lines = []
    for stated, words in ((True, "micro-batch stated by the source"), (False, "micro-batch left to estimate")):
        errors = [abs(r.step_error) for r in results
                  if r.step_error is not None and ("--micro-batch-size" in r.run.flags) == stated]
        if errors:
            lines.append(f"- {words}: {len(errors)} rows, mean |error| {sum(errors) / len(errors):.2%}")
    return lines


def same_job_key(run) -> tuple:
    """What makes two rows the same job: the architecture, GPUs, global batch, precision and layout flags (a
    token-drop run is another workload than a dropless one of the same layout)."""
    model = json.dumps({k: v for k, v in run.model.items() if k != "name"}, sort_keys=True)
    return model, run.num_gpus, run.global_batch_size, run.precision, run.flags, "tokendrop" in run.id


def same_job_lines(results: list[PricedRun]) -> list[str]:
    """Rows that measured the same job in different releases: how far apart NVIDIA's own step times are, beside
    the predictions (the same model prices both alike, up to their recipes' knobs)."""
    groups: dict[tuple, list[PricedRun]] = {}
    for priced in results:
        groups.setdefault(same_job_key(priced.run), []).append(priced)
    lines = []
    for group in (g for g in groups.values() if len(g) > 1 and all(p.estimate is not None for p in g)):
        measured = [p.run.measured_step_s for p in group]
        cells = ", ".join(f"{p.run.id} ({p.run.release}) measured {p.run.measured_step_s:.2f} s, predicted "
                          f"{p.predicted_step_s:.2f} s" for p in group)
        lines.append(f"- {cells}: measured {max(measured) / min(measured) - 1:.1%} apart")
    return lines


GAIN_WORTH_EXPLAINING = 1.10
"""Where the planner predicts more than 10% over NVIDIA's configuration, the table says what of."""


def difference_line(priced: PricedRun) -> str | None:
    """What the planner's plan saves over the row's layout, term by term (TimeBreakdown, critical stage),
    when it predicts more than GAIN_WORTH_EXPLAINING of a speed-up; None otherwise."""
    if priced.planned is None or priced.estimate is None:
        return None
    ours, theirs = priced.planned.prediction, priced.estimate.prediction
    if theirs.iteration_time_s < GAIN_WORTH_EXPLAINING * ours.iteration_time_s:
        return None
    terms = []
    for field in fields(TimeBreakdown):
        saved = getattr(theirs.breakdown, field.name) - getattr(ours.breakdown, field.name)
        if abs(saved) >= 0.01 * theirs.iteration_time_s:
            terms.append(f"{field.name[:-2]} {saved:+.2f} s")
    fit_note = "" if theirs.fits else " (NVIDIA's layout is predicted not to fit)"
    return (f"- {priced.run.id}: {theirs.iteration_time_s:.2f} s -> {ours.iteration_time_s:.2f} s{fit_note}; "
            f"saved by term: {', '.join(terms) or 'none above 1%'}")


def unstated_layout_line(priced: PricedRun, errors: list[tuple[int, int, float]]) -> str | None:
    """The row's error at each layout that fits over what its source leaves unstated (`errors`:
    unstated_layout_errors), by micro-batch, with the range they span and whether the measurement lies in it."""
    if priced.estimate is None or not errors:
        return None
    picked = f"mbs {priced.estimate.local_micro_batch(priced.estimate.embedding)} v {priced.estimate.virtual_stages}"
    groups = []
    for size in sorted({size for size, _, _ in errors}):
        cells = ", ".join(f"v{chunks} {error:+.1%}" for s, chunks, error in errors if s == size)
        groups.append(f"mbs {size}: {cells}")
    low, high = error_span(errors)
    inside = "the measurement inside" if low <= 0.0 <= high else "the measurement outside"
    return (f"- {priced.run.id} (picked {picked}, {priced.step_error:+.1%}): {'; '.join(groups)} "
            f"(range {low:+.1%} to {high:+.1%}, {inside})")


def error_span(errors: list[tuple[int, int, float]]) -> tuple[float, float]:
    """The least and the greatest step error of an unstated_layout_errors grid."""
    values = [error for *_, error in errors]
    return min(values), max(values)


def unstated_layout_summary(spans: list[tuple[float, float]]) -> str:
    """How many of the rows with an unstated layout have their measured step inside the predicted range."""
    inside = sum(low <= 0.0 <= high for low, high in spans)
    return (f"- layout left to estimate: the measured step lies inside the range of predictions over the unstated "
            f"micro-batch and virtual stages for {inside} of {len(spans)} rows")


def misfit_line(priced: PricedRun) -> str | None:
    """A row whose own layout is predicted not to fit, with its peak stage's memory by term; None otherwise."""
    if priced.estimate is None or priced.estimate.prediction.fits:
        return None
    prediction = priced.estimate.prediction
    terms = prediction.memory_breakdown
    return (f"- {priced.run.id}: {prediction.device_memory_gib:.1f} GiB against {prediction.memory_budget_gib:.1f} "
            f"(peak at the {terms.peak_moment}: states {terms.states_gib:.1f}, activations "
            f"{terms.activations_gib:.1f}, logits {terms.logits_gib:.1f}, CUDA context and NCCL "
            f"{terms.cuda_context_gib + terms.nccl_gib:.1f})")


def render(results: list[PricedRun]) -> str:
    lines = [HEADING, "",
             f"Command: `{COMMAND}` (preset `dgx-h100-80gb`). Measured step time: the source's tokens/s "
             "(global batch x sequence / (tokens/s/GPU x GPUs)), or for the Megatron-LM README rows its TFLOP/s "
             "under Megatron-LM's FLOP count. Layout: the row's own (v and mbs: estimate's pick where the source "
             "is silent); NeMo's rows also reduce gradients in bf16 and overlap TP communication (their "
             "recipes, megatron_auto/published_runs.py), and every row carries what its recipe ran beyond its "
             "table, read in the recipe code (the rows' notes in data/published_h100/more_runs.json; for the "
             "shared rows data/published_h100/recipes/shared_rows.json: NeMo 24.07's Nemotron-4 340B FP8, whose "
             "recipe is not public, runs the knobs of NVIDIA's DGX Cloud recipe of the same layout). Planner: "
             "`megatron-auto plan` for the same job, with its predicted speed-up over the row's layout.", "",
             "| run | precision | GPUs | layout | measured s | predicted s | error | fits | device GiB | planner |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    lines += [row_line(r) for r in results]
    differences = [line for line in map(difference_line, results) if line]
    if differences:
        lines += ["", f"Where the planner predicts more than {GAIN_WORTH_EXPLAINING - 1:.0%} over NVIDIA's layout "
                      "(critical stage's terms, NVIDIA's minus the planner's):", "", *differences]
    grids = {r.run.id: unstated_layout_errors(r.run) for r in results if r.estimate is not None}
    unstated = [line for line in (unstated_layout_line(r, grids.get(r.run.id, [])) for r in results) if line]
    if unstated:
        spans = [error_span(grid) for grid in grids.values() if grid]
        lines += ["", "Rows whose source does not state the micro-batch (nor, with pipeline stages, the virtual "
                      "stages): the error at each layout that fits (estimate picks the fastest, the optimistic end; "
                      "`published_runs.unstated_layout_errors`):", "", *unstated, unstated_layout_summary(spans)]
    same = same_job_lines(results)
    if same:
        lines += ["", "The same job measured in two releases (architecture, GPUs, global batch, precision and layout "
                      "alike; `same_job_lines`): how far NVIDIA's own measurements of one job lie apart.", "", *same]
    misfits = [line for line in map(misfit_line, results) if line]
    if misfits:
        lines += ["", "Predicted not to fit at the row's own layout (what each needs: docs/cost_model.md, section "
                      "6a):", "", *misfits]
    return "\n".join(lines + ["", *summary_lines(results), ""])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", nargs="+", type=Path, help="runs.json files (default: the shared and the added)")
    parser.add_argument("--no-plan", action="store_true", help="skip the planner's own plan for each row")
    parser.add_argument("--no-write", action="store_true", help="print only; leave docs/benchmarks.md alone")
    args = parser.parse_args(argv)
    runs = load_runs(*(args.rows or default_row_files()))
    results = [price_run(run, with_plan=not args.no_plan) for run in runs]
    text = render(results)
    sys.stdout.write(text)
    if not args.no_write:
        write_section(REPO / "docs" / "benchmarks.md", HEADING, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
