"""Plan quality (issues 2 and 6): published configs vs an exhaustive flag grid vs our two search spaces.

Command (writes its sections of docs/benchmarks.md; about 15 minutes on a 2-core machine for both):
    .venv/bin/python -m benchmarks.bench_plan_quality [--only published-rows|grid] [CASE ...]

published-rows, "## Plan quality on the published rows" (about 10 seconds): for each SC21 row, the row's
configuration as `megatron-auto estimate` prices it (its t, p, d and full recompute; micro-batch and virtual
stages chosen as estimate does) against the `megatron`-space and `hybrid`-space plans for the same GPUs and batch.

grid, "## Plan quality: published vs grid search vs planner": for each case (model, cluster, GPUs, batch, memory
budget), by our cost model:
  (a) the published SC21 configuration where one exists (its t, p, full recompute;
      micro-batch and virtual stages chosen as `megatron-auto estimate` does);
  (b) the best configuration of an exhaustive grid over Megatron's flags
      (megatron_auto/search/grid.py; the grid runs on 2 processes);
  (c) search_plan(..., "megatron");  (d) search_plan(..., "hybrid")  (run alone, timed);
  (e) what `megatron-auto plan --space hybrid` runs: (d) with the --recompute-modules set chosen too.
Targets: (c) and (d) never slower than (b), (e) never slower than (d). Any case where one is
is printed as SEARCH BUG and listed in the section. CASE: indices into CASES; with some, grid runs only those
and prints its section without writing it.
"""
from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, fields
from functools import partial
from pathlib import Path
from typing import Optional

from benchmarks.docs_sections import write_section
from megatron_auto.calibration import load_rows, predict_row
from megatron_auto.plan import Plan
from megatron_auto.search import search_plan
from megatron_auto.search.grid import GridResult, grid_degrees, grid_search_degrees
from megatron_auto.search.uniform import UniformConfig, best_uniform_plan
from megatron_auto.specs import TrainingSpec, load_cluster, load_model
from megatron_auto.specs.model import uniform_model
from megatron_auto.specs.presets import CLUSTER_PRESETS
from megatron_auto.specs.training import GIB

ROOT = Path(__file__).resolve().parents[1]
MODULE = "benchmarks.bench_plan_quality"
COMMAND = f"`.venv/bin/python -m {MODULE} --only grid`"
HEADING = "## Plan quality: published vs grid search vs planner"
ROWS_COMMAND = f"`.venv/bin/python -m {MODULE} --only published-rows`"
ROWS_HEADING = "## Plan quality on the published rows"
ROWS = ROOT.parent / "shared" / "reference" / "megatron_sc21_table1_subset.json"
SPLIT_WINDOW = 3
TIGHT_GIB = 40


@dataclass(frozen=True)
class Case:
    model: str
    cluster: str
    gpus: int
    batch: int
    budget_gib: Optional[int] = None
    """None: the GPU's 80 GiB (ample); else the memory-tight budget."""
    row: Optional[int] = None
    """Index of the SC21 row with this model, GPUs and batch (for (a))."""
    split_window: Optional[int] = SPLIT_WINDOW
    """First/last-stage sizes the grid tries: within this many layers of the average; None: all."""

    @property
    def label(self) -> str:
        budget = f"{self.budget_gib} GiB" if self.budget_gib else "80 GiB"
        window = "" if self.split_window is None else f" / ±{self.split_window}"
        return f"{self.model} / {self.cluster.split('-')[1]} / {self.gpus} / B={self.batch} / {budget}{window}"


CASES = [
    Case("gpt3-1.7b", "dgx-a100-80gb", 32, 512, row=0, split_window=None),
    Case("gpt3-1.7b", "dgx-a100-80gb", 32, 512, TIGHT_GIB, row=0, split_window=None),
    Case("gpt3-7.5b", "dgx-a100-80gb", 128, 512, row=1, split_window=None),
    Case("gpt3-39.1b", "dgx-a100-80gb", 512, 1536, row=2),
    Case("gpt3-39.1b", "dgx-a100-80gb", 512, 1536, TIGHT_GIB, row=2),
    Case("gpt3-145.6b", "dgx-a100-80gb", 1536, 2304, row=3),
    Case("gpt3-3.6b", "dgx-a100-80gb", 8, 256, TIGHT_GIB, split_window=None),
    Case("llama2-7b", "dgx-h100-80gb", 8, 128, split_window=None),
    Case("llama2-7b", "dgx-h100-80gb", 8, 128, TIGHT_GIB, split_window=None),
    Case("llama2-13b", "dgx-h100-80gb", 64, 512, split_window=None),
    Case("llama2-70b", "dgx-h100-80gb", 64, 512),
    Case("llama2-70b", "dgx-h100-80gb", 64, 512, TIGHT_GIB),
    Case("gpt3-175b", "dgx-h100-80gb", 1024, 1536),
    Case("gpt3-1t", "dgx-h100-80gb", 3072, 3072),
]


def job(case: Case):
    """Model, cluster and training of a case; published-row cases train in fp16 as SC21 did. Priced for
    Transformer Engine's layer spec (fused norms), as `megatron-auto plan` prices a GPU cluster by default."""
    model, cluster = load_model(case.model), load_cluster(case.cluster, case.gpus // 8)
    budget = int(case.budget_gib * GIB) if case.budget_gib else 0
    training = TrainingSpec(case.batch, precision="fp16" if case.row is not None else "bf16",
                            memory_budget_bytes=budget, fused_norms=True)
    return model, cluster, training


def published(case: Case, model, cluster, training) -> Optional[Plan]:
    """(a): the SC21 row's t and p with full recompute; the fastest micro-batch / virtual stages that fit."""
    if case.row is None:
        return None
    row = load_rows(ROWS)[case.row]
    config = UniformConfig(tp=row.tp, pp=row.pp, micro_batch_size=1, recompute="full")
    return best_uniform_plan(model, cluster, training, config, choose_micro_batch=True, choose_virtual_stages=True)


def parallel_grid(model, cluster, training, window: Optional[int], pool: ProcessPoolExecutor) -> GridResult:
    """(b) on the pool: a quick pass for an incumbent, then the full grid bounded by it."""
    started = time.perf_counter()
    pairs = grid_degrees(model, cluster, training)
    quick = GridResult()
    run = partial(_degrees, model, cluster, training, window)
    for part in pool.map(run, pairs, [None] * len(pairs), [True] * len(pairs)):
        quick.merge(part)
    result = GridResult(plan=quick.plan, config=quick.config, evaluated=quick.evaluated)
    for part in pool.map(run, pairs, [quick.plan] * len(pairs), [False] * len(pairs)):
        result.merge(part)
    result.search_time_s = time.perf_counter() - started
    return result


def _degrees(model, cluster, training, window, pair, incumbent, quick) -> GridResult:
    return grid_search_degrees(model, cluster, training, pair[0], pair[1], window,
                               incumbent=incumbent, quick=quick)


def describe_config(config: Optional[UniformConfig]) -> str:
    if config is None:
        return "-"
    text = f"t{config.tp} p{config.pp} mbs{config.micro_batch_size} v{config.vp}"
    text += " sp" if config.sequence_parallel else ""
    text += " do" if config.distributed_optimizer else ""
    text += f" rc={config.recompute}" + (f"/{config.recompute_num_layers}" if config.recompute_num_layers else "")
    text += "".join(f" +{part}" for part, on in zip(("embedding", "loss"), config.account_for) if on)
    return text + (f" split={'-'.join(map(str, config.stage_layers))}" if config.stage_layers else "")


def describe_plan(plan: Plan) -> str:
    """Layouts and recompute kinds with their layer counts, p, micro-batch, v, stage split."""
    layouts = Counter(s.short().split("·rc=")[0] for s in plan.layer_strategies)
    recompute = Counter(s.recompute for s in plan.layer_strategies)
    counts = plan.stage_layer_counts()
    text = ", ".join(f"{k}×{n}" if len(layouts) > 1 else k for k, n in layouts.items())
    text += " rc " + "/".join(f"{k}×{n}" for k, n in recompute.items())
    text += f"; p{plan.pipeline_parallel} mbs{plan.local_micro_batch(plan.embedding)} v{plan.virtual_stages}"
    text += f" split={'-'.join(map(str, counts))}" if len(set(counts)) > 1 else ""
    chunks = [len(c.layers) for c in plan.chunks]
    return text + (f" chunks={'-'.join(map(str, chunks))}" if plan.virtual_stages > 1 and len(set(chunks)) > 1
                   else "")


def explain(megatron: Plan, hybrid: Plan) -> str:
    """Why the hybrid plan is faster: what it does differently, and which time terms shrank."""
    m, h = megatron.prediction, hybrid.prediction
    deltas = sorted(((getattr(m.breakdown, f.name) - getattr(h.breakdown, f.name), f.name[:-2].replace("_", " "))
                     for f in fields(m.breakdown)), reverse=True)
    saved = ", ".join(f"{name} −{seconds:.2f} s" for seconds, name in deltas[:2] if seconds > 0)
    return (f"megatron plan [{describe_plan(megatron)}] peaks at {m.peak_memory_gib:.1f}/{m.memory_budget_gib:.0f} GiB; "
            f"hybrid [{describe_plan(hybrid)}] peaks at {h.peak_memory_gib:.1f} GiB; saves {saved}")


def run_case(case: Case, pool: ProcessPoolExecutor) -> dict:
    model, cluster, training = job(case)
    out = {"case": case, "a": published(case, model, cluster, training)}
    out["b"] = parallel_grid(model, cluster, training, case.split_window, pool)
    for key, space in (("c", "megatron"), ("d", "hybrid")):
        out[key] = search_plan(model, cluster, training, space)
    out["e"] = search_plan(model, cluster, training, "hybrid", choose_recompute_modules=True)
    return out


def _time(plan: Optional[Plan]) -> Optional[float]:
    return plan.prediction.iteration_time_s if plan is not None and plan.prediction.fits else None


def _ratio(slow: Optional[float], fast: Optional[float]) -> str:
    """Speed-up of `fast` over `slow` (>1: faster)."""
    return f"{slow / fast:.3f}" if slow and fast else "-"


def _seconds(value: Optional[float]) -> str:
    return f"{value:.3f}" if value is not None else "-"


def bugs_of(result: dict) -> list[str]:
    """(c) or (d) slower than (b), or (e) slower than (d): a search bug, stated precisely."""
    grid = _time(result["b"].plan)
    out = []
    for key, space in (("c", "megatron"), ("d", "hybrid")):
        mine = _time(result[key].plan)
        if grid is not None and (mine is None or mine > grid * (1 + 1e-9)):
            out.append(f"{result['case'].label}: {space} search {_seconds(mine)} s "
                       f"[{describe_plan(result[key].plan)}] is slower than the grid's {grid:.3f} s "
                       f"[{describe_config(result['b'].config)}]")
    chosen, fixed = _time(result["e"].plan), _time(result["d"].plan)
    if fixed is not None and (chosen is None or chosen > fixed * (1 + 1e-9)):
        out.append(f"{result['case'].label}: choosing the recompute modules gave {_seconds(chosen)} s, "
                   f"slower than core_attn's {fixed:.3f} s")
    return out


def table_lines(results: list[dict]) -> list[str]:
    lines = ["| case (model / GPU / GPUs / batch / budget) | (a) published s | (b) grid s | (c) megatron s | (d) hybrid s | "
             "(e) modules chosen s | (b) vs (a) | (c) vs (a) | (c) vs (b) | (d) vs (c) | (e) vs (d) | "
             "grid time s (configs) | (c) search s | (d) search s | (e) search s |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        a, b, c, d, e = (_time(r["a"]), _time(r["b"].plan), _time(r["c"].plan), _time(r["d"].plan),
                         _time(r["e"].plan))
        lines.append(f"| {r['case'].label} | {_seconds(a)} | {_seconds(b)} | {_seconds(c)} | {_seconds(d)} | "
                     f"{_seconds(e)} | {_ratio(a, b)} | {_ratio(a, c)} | {_ratio(b, c)} | {_ratio(c, d)} | "
                     f"{_ratio(d, e)} | {r['b'].search_time_s:.1f} ({r['b'].evaluated}) | "
                     f"{r['c'].search_time_s:.2f} | {r['d'].search_time_s:.2f} | {r['e'].search_time_s:.2f} |")
    return lines


def config_lines(results: list[dict]) -> list[str]:
    lines = ["| case | (a) published | (b) grid best | (c) megatron | (d) hybrid | (e) hybrid, modules chosen |",
             "|---|---|---|---|---|---|"]
    for r in results:
        a = r["a"]
        published_text = (f"t{a.embedding.tp} p{a.pipeline_parallel} mbs{a.local_micro_batch(a.embedding)} "
                          f"v{a.virtual_stages} rc=full" + ("" if a.prediction.fits else " (does not fit)")) if a else "-"
        lines.append(f"| {r['case'].label} | {published_text} | {describe_config(r['b'].config)} | "
                     f"{describe_plan(r['c'].plan)} | {describe_plan(r['d'].plan)} | {describe_plan(r['e'].plan)} "
                     f"re-running {' '.join(r['e'].plan.prediction.recompute_modules)} |")
    return lines


def section(results: list[dict], total_s: float) -> str:
    bugs = [bug for r in results for bug in bugs_of(r)]
    wins = [r for r in results if _time(r["d"].plan) < 0.95 * _time(r["c"].plan)]
    lines = [HEADING, "",
             f"Command: {COMMAND} ({total_s / 60:.1f} minutes on this 2-core machine). Predicted iteration seconds "
             "by our cost model; \"x vs y\" is the speed-up of x over y (time y / time x). (a): the SC21 row's t, p "
             "and full recompute, fp16, micro-batch and virtual stages chosen as `megatron-auto estimate` does. "
             "(b): exhaustive grid over Megatron's flags (`megatron_auto/search/grid.py`: every t, p, micro-batch, "
             "v, SP on/off, distributed optimizer on/off, recompute none/selective/full and block-recompute "
             f"N = 1..chunk, every first/last-stage layer count Megatron accepts (marked ±{SPLIT_WINDOW}: only "
             f"those within {SPLIT_WINDOW} layers of the average), and interleaved splits that count the embedding "
             "and/or the loss as a layer (+embedding, +loss; --account-for-embedding/loss-in-pipeline-split, "
             "chunks=...)), run on 2 processes. (c), (d): `search_plan` "
             "in the megatron and hybrid spaces, one process, selective recompute re-running core_attn (Megatron's "
             "default, which (b) also uses). (e): what `megatron-auto plan --space hybrid` runs, (d) with the "
             "--recompute-modules set chosen as well (`search/module_sets.py`). Tight budget: "
             f"`TrainingSpec.memory_budget_bytes` = {TIGHT_GIB} GiB.", ""]
    lines += table_lines(results) + ["", "Configurations (layout × layers, recompute kind × layers):", ""]
    lines += config_lines(results) + ["", "Search bugs ((c) or (d) slower than (b), (e) slower than (d)): "
                                      + ("none." if not bugs else "")]
    lines += [f"- {bug}" for bug in bugs]
    lines += ["", "Where (d) beats (c) by more than 5%: " + ("none." if not wins else "")]
    lines += [f"- {r['case'].label}: {_ratio(_time(r['c'].plan), _time(r['d'].plan))}x. "
              f"{explain(r['c'].plan, r['d'].plan)}." for r in wins]
    return "\n".join(lines) + "\n"


def published_rows_section(rows_path: Path = ROWS) -> str:
    """'## Plan quality on the published rows': each SC21 row's configuration against both spaces' plans."""
    lines = [ROWS_HEADING, "", f"Command: {ROWS_COMMAND}. Predicted iteration seconds by our cost model; ratio = "
             "published config time / plan time.", "",
             "| model | GPUs | batch | published config s | megatron plan s | ratio | hybrid plan s | "
             "hybrid vs megatron | megatron plan |", "|---|---|---|---|---|---|---|---|---|"]
    base = CLUSTER_PRESETS["dgx-a100-80gb"]
    for row in load_rows(rows_path):
        published_s = predict_row(row, base).prediction.iteration_time_s
        model = uniform_model(f"gpt3-{row.params_b}b", row.layers, row.hidden, row.heads, 2048, 51200)
        cluster = base.with_nodes(row.gpus // base.gpus_per_node)
        training = TrainingSpec(global_batch_size=row.batch, precision="fp16")
        megatron = search_plan(model, cluster, training, "megatron").plan
        hybrid = search_plan(model, cluster, training, "hybrid").plan
        m, h = megatron.prediction.iteration_time_s, hybrid.prediction.iteration_time_s
        layout = megatron.embedding
        lines.append(f"| {row.params_b}B | {row.gpus} | {row.batch} | {published_s:.2f} | {m:.2f} | "
                     f"{published_s / m:.3f} | {h:.2f} | {m / h:.3f} ({hybrid.space}) | t{layout.tp} "
                     f"p{megatron.pipeline_parallel} mbs{megatron.local_micro_batch(layout)} "
                     f"v{megatron.virtual_stages} rc={megatron.layer_strategies[0].recompute} |")
    return "\n".join(lines) + "\n"


def progress_line(case: Case, r: dict, started: float) -> str:
    """One case's figures as it finishes, then any search bug."""
    line = (f"{case.label}: a={_seconds(_time(r['a']))} b={_seconds(_time(r['b'].plan))} "
            f"c={_seconds(_time(r['c'].plan))} d={_seconds(_time(r['d'].plan))} "
            f"e={_seconds(_time(r['e'].plan))} ({' '.join(r['e'].plan.prediction.recompute_modules)}) "
            f"grid {r['b'].search_time_s:.1f} s ({r['b'].evaluated} configs) "
            f"c {r['c'].search_time_s:.1f} s d {r['d'].search_time_s:.1f} s "
            f"[{time.perf_counter() - started:.0f} s]\n")
    return line + "".join(f"SEARCH BUG: {bug}\n" for bug in bugs_of(r))


def grid_part(cases: list[Case]) -> str:
    """The grid section over `cases`, each case reported as it finishes."""
    started, results = time.perf_counter(), []
    with ProcessPoolExecutor(2) as pool:
        for case in cases:
            results.append(run_case(case, pool))
            sys.stdout.write(progress_line(case, results[-1], started))
            sys.stdout.flush()
    return section(results, time.perf_counter() - started)


PARTS = ("published-rows", "grid")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=PARTS, help="run this part alone (default: both)")
    parser.add_argument("cases", nargs="*", type=int, help="grid: only these indices of CASES (prints, writes nothing)")
    args = parser.parse_args(argv)
    docs = ROOT / "docs" / "benchmarks.md"
    if args.only in (None, "published-rows"):
        body = published_rows_section()
        write_section(docs, ROWS_HEADING, body)
        sys.stdout.write(body)
    if args.only in (None, "grid"):
        cases = [CASES[i] for i in args.cases] or CASES
        body = grid_part(cases)
        if len(cases) == len(CASES):
            write_section(docs, HEADING, body)
        sys.stdout.write(body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
