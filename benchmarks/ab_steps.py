"""Two plans' training steps interleaved in one 4-rank launch: an A/B of step time that outside load cancels from.

Run under torchrun from the repository root (the benchmarks launch it; OMP_NUM_THREADS=1 per rank):
    python -m torch.distributed.run --nproc_per_node 4 -m benchmarks.ab_steps A.json B.json BLOCKS OUT.json \\
        -- <pretrain_gpt.py flags: model, batch, data>

Both plans are built into sessions side by side on the same ranks through megatron_auto.train's helpers and
runtime.session.build_session (A first; a later build re-creates Megatron's parallel_state, so the two plans
must have the same TP and PP sizes, which keeps the earlier session's step-time lookups valid). After
WARMUP steps of each, steps run in blocks A, B, B, A (the next block starts where this one ended), each
after a barrier and timed on every rank: wall time, and the process's CPU time (all threads). The last rank
writes {"a": wall ms, "b": ..., "a_cpu": CPU ms summed over the ranks, "b_cpu": ...} to OUT.json.
`block_ratios` turns them into one ratio B/A per block.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WARMUP = 5


def block_ratios(a: list[float], b: list[float]) -> list[float]:
    """Per A, B, B, A block, (its two B steps) / (its two A steps)."""
    return [(b[2 * i] + b[2 * i + 1]) / (a[2 * i] + a[2 * i + 1]) for i in range(len(a) // 2)]


def launch(plan_a: Path, plan_b: Path, blocks: int, flags: list[str], out: Path) -> dict:
    """Run this module under torchrun on 4 ranks (inside the caller's heavy-job lock); its OUT.json."""
    import os
    import socket
    import subprocess

    from validation.heavy_lock import held_lock_fds

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "4", "--master_port", str(port),
               "-m", "benchmarks.ab_steps", str(plan_a), str(plan_b), str(blocks), str(out), "--", *flags]
    done = subprocess.run(command, cwd=ROOT, env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True,
                          text=True, timeout=3600, pass_fds=held_lock_fds())
    if done.returncode:
        raise SystemExit(f"A/B launch failed ({done.returncode}): {' '.join(command)}\n{done.stderr[-3000:]}")
    return json.loads(out.read_text())


def _sessions(plan_paths: list[str], flags: list[str]):
    import patches
    from megatron_auto import train
    from megatron_auto.plan import load_plan
    from megatron_auto.runtime import distributed, session
    from megatron_auto.runtime.tokenizers import tokenizer_from_flags

    args = train.parse_args(flags)
    tokenizer = tokenizer_from_flags(args)
    settings = train.settings_from_args(args, tokenizer.vocab_size)
    model = train.model_from_args(args, tokenizer.vocab_size)
    patches.apply_all()
    info = distributed.init_distributed(settings.timeout_s)
    return [session.build_session(load_plan(path), model, settings, info.backend, info.device) for path in plan_paths]


def _interleave(jobs: list, blocks: int) -> tuple[list[list[float]], list[list[float]]]:
    """(wall ms, CPU ms) per step of job 0 and job 1, in A, B, B, A blocks."""
    import torch
    from megatron_auto.runtime import session

    for _ in range(WARMUP):
        for job in jobs:
            session.run_iteration(job)
    wall: list[list[float]] = [[], []]
    cpu: list[list[float]] = [[], []]
    for _ in range(blocks):
        for which in (0, 1, 1, 0):
            torch.distributed.barrier()
            start, start_cpu = time.perf_counter(), time.process_time()
            session.run_iteration(jobs[which])
            wall[which].append((time.perf_counter() - start) * 1e3)
            cpu[which].append((time.process_time() - start_cpu) * 1e3)
    return wall, cpu


def main(argv: list[str]) -> None:
    import torch
    from megatron_auto.runtime import distributed, session

    plan_a, plan_b, blocks, out = argv[:4]
    flags = argv[argv.index("--") + 1:]
    jobs = _sessions([plan_a, plan_b], [*flags, "--train-iters", str(4 * int(blocks) + 2 * WARMUP)])
    try:
        wall, cpu = _interleave(jobs, int(blocks))
        every = [None] * torch.distributed.get_world_size()
        torch.distributed.all_gather_object(every, cpu)
        if session.is_logging_rank():
            total = [[sum(step) for step in zip(*(rank[which] for rank in every))] for which in (0, 1)]
            Path(out).write_text(json.dumps({"a": wall[0], "b": wall[1], "a_cpu": total[0], "b_cpu": total[1]}))
    finally:
        distributed.shutdown()


if __name__ == "__main__":
    main(sys.argv[1:])
