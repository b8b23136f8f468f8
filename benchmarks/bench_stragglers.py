"""Benchmark (issue 39): a straggler found at run time, and the step time before and after the job re-plans.

Run from the repository root (about ten minutes on two cores):

    .venv/bin/python -m benchmarks.bench_stragglers          # writes "## Stragglers" in docs/benchmarks.md
    .venv/bin/python -m benchmarks.bench_stragglers --no-docs

Four torchrun agents on this machine, one rank each, stand for four nodes of one GPU (`torchrun --nnodes 4
--nproc-per-node 1 --node-rank R`, so LOCAL_WORLD_SIZE is 1 as on such nodes). They train a 16-layer GPT in a
pipeline of 4 under --auto-parallel with --save, the straggler watch every 3 iterations, and the test-only switch
MEGATRON_AUTO_SLOW_RANK=2:2:BASE (runtime/stragglers.py): every rank's forward and backward passes last BASE times
their compute (the pass's CPU seconds), rank 2's twice that. With BASE 3 each rank's core idles two thirds of a pass, as a GPU leaves its
host, so the four ranks run side by side on two cores (with BASE 5 the passes outweigh the runtime's own work
between them further, as on a GPU); with BASE 1 they time-slice the two cores, which hides much of the slow rank
behind the others' shared cores (all three are measured). Each row: the iteration the job
re-planned at, the slowdown it measured, its predicted gain, and the median step time of the iterations before
the re-plan (from the third) and after it (from the third of the resumed session).
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.docs_sections import publish
from megatron_auto.pipeline_layout import chunk_layers_of_layout

HEADING = "## Stragglers: re-planned at run time"
COMMAND = ".venv/bin/python -m benchmarks.bench_stragglers"
REPO = Path(__file__).resolve().parents[1]
NODES = 4
NUM_LAYERS, PIPELINE = 16, 4
MODEL = ["--num-layers", str(NUM_LAYERS), "--hidden-size", "128", "--num-attention-heads", "4", "--seq-length", "128",
         "--max-position-embeddings", "128", "--micro-batch-size", "2", "--global-batch-size", "16",
         "--lr", "3e-3", "--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", "512",
         "--log-interval", "1", "--eval-iters", "0", "--hidden-dropout", "0", "--attention-dropout", "0",
         "--pipeline-model-parallel-size", str(PIPELINE), "--auto-parallel", "--auto-parallel-straggler-interval", "3"]
ITERATION = re.compile(r" iteration +(\d+)/ +\d+ \|.*?per iteration \(ms\): (\S+) \|.*\| lm loss: (\S+) \|")
REPLAN = re.compile(r"stragglers: iteration (\d+): (.*?); re-planned, .*?--pipeline-model-parallel-layout (\S+)")


def iterations(log: str) -> dict[int, tuple[float, float]]:
    """{iteration: (milliseconds, loss)} of a run's iteration lines (a resumed session logs on from its checkpoint)."""
    return {int(i): (float(ms), float(loss)) for i, ms, loss in ITERATION.findall(log)}


def replans(log: str) -> list[tuple[int, str, str]]:
    """(iteration, what was measured, the new plan's pipeline layout) of each re-plan in a run's log."""
    return [(int(i), measured, layout) for i, measured, layout in REPLAN.findall(log)]


def layout_stage_layers(layout: str) -> str:
    """Decoder layers per stage of a --pipeline-model-parallel-layout over the job's PIPELINE stages, with the
    chunks per stage where it interleaves ("Et*3|t*3|t|t*2|t*2|t*2|t|t*2L": "5, 5, 2, 4 in 2 chunks each")."""
    chunks = chunk_layers_of_layout(layout, PIPELINE, NUM_LAYERS)
    stages = [sum(chunks[stage::PIPELINE]) for stage in range(PIPELINE)]
    virtual = len(chunks) // PIPELINE
    return ", ".join(map(str, stages)) + (f" in {virtual} chunks each" if virtual > 1 else "")


def before_and_after(log: str) -> tuple[list[float], list[float]]:
    """Step milliseconds before the first re-plan (from iteration 3) and after it (from the resumed session's
    third iteration): the first two of each session warm up."""
    first = replans(log)[0][0]
    times = {step: ms for step, (ms, _) in iterations(log).items()}
    return ([times[s] for s in sorted(times) if 3 <= s <= first],
            [times[s] for s in sorted(times) if s >= first + 3])


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_job(slow: str, argv: list[str], workdir: Path, timeout_s: float = 1200) -> str:
    """The last node's output of one job on four single-rank torchrun agents (MEGATRON_AUTO_SLOW_RANK=`slow`)."""
    port = _free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), "MEGATRON_AUTO_SLOW_RANK": slow}
    argv = [*MODEL, *argv, "--save", str(workdir / "ckpt")]
    agents = []
    for node in range(NODES):
        log = (workdir / f"node{node}.log").open("w")
        command = [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(NODES), "--nproc-per-node", "1",
                   "--node-rank", str(node), "--master-addr", "127.0.0.1", "--master-port", str(port),
                   "tools/pretrain_gpt.py", *argv]
        agents.append(subprocess.Popen(command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT))
    codes = [agent.wait(timeout=timeout_s) for agent in agents]
    output = (workdir / f"node{NODES - 1}.log").read_text(errors="replace")
    if any(codes):
        raise RuntimeError(f"the job failed (exit codes {codes}):\n{output[-3000:]}")
    return output


def measured_job(slow: str, iterations_: int) -> str:
    """The last node's log of the job run for `iterations_` iterations with MEGATRON_AUTO_SLOW_RANK=`slow`."""
    workdir = Path(tempfile.mkdtemp(prefix="bench-stragglers-"))
    try:
        return run_job(slow, ["--train-iters", str(iterations_)], workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def row(base: float, iterations_: int) -> str:
    """One table row: the job at `base` with rank 2 slowed, and without (its median step from iteration 3)."""
    log = measured_job(f"2:2:{base:g}", iterations_)
    healthy = statistics.median(ms for step, (ms, _) in iterations(measured_job(f"2:1:{base:g}", 8)).items()
                                if step >= 3)
    found = replans(log)
    if not found:
        return f"| {base:g} | no re-plan | | | | | | | {healthy:.0f} ms |"
    at, measured, layout = found[0]
    slowdown = re.search(r"rank 2 \(node 2\) at (\S+)x", measured).group(1)
    gain = re.search(r"\(([+-][\d.]+%)\)", measured).group(1)
    before, after = before_and_after(log)
    b, a = statistics.median(before), statistics.median(after)
    split = layout_stage_layers(layout)
    return (f"| {base:g} | {at} | {slowdown}x | {split} | -{gain[1:]} | {b:.0f} ms | {a:.0f} ms | {a / b - 1:+.1%} "
            f"| {healthy:.0f} ms |")


def render(bases: list[float], iterations_: int) -> str:
    lines = [HEADING, "",
             f"Command: `{COMMAND}` ({os.cpu_count()} cores here). Four single-rank torchrun agents (four nodes of one "
             "device), a 16-layer GPT (hidden 128, sequence 128, global batch 16) in a pipeline of 4 under "
             "--auto-parallel, rank 2 slowed 2x by MEGATRON_AUTO_SLOW_RANK=2:2:BASE; the straggler watch every 3 "
             "iterations. Base: how many times its compute (the CPU seconds of the pass) every rank's passes last (5, 3: "
             "each core idles most of a pass, as a GPU's host does; 1: the four ranks time-slice two cores). Measured: the slowdown the "
             "watch found, the layers per stage of the re-plan (the first plan: 4 per stage), the cost model's "
             "predicted change of the step time (the new plan against the running one, both at the measured speeds), "
             "and the median step time before the re-plan "
             "and after it; beside them the same job without a slow rank. Target (issue 39): at least 20% lower "
             "after.", "",
             "| base | re-planned at | measured | new split | predicted | before | after | change | no straggler |",
             "|---|---|---|---|---|---|---|---|---|"]
    return "\n".join(lines + [row(base, iterations_) for base in bases]) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bases", type=float, nargs="+", default=[5.0, 3.0, 1.0])
    parser.add_argument("--iterations", type=int, default=16)
    parser.add_argument("--no-docs", action="store_true", help="print the section, leave docs/benchmarks.md alone")
    args = parser.parse_args(argv)
    publish(HEADING, render(args.bases, args.iterations), args.no_docs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
