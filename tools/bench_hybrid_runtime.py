"""The hybrid runtime on 4 CPU gloo ranks: its overhead on a uniform plan, and hybrid vs uniform plans.

Command (replaces its section of docs/benchmarks.md; takes the shared heavy-job lock itself):
    .venv/bin/python tools/bench_hybrid_runtime.py [--iters 30] [--rounds 3] [--no-docs]

Three runs of tools/pretrain_gpt.py with saved plans (--auto-parallel-plan), the tiny GPT of its
docstring (4 layers, h=64, s=64, B=16) on mock data:
- `uniform/stock`: the planner's best `megatron`-space plan, run by the stock runtime;
- `uniform/hybrid`: the same plan re-labelled `hybrid` (same layout, same micro-batches), run by the
  hybrid runtime (per-segment blocks, DDPs, optimizers, re-layout calls): (a) the overhead;
- `hybrid plan`: the planner's best `hybrid`-space plan on the analytic cpu-gloo cluster, and, when that
  is the uniform plan itself, `hybrid plan, no ZeRO-1` (the best hybrid plan under
  --no-distributed-optimizer, i.e. ZeRO-3 layers): (b) predicted vs measured ratio against the best
  uniform plan.
Runs alternate (stock, hybrid, planned, stock, ...) so the machine's drift spreads over all three;
each figure is the median step time over every step after WARMUP of every round.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

from heavy_lock import held_lock_fds, lock_prefix  # noqa: E402

PYTHON = sys.executable
MODEL = {"num_layers": 4, "hidden_size": 64, "num_attention_heads": 4, "seq_length": 64, "vocab_size": 256}
GLOBAL_BATCH = 16
COMMON = ["--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "64",
          "--max-position-embeddings", "64", "--global-batch-size", str(GLOBAL_BATCH), "--lr", "3e-3",
          "--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", "256", "--log-interval", "1",
          "--eval-interval", "100000", "--eval-iters", "0"]
WARMUP = 5
ITERATION = re.compile(r"iteration\s+(\d+)/\s*\d+ .*elapsed time per iteration \(ms\): ([0-9.]+)")
HEADING = "## Hybrid runtime: overhead on a uniform plan, hybrid vs uniform plans (4 CPU gloo ranks)"


def plan_json(space: str, out: Path, *extra: str) -> dict:
    """The planner's best plan of `space` (analytic cpu-gloo, 4 ranks; `extra` constraints), saved to `out`."""
    model = out.with_name("model.json")
    model.write_text(json.dumps(MODEL))
    command = [PYTHON, "-m", "megatron_auto", "plan", "--model", str(model), "--cluster", "cpu-gloo",
               "--num-nodes", "1", "--gpus-per-node", "4", "--global-batch-size", str(GLOBAL_BATCH),
               "--space", space, "--json", "--out", str(out), *extra]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def relabel_hybrid(plan_path: Path, out: Path) -> None:
    """The same plan as a `hybrid`-space plan (the hybrid runtime runs it)."""
    from megatron_auto.plan import load_plan, save_plan

    save_plan(dataclasses.replace(load_plan(str(plan_path)), space="hybrid"), str(out))


def train(plan: Path, iters: int) -> list[float]:
    """Step times (ms) after warm-up of one 4-rank pretrain_gpt run of `plan`."""
    command = [*lock_prefix(), PYTHON, "-m", "torch.distributed.run", "--nproc_per_node", "4",
               str(ROOT / "tools" / "pretrain_gpt.py"), *COMMON, "--train-iters", str(iters),
               "--micro-batch-size", "1", "--auto-parallel-plan", str(plan)]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900,
                          pass_fds=held_lock_fds())
    if done.returncode:
        raise SystemExit(f"run failed ({done.returncode}): {' '.join(command)}\n{done.stderr[-3000:]}")
    log = done.stdout + done.stderr
    return [float(ms) for it, ms in ITERATION.findall(log) if int(it) > WARMUP]


def layout(plan: dict) -> str:
    """Compact per-layer layout of a plan JSON: tp·dp·z(·sp) ×count, micro-batches."""
    layers = [l for chunk in plan["chunks"] for l in chunk["layers"]]
    names = [f"tp{l['tp']}·dp{l['dp']}·z{l['zero']}{'·sp' if l['sp'] else ''}" for l in layers]
    runs = [f"{n}×{names.count(n)}" for n in dict.fromkeys(names)]
    return f"{' / '.join(runs)}; pp{plan['pipeline_parallel']}, m={plan['num_micro_batches']}"


def measure(plans: dict[str, Path], iters: int, rounds: int) -> dict[str, list[float]]:
    """Step times per plan, the plans run in turn, `rounds` times."""
    steps: dict[str, list[float]] = {name: [] for name in plans}
    for _ in range(rounds):
        for name, path in plans.items():
            steps[name] += train(path, iters)
            sys.stderr.write(f"{name}: {len(steps[name])} steps, median {statistics.median(steps[name]):.1f} ms\n")
    return steps


def _layouts(plan: dict) -> list:
    return [chunk["layers"] for chunk in plan["chunks"]] + [plan["embedding"], plan["num_micro_batches"]]


def section(stock: dict, hybrids: dict[str, dict], steps: dict[str, list[float]], iters: int, rounds: int) -> str:
    """The markdown section of docs/benchmarks.md."""
    med = {name: statistics.median(times) for name, times in steps.items()}
    overhead = med["uniform/hybrid"] / med["uniform/stock"] - 1
    plans = {"uniform/stock": stock, "uniform/hybrid": stock, **hybrids}
    rows = "\n".join(f"| {name} | `{layout(plans[name]['plan'])}` | {plans[name]['iteration_time_s'] * 1e3:.1f} | "
                     f"{len(steps[name])} | {med[name]:.1f} |" for name in steps)
    ratios = "\n".join(f"- {name}: predicted **{stock['iteration_time_s'] / h['iteration_time_s']:.3f}**, "
                       f"measured **{med['uniform/stock'] / med[name]:.3f}**" for name, h in hybrids.items())
    relabelled = [name for name, h in hybrids.items() if h["plan"]["space"] == "megatron"]
    note = (f"\n`{'`, `'.join(relabelled)}`: the hybrid search found a plan stock Megatron expresses and labelled it "
            f"`megatron`, so pretrain_gpt ran it on the stock runtime: a second measurement of the uniform plan, "
            f"and so a gauge of this machine's run-to-run noise.\n" if relabelled else "")
    return (f"{HEADING}\n\nCommand: `.venv/bin/python tools/bench_hybrid_runtime.py --iters {iters} --rounds {rounds}` "
            f"(tiny GPT: 4 layers, h=64, s=64, B=16, fp32, mock data; plans from the analytic cpu-gloo cluster; "
            f"runs alternate; median over all steps after {WARMUP} warm-up steps per run).\n\n"
            f"| run | layout | predicted ms | steps | median step ms |\n|---|---|---|---|---|\n{rows}\n\n"
            f"(a) Hybrid runtime vs stock runtime on the same uniform plan: **{overhead * 100:+.1f}%** per step "
            f"(target at most +2%).\n\n"
            f"(b) Hybrid plans vs the best uniform (`megatron`-space) plan, time(uniform) / time(hybrid):\n"
            f"{ratios}\n{note}")


def write_section(text_section: str) -> None:
    """Replace (or append) this benchmark's section of docs/benchmarks.md, leaving the others alone."""
    docs = ROOT / "docs" / "benchmarks.md"
    text = docs.read_text()
    start = text.find(HEADING)
    if start < 0:
        text = text.rstrip() + "\n\n" + text_section
    else:
        end = text.find("\n## ", start + len(HEADING))
        text = text[:start] + text_section + (text[end + 1:] if end >= 0 else "")
    docs.write_text(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=30, help="iterations per run (the first WARMUP are dropped)")
    parser.add_argument("--rounds", type=int, default=3, help="times each plan runs")
    parser.add_argument("--no-docs", action="store_true", help="print the section, leave docs/benchmarks.md alone")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        stock = plan_json("megatron", tmp_path / "stock.json")
        hybrids = {"hybrid plan": plan_json("hybrid", tmp_path / "hybrid.json")}
        # The best hybrid plan without ZeRO-1 (ZeRO-3 layers): a distinct plan when the unconstrained
        # hybrid search returns the uniform one.
        constrained = plan_json("hybrid", tmp_path / "hybrid_nodo.json", "--no-distributed-optimizer")
        if _layouts(constrained["plan"]) != _layouts(hybrids["hybrid plan"]["plan"]):
            hybrids["hybrid plan, no ZeRO-1"] = constrained
        relabel_hybrid(tmp_path / "stock.json", tmp_path / "uniform_hybrid.json")
        files = {"hybrid plan": "hybrid.json", "hybrid plan, no ZeRO-1": "hybrid_nodo.json"}
        plans = {"uniform/stock": tmp_path / "stock.json", "uniform/hybrid": tmp_path / "uniform_hybrid.json",
                 **{name: tmp_path / files[name] for name in hybrids}}
        steps = measure(plans, args.iters, args.rounds)
    text = section(stock, hybrids, steps, args.iters, args.rounds)
    if not args.no_docs:
        write_section(text)
    sys.stdout.write(text)


if __name__ == "__main__":
    main()
