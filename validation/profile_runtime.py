"""Measure the training runtime's own overhead and store it in a cluster profile.

The layer and collective profiles time a TransformerLayer and each collective
alone. A training step of tools/pretrain_gpt.py does more: Megatron's schedule
and forward_step, the batch, the embedding, LM head and loss, DDP's gradient
buffers and hooks, the grad-norm and loss all-reduces. This tool runs the real
runtime on the local ranks with a calibration model of ONE layer (the
validation job's shape otherwise), pure data parallelism, at micro-batch sizes
1, 2 and G/ranks (m = G/ranks, G/(2 ranks), 1 micro-batches), takes the median
step time T_i, subtracts what the profiled cost model already covers C_i
(estimate_plan with the profiles and no overhead), and solves

    T_i - C_i = step_overhead_s + m_i * micro_batch_overhead_s

by least squares (two unknowns, three runs). The two numbers are written into
the cluster profile (ClusterProfile.step_overhead_s, micro_batch_overhead_s)
and are then charged to every plan by cost.models.runtime_overhead: measured
once on the calibration runs, never fitted to the plans that are validated.

    OMP_NUM_THREADS=1 .venv/bin/python -m validation.profile_runtime \\
        --profile docs/profiles/cpu4_cluster.json docs/profiles/cpu4_model.json

Every launch holds /tmp/megatron-auto-heavy.lock (validation/heavy_lock.py).
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

from megatron_auto import serde
from megatron_auto.cost.estimate import estimate_plan
from megatron_auto.search.uniform import UniformConfig, build_uniform_plan
from megatron_auto.specs.profiles import ClusterProfile, load_profile
from megatron_auto.specs.training import TrainingSpec
from validation.validate_cost_model import Job, cpu_cluster, run_plan


def calibration_points(job: Job, profiles: list[str]) -> list[tuple[int, float, float]]:
    """(micro-batches m, measured step s, covered s) of the one-layer calibration runs."""
    training = TrainingSpec.fp32(job.global_batch)
    cluster = _without_overhead(cpu_cluster(job, profiles))
    per_rank = job.global_batch // job.ranks
    points = []
    with tempfile.TemporaryDirectory() as tmp:
        for mbs in sorted({1, max(1, per_rank // 2), per_rank}):
            plan = build_uniform_plan(job.model(), cluster, training, UniformConfig(tp=1, pp=1, micro_batch_size=mbs))
            measured, _ = run_plan(plan, job, Path(tmp))
            covered = estimate_plan(plan, job.model(), cluster, training).iteration_time_s
            points.append((plan.num_micro_batches, measured, covered))
            sys.stderr.write(f"mbs {mbs} (m={plan.num_micro_batches}): measured {measured * 1e3:.1f} ms, "
                             f"covered by the profiles {covered * 1e3:.1f} ms\n")
    return points


def recovered_points(path: str, job: Job, profiles: list[str]) -> list[tuple[int, float, float]]:
    """Measured steps of an earlier calibration (its stdout JSON), with `covered` recomputed from `profiles`."""
    training = TrainingSpec.fp32(job.global_batch)
    cluster = _without_overhead(cpu_cluster(job, profiles))
    points = []
    for point in json.loads(Path(path).read_text())["points"]:
        config = UniformConfig(tp=1, pp=1, micro_batch_size=job.global_batch // job.ranks // point["micro_batches"])
        plan = build_uniform_plan(job.model(), cluster, training, config)
        covered = estimate_plan(plan, job.model(), cluster, training).iteration_time_s
        points.append((plan.num_micro_batches, point["measured_s"], covered))
    return points


def _without_overhead(cluster):
    """The cluster with its profile's runtime overhead zeroed: what the profiles alone cover."""
    measured = cluster.measured
    if measured is None or measured.cluster is None:
        raise SystemExit("profile_runtime.py needs a cluster profile (--profile CLUSTER.json MODEL.json)")
    bare = replace(measured.cluster, step_overhead_s=0.0, micro_batch_overhead_s=0.0)
    return replace(cluster, measured=replace(measured, cluster=bare))


def solve_overhead(points: list[tuple[int, float, float]]) -> tuple[float, float]:
    """Least-squares (step_overhead_s, micro_batch_overhead_s) of residual = a + m b, both >= 0."""
    ms = [m for m, _, _ in points]
    residuals = [t - c for _, t, c in points]
    mean_m, mean_r = sum(ms) / len(ms), sum(residuals) / len(residuals)
    var = sum((m - mean_m) ** 2 for m in ms)
    slope = sum((m - mean_m) * (r - mean_r) for m, r in zip(ms, residuals)) / var if var else 0.0
    slope = max(0.0, slope)
    return max(0.0, mean_r - slope * mean_m), slope


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", nargs=2, required=True, metavar=("CLUSTER", "MODEL"),
                        help="the cluster profile (updated in place unless --out) and the model profile")
    parser.add_argument("--out", help="write the updated cluster profile here instead")
    parser.add_argument("--ranks", type=int, default=Job.ranks, help="local ranks (as in the validation)")
    parser.add_argument("--iters", type=int, default=8, help="training iterations per calibration run")
    parser.add_argument("--measured", help="reuse the measured steps of an earlier run's JSON output "
                                           "(after re-profiling layers or collectives) instead of launching")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cluster_path, model_path = args.profile
    if not isinstance(load_profile(cluster_path), ClusterProfile):
        raise SystemExit(f"{cluster_path} is not a cluster profile")
    job = replace(Job(), layers=1, ranks=args.ranks, iters=args.iters)
    points = (recovered_points(args.measured, job, [cluster_path, model_path]) if args.measured
              else calibration_points(job, [cluster_path, model_path]))
    step_s, chunk_s = solve_overhead(points)
    profile = replace(load_profile(cluster_path), step_overhead_s=step_s, micro_batch_overhead_s=chunk_s)
    Path(args.out or cluster_path).write_text(serde.dumps(profile) + "\n")
    sys.stdout.write(json.dumps({"step_overhead_s": step_s, "micro_batch_overhead_s": chunk_s,
                                 "points": [{"micro_batches": m, "measured_s": t, "covered_s": c}
                                            for m, t, c in points]}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
