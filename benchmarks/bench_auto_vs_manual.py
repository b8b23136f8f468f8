"""`--auto-parallel` against the same layout given as Megatron flags, on 4 CPU gloo ranks.

Command, from the repository root (replaces its section of docs/benchmarks.md; takes the shared heavy-job lock
itself):
    .venv/bin/python -m benchmarks.bench_auto_vs_manual [--pairs 10] [--iters 125] [--blocks 300] [--launches 3] \\
        [--no-docs]

Both paths train the README's tiny GPT on the shipped corpus (tools/pretrain_gpt.py, OMP_NUM_THREADS=1 on
each rank). The manual path is given the flags that the planner printed for the auto run.

1. `--pairs` pairs of pretrain_gpt launches, one after the other in alternating order (auto manual,
   manual auto, ...); each pair is checked to have built the same thing (the same plan table, cluster name
   and predictions aside, and bit-identical losses at every iteration); per launch the median step time
   after WARMUP, per pair the ratio auto/manual.
2. In-process (benchmarks/ab_steps.py): the Plans that megatron_auto.train's `choose_plan` makes of the two flag sets,
   built side by side in one 4-rank launch, steps alternating in blocks manual, auto, auto, manual; one
   ratio auto/manual per block. Outside load, which moves a whole launch's median by 10-30% on this
   shared machine, falls on both alike.

Each is reported as the median of its ratios with a distribution-free 95% interval (validation/paired_ratio.py).
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks import ab_steps
from benchmarks.docs_sections import add_ab_arguments, publish
from validation.heavy_lock import held_lock_fds, hold_lock_or_relaunch
from validation.paired_ratio import load_average, pair_order, paired_ratio

ROOT = Path(__file__).resolve().parents[1]
MODULE = "benchmarks.bench_auto_vs_manual"
PYTHON = sys.executable
DATA_PREFIX = ROOT / "data" / "generated" / "tiny"
COMMON = ["--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "64",
          "--max-position-embeddings", "64", "--global-batch-size", "16",
          "--lr", "3e-3", "--min-lr", "3e-4", "--lr-decay-style", "cosine", "--lr-warmup-iters", "5",
          "--data-path", f"{DATA_PREFIX}_text_document", "--tokenizer-type", "ByteTokenizer",
          "--log-interval", "1", "--eval-interval", "100000", "--eval-iters", "1"]
AUTO = ["--micro-batch-size", "2", "--auto-parallel"]
WARMUP = 5
ITERATION = re.compile(r"iteration\s+(\d+)/\s*\d+ .*elapsed time per iteration \(ms\): ([0-9.]+)")
LOSS = re.compile(r"iteration\s+(\d+)/.*lm loss: ([0-9.E+-]+)")
FLAG_BLOCK = re.compile(r"megatron-lm flags\n((?:\s+--.*\n)+)")
PLAN_TABLE = re.compile(r"parallel plan \((?:auto-parallel|flags)\):\n(.*?)\n\n(stages\n.*?)\n\n", re.S)
HEADING = "## --auto-parallel against the same flags by hand (4 CPU gloo ranks)"


def run(extra: list[str], iters: int) -> str:
    """The log of one 4-rank pretrain_gpt launch."""
    command = [PYTHON, "-m", "torch.distributed.run", "--nproc_per_node", "4", str(ROOT / "tools" / "pretrain_gpt.py"),
               *COMMON, "--train-iters", str(iters), *extra]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900,
                          pass_fds=held_lock_fds())
    if done.returncode:
        raise SystemExit(f"run failed ({done.returncode}): {' '.join(command)}\n{done.stderr[-2000:]}")
    return done.stdout + done.stderr


def step_times(log: str) -> list[float]:
    return [float(ms) for it, ms in ITERATION.findall(log) if int(it) > WARMUP]


def losses(log: str) -> list[str]:
    return [loss for _, loss in LOSS.findall(log)]


def planned_flags(log: str) -> list[str]:
    block = FLAG_BLOCK.search(log)
    if not block:
        raise SystemExit("the auto-parallel run printed no Megatron flags")
    return " ".join(line.strip().rstrip("\\") for line in block.group(1).splitlines()).split()


def plan_layout(log: str) -> str:
    """The printed plan table without the cluster name and the planner's predictions."""
    found = PLAN_TABLE.search(log)
    if not found:
        raise SystemExit("a run printed no plan table")
    head = re.sub(r" of cluster \S+", "", found.group(1))
    stages = re.sub(r";\s*busy.*", "", found.group(2))
    return f"{head}\n{stages}"


def without_flag(flags: list[str], name: str) -> list[str]:
    """Drop `name` and its value from a flag list."""
    if name not in flags:
        return flags
    index = flags.index(name)
    return flags[:index] + flags[index + 2:]


def ensure_data() -> None:
    if not Path(f"{DATA_PREFIX}_text_document.bin").exists():
        subprocess.run([PYTHON, str(ROOT / "tools" / "preprocess_data.py"), "--input", str(ROOT / "data" / "tiny_corpus.jsonl"),
                        "--output-prefix", str(DATA_PREFIX), "--tokenizer-type", "ByteTokenizer", "--append-eod"], check=True)


def check_same_job(auto_log: str, manual_log: str) -> None:
    """Both paths ran the same plan and computed the same losses, bit for bit."""
    if plan_layout(auto_log) != plan_layout(manual_log):
        raise SystemExit(f"the plans differ:\n{plan_layout(auto_log)}\n---\n{plan_layout(manual_log)}")
    if losses(auto_log) != losses(manual_log) or not losses(auto_log):
        raise SystemExit("the auto and manual runs computed different losses")


def sequential_pairs(commands: tuple[list[str], list[str]], pairs: int, iters: int) -> list[dict]:
    """`pairs` pairs of (auto, manual) launches one after the other, in alternating order."""
    rows = []
    for index in range(pairs):
        logs, load = ["", ""], load_average()
        for which in pair_order(index):
            logs[which] = run(commands[which], iters)
        check_same_job(*logs)
        row = {"first": "auto" if pair_order(index)[0] == 0 else "manual", "load": load,
               "auto": statistics.median(step_times(logs[0])), "manual": statistics.median(step_times(logs[1]))}
        row["ratio"] = row["auto"] / row["manual"]
        rows.append(row)
        sys.stderr.write(f"pair {index}: auto {row['auto']:.1f} ms, manual {row['manual']:.1f} ms, "
                         f"ratio {row['ratio']:.3f}, load {load:.1f}\n")
    return rows


def plans_of_both_paths(manual_flags: list[str], tmp: Path) -> tuple[Path, Path]:
    """The Plans pretrain_gpt builds from the auto flags and from the manual flags, saved to `tmp`."""
    from megatron_auto import train
    from megatron_auto.plan import save_plan
    from megatron_auto.runtime.tokenizers import tokenizer_from_flags

    paths = []
    for name, extra in (("auto", AUTO), ("manual", manual_flags)):
        args = train.parse_args([*COMMON, "--train-iters", "1", *extra])
        vocab = tokenizer_from_flags(args).vocab_size
        plan = train.choose_plan(args, train.model_from_args(args, vocab), 4, train.settings_from_args(args, vocab))
        paths.append(tmp / f"{name}.json")
        save_plan(plan, str(paths[-1]))
    return paths[0], paths[1]


def in_process_ab(manual_flags: list[str], blocks: int, launches: int) -> list[list[float]]:
    """Per ab_steps.py launch, the block ratios auto/manual of wall time (A = manual plan, B = auto plan)."""
    found = []
    with tempfile.TemporaryDirectory() as tmp:
        auto, manual = plans_of_both_paths(manual_flags, Path(tmp))
        for _ in range(launches):
            times = ab_steps.launch(manual, auto, blocks, COMMON, Path(tmp) / "ab.json")
            found.append(ab_steps.block_ratios(times["a"], times["b"]))
            sys.stderr.write(f"A/B launch: manual {statistics.median(times['a']):.1f} ms, auto "
                             f"{statistics.median(times['b']):.1f} ms, median block ratio "
                             f"{statistics.median(found[-1]):.3f}\n")
    return found


def _verdict(summary) -> str:
    if summary.meets(1.02):
        return "met (the whole interval is at or below 1.02)"
    if summary.median <= 1.02:
        return "not resolved (median within, interval reaches above 1.02)"
    return "**not met**"


def section(rows: list[dict], ab: list[list[float]], manual_flags: list[str], args: argparse.Namespace,
            layout: str) -> str:
    apart = paired_ratio([row["ratio"] for row in rows])
    inside = paired_ratio([r for ratios in ab for r in ratios])
    table = "\n".join(f"| {i} | {row['first']} | {row['auto']:.1f} | {row['manual']:.1f} | {row['ratio']:.3f} | "
                      f"{row['load']:.1f} |" for i, row in enumerate(rows))
    loads = [row["load"] for row in rows]
    per_launch = ", ".join(f"{statistics.median(ratios):.3f}" for ratios in ab)
    return (f"{HEADING}\n\n"
            f"Command: `.venv/bin/python -m benchmarks.bench_auto_vs_manual --pairs {args.pairs} --iters {args.iters} "
            f"--blocks {args.blocks} --launches {args.launches}` (takes the heavy-job lock; tiny GPT of the README "
            f"demo on the shipped corpus, OMP_NUM_THREADS=1 per rank).\n\n"
            f"Same job on both paths, checked in every pair: the same plan table (`{layout}`) and bit-identical "
            f"losses at every iteration; tests/runtime/test_auto_matches_flags.py checks that the printed flags "
            f"rebuild the auto plan field for field (cluster label and prediction aside). Manual flags: "
            f"`{' '.join(manual_flags)}`.\n\n"
            f"(1) pretrain_gpt launches, one pair after another in alternating order, median step time of "
            f"{args.iters - WARMUP} steps after {WARMUP} warm-up steps per launch:\n\n"
            f"| pair | first | auto median ms | manual median ms | auto/manual | load avg before |\n"
            f"|---|---|---|---|---|---|\n{table}\n\n"
            f"Median of the pair ratios auto/manual: {apart.describe()}; target at most 1.02: {_verdict(apart)}. "
            f"Load average {min(loads):.1f}-{max(loads):.1f} on 2 cores.\n\n"
            f"(2) In one launch (benchmarks/ab_steps.py): the Plans that pretrain_gpt's `choose_plan` builds from the "
            f"`--auto-parallel` flags and from the manual flags, both built into sessions on the same 4 ranks; "
            f"{args.blocks} blocks of steps manual, auto, auto, manual per launch, {args.launches} launches, one "
            f"ratio (two auto steps)/(two manual steps) per block: {inside.describe()}; target at most 1.02: "
            f"{_verdict(inside)}. Per launch: {per_launch}.\n\n"
            f"Why both: (1) is the target's own setting, but on this shared 2-core machine the median step time of "
            f"the same command moves by 10-30% from one launch to the next as other jobs come and go (and so does "
            f"its CPU time per step; starting the two launches side by side did not cancel it either: 4 such "
            f"pairs gave 1.00-1.17), which alternating pairs only cancel when it is slower than a launch (~40 s). "
            f"(2) alternates the two paths' plans every step, so outside load falls on both alike. What (2) "
            f"leaves out is the launch before the first step (the search runs only on the auto path): a check "
            f"with gc callbacks found the same Python heap after it (403.6k vs 403.1k objects) and under 5 ms of "
            f"garbage collection in 120 steps on either path.\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=10, help="pairs of launches (at least 6)")
    parser.add_argument("--iters", type=int, default=125, help="iterations per launch (the first WARMUP untimed)")
    add_ab_arguments(parser, launches=3)
    args = parser.parse_args()
    hold_lock_or_relaunch(PYTHON, ["-m", MODULE, *sys.argv[1:]])
    ensure_data()
    first = run(AUTO, args.iters)
    commands = (AUTO, without_flag(planned_flags(first), "--global-batch-size"))
    ab = in_process_ab(commands[1], args.blocks, args.launches)
    rows = sequential_pairs(commands, args.pairs, args.iters)
    layout = "; ".join(line.strip() for line in plan_layout(first).splitlines() if "layers" in line)
    publish(HEADING, section(rows, ab, commands[1], args, layout), args.no_docs)


if __name__ == "__main__":
    main()
