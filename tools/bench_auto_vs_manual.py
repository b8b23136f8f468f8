"""`--auto-parallel` against the same layout given as Megatron flags, on 4 CPU gloo ranks.

Command (appends/replaces a section of docs/benchmarks.md):
    .venv/bin/python tools/bench_auto_vs_manual.py

Both runs train the README's tiny GPT on the shipped corpus. The manual run is
given the flags that the planner printed for the auto run, so any gap is the
cost of planning and of the auto-parallel path itself. Runs alternate
(auto, manual, auto, manual) to spread drift of the machine over both; the
ratio is median(auto step) / median(manual step) over all steps after warm-up.
"""
from __future__ import annotations

import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

from docs_sections import replace_section

ROOT = Path(__file__).resolve().parents[1]
PYTHON = sys.executable
DATA_PREFIX = ROOT / "data" / "generated" / "tiny"
COMMON = ["--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "64",
          "--max-position-embeddings", "64", "--global-batch-size", "16", "--train-iters", "45",
          "--lr", "3e-3", "--min-lr", "3e-4", "--lr-decay-style", "cosine", "--lr-warmup-iters", "5",
          "--data-path", f"{DATA_PREFIX}_text_document", "--tokenizer-type", "ByteTokenizer",
          "--log-interval", "1", "--eval-interval", "1000", "--eval-iters", "1"]
WARMUP = 5
ROUNDS = 3  # auto, manual, auto, manual, auto, manual
ITERATION = re.compile(r"iteration\s+(\d+)/\s*\d+ .*elapsed time per iteration \(ms\): ([0-9.]+)")
FLAG_BLOCK = re.compile(r"megatron-lm flags\n((?:\s+--.*\n)+)")


def run(extra: list[str]) -> str:
    command = [PYTHON, "-m", "torch.distributed.run", "--nproc_per_node", "4", str(ROOT / "tools" / "pretrain_gpt.py"),
               *COMMON, *extra]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    if done.returncode:
        raise SystemExit(f"run failed ({done.returncode}): {' '.join(command)}\n{done.stderr[-2000:]}")
    return done.stdout + done.stderr


def step_times(log: str) -> list[float]:
    return [float(ms) for it, ms in ITERATION.findall(log) if int(it) > WARMUP]


def planned_flags(log: str) -> list[str]:
    block = FLAG_BLOCK.search(log)
    if not block:
        raise SystemExit("the auto-parallel run printed no Megatron flags")
    return " ".join(line.strip().rstrip("\\") for line in block.group(1).splitlines()).split()


def without_flag(flags: list[str], name: str) -> list[str]:
    """Drop `name` and its value from a flag list."""
    if name not in flags:
        return flags
    index = flags.index(name)
    return flags[:index] + flags[index + 2:]


def ensure_data() -> None:
    if not Path(f"{DATA_PREFIX}_text_document.bin").exists():
        subprocess.run([PYTHON, str(ROOT / "tools" / "preprocess_data.py"), "--input", str(ROOT / "data" / "tiny_corpus.jsonl"),
                        "--output-prefix", str(DATA_PREFIX), "--tokenizer-type", "ByteTokenizer"], check=True)


def main() -> None:
    ensure_data()
    first = run(["--micro-batch-size", "2", "--auto-parallel"])
    manual_flags = without_flag(planned_flags(first), "--global-batch-size")
    auto_runs, manual_runs = [step_times(first)], []
    for round_ in range(ROUNDS):
        manual_runs.append(step_times(run(manual_flags)))
        if round_ < ROUNDS - 1:
            auto_runs.append(step_times(run(["--micro-batch-size", "2", "--auto-parallel"])))
    auto, manual = sum(auto_runs, []), sum(manual_runs, [])
    ratio = statistics.median(auto) / statistics.median(manual)
    per_run = ", ".join(f"{statistics.median(a):.1f}/{statistics.median(m):.1f}" for a, m in zip(auto_runs, manual_runs))
    section = ("## --auto-parallel against the same flags by hand (4 CPU gloo ranks)\n\n"
               "Command: `.venv/bin/python tools/bench_auto_vs_manual.py` (tiny GPT of the README demo, "
               f"{len(auto)} auto and {len(manual)} manual steps after {WARMUP} warm-up steps per run).\n\n"
               f"| path | median step ms |\n|---|---|\n| --auto-parallel | {statistics.median(auto):.1f} |\n"
               f"| manual `{' '.join(manual_flags)}` | {statistics.median(manual):.1f} |\n\n"
               f"Ratio auto / manual: **{ratio:.3f}** (target at most 1.02). Per-round medians, auto/manual ms: "
               f"{per_run} (the spread between rounds of the same command is this machine's noise).\n")
    docs = ROOT / "docs" / "benchmarks.md"
    text = docs.read_text()
    text = replace_section(text, "## --auto-parallel against the same flags by hand", section)
    docs.write_text(text)
    sys.stdout.write(section)


if __name__ == "__main__":
    main()
