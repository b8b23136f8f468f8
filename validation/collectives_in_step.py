"""Count and time every torch.distributed call inside real training steps, per rank.

The check behind profile-cluster's method (megatron_auto/profiling/cluster_bench.py)
and the cost model's collective counts: runs validation plans
(validation/validate_cost_model.py's names) through tools/pretrain_gpt.py with every
collective wrapped, and prints per step, per (op, group size, bytes): calls,
seconds per call (sync calls: the call; async ones: the wait on its handle; bytes:
the first tensor argument, the output of an all-gather or reduce-scatter) and
each rank's step time and time inside collectives. Iterations 2..n-1 are counted.
Calls made inside torch's _coalescing_manager (DDP's gradient buckets) only queue
work there, and the wait on the manager is not timed: those rows read ~0 ms.

    .venv/bin/python -m validation.collectives_in_step --plans "tp2 dp2 mbs2" "tp2 dp2 mbs2 sp" \\
        --profile docs/profiles/cpu4_cluster.json docs/profiles/cpu4_model.json

Every launch holds /tmp/megatron-auto-heavy.lock (validation/heavy_lock.py).
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WRAPPED = ("all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor", "all_gather_single",
           "reduce_scatter_single", "all_to_all_single", "all_gather", "broadcast", "send", "recv")
STATS: dict[tuple[str, int, int], list[float]] = collections.defaultdict(lambda: [0, 0.0])
COUNTING = [False]


def _record(key: tuple[str, int, int], start: float) -> None:
    if COUNTING[0]:
        STATS[key][0] += 1
        STATS[key][1] += time.perf_counter() - start


class _TimedWork:
    """An async collective's handle whose wait() is timed."""

    def __init__(self, work, key: tuple[str, int, int]) -> None:
        self._work, self._key = work, key

    def wait(self, *args, **kwargs):
        start = time.perf_counter()
        result = self._work.wait(*args, **kwargs)
        _record(self._key, start)
        return result

    def __getattr__(self, name: str):
        return getattr(self._work, name)


def _wrap(dist, name: str, function):
    def timed(*args, **kwargs):
        tensor = args[0] if args and hasattr(args[0], "element_size") else None
        nbytes = tensor.numel() * tensor.element_size() if tensor is not None else 0
        group = kwargs.get("group")
        size = dist.get_world_size(group) if dist.is_initialized() else 0
        start = time.perf_counter()
        work = function(*args, **kwargs)
        if kwargs.get("async_op") and work is not None:
            return _TimedWork(work, (name + " (async, wait)", size, nbytes))
        _record((name, size, nbytes), start)
        return work
    return timed


def worker(out_dir: str, flags: list[str]) -> int:
    """One rank: wrap the collectives (before megatron binds them), then run pretrain_gpt."""
    import torch.distributed as dist

    for name in WRAPPED:
        if hasattr(dist, name):
            setattr(dist, name, _wrap(dist, name, getattr(dist, name)))
    from megatron_auto.runtime import session

    original, steps = session.run_iteration, []

    def run_iteration(job):
        COUNTING[0] = 1 <= job.iteration < job.settings.train_iters - 1
        start = time.perf_counter()
        result = original(job)
        if COUNTING[0]:
            steps.append(time.perf_counter() - start)
        COUNTING[0] = False
        if job.iteration + 1 >= job.settings.train_iters:
            Path(out_dir, f"rank{os.environ['RANK']}.json").write_text(json.dumps(
                {"steps": steps, "stats": [[*key, *value] for key, value in STATS.items()]}))
        return result

    session.run_iteration = run_iteration
    from megatron_auto.train import main as pretrain_gpt_main

    return pretrain_gpt_main(flags)


def report(name: str, out_dir: Path, ranks: int) -> str:
    """Per-rank step and collective seconds, and rank 0's calls per step by (op, group, bytes)."""
    lines = [f"== {name}"]
    for rank in range(ranks):
        record = json.loads((out_dir / f"rank{rank}.json").read_text())
        n = len(record["steps"])
        inside = sum(s[4] for s in record["stats"]) / n
        lines.append(f"rank {rank}: step {statistics.median(record['steps']) * 1e3:.0f} ms, "
                     f"in collectives {inside * 1e3:.0f} ms")
        if rank == 0:
            for op, size, nbytes, calls, seconds in sorted(record["stats"], key=lambda s: -s[4]):
                lines.append(f"  {op:36s} group {size:2d} {nbytes:9d} B  {calls / n:5.1f}/step  "
                             f"{seconds / calls * 1e3:6.2f} ms/call  {seconds / n * 1e3:6.1f} ms/step")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:
        return worker(argv[1], argv[2:])
    from megatron_auto.plan import save_plan
    from megatron_auto.specs.training import TrainingSpec
    from validation.heavy_lock import held_lock_fds, lock_prefix
    from validation.validate_cost_model import FULL_CONFIGS, Job, build_plans, cpu_cluster

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--plans", nargs="+", required=True, help="validation plan names")
    parser.add_argument("--profile", nargs="*", default=[], help="cluster and model profiles (for the pick)")
    args = parser.parse_args(argv)
    job = Job()
    plans = build_plans(job, FULL_CONFIGS, cpu_cluster(job, args.profile), TrainingSpec.fp32(job.global_batch),
                        hybrid=True)
    for name in args.plans:
        with tempfile.TemporaryDirectory() as tmp:
            save_plan(plans[name], Path(tmp) / "plan.json")
            command = [*lock_prefix(), sys.executable, "-m", "torch.distributed.run", "--nproc_per_node",
                       str(job.ranks), "--master_port", "29535", "-m", "validation.collectives_in_step", "--worker", tmp,
                       *job.flags(),
                       "--auto-parallel-plan", str(Path(tmp) / "plan.json")]
            done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"},
                                  cwd=ROOT, pass_fds=held_lock_fds())
            if done.returncode != 0:
                sys.stderr.write(done.stderr[-3000:])
                return 1
            sys.stdout.write(report(name, Path(tmp), job.ranks))
    return 0


if __name__ == "__main__":
    sys.exit(main())
