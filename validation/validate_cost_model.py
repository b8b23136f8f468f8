"""Predicted against measured: step time and peak memory of real runs on the local cluster.

For each plan, runs tools/pretrain_gpt.py (through validation/validation_worker.py,
which adds the peak-memory measurement) under torchrun with `--auto-parallel-plan`,
takes the median `elapsed time per iteration (ms)` over the iterations after the
first (warm-up) and before the last (memory-profiled), and compares with
`estimate_plan` under the analytic cost model and under `--profile` files.
Peak memory: see validation/validation_worker.py; the prediction compared is the cost
model's peak less `framework_overhead_bytes` (the non-tensor part of a process).

    .venv/bin/python -m validation.validate_cost_model \\
        --profile docs/profiles/cpu4_cluster.json docs/profiles/cpu4_model.json

Every launch is wrapped in `flock /tmp/megatron-auto-heavy.lock` so it never
overlaps another heavy job (not when the caller holds that lock already:
validation/heavy_lock.py). `--tiny` runs the 2-plan, 2-rank smoke case.

On a machine with CUDA the same command (no arguments) runs the GPU validation of
validation/cost_validation_gpu.py instead: the GPT 1.7B shape on this machine's GPUs over
NCCL, time and peak memory (allocated and reserved), written to the section
"Cost model on GPUs" of docs/benchmarks.md. `--device cpu` keeps the CPU validation.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import re
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path

from benchmarks.docs_sections import write_section
from megatron_auto.cost.estimate import estimate_plan
from megatron_auto.plan import Plan, save_plan
from megatron_auto.search import search_plan
from megatron_auto.search.uniform import UniformConfig, build_uniform_plan
from megatron_auto.specs.model import ModelSpec, uniform_model
from megatron_auto.specs.presets import CLUSTER_PRESETS
from megatron_auto.specs.profiles import measured_costs
from megatron_auto.specs.training import GIB, TrainingSpec
from validation import cost_validation_gpu as gpu
from validation.agreement import mape, spearman
from validation.heavy_lock import held_lock_fds, lock_prefix

ROOT = Path(__file__).resolve().parents[1]
HEADING = "## Cost model: predicted vs measured (4 CPU gloo ranks)"
ELAPSED = re.compile(r"elapsed time per iteration \(ms\): ([0-9.]+)")


@dataclass(frozen=True)
class Job:
    """The model and batch every plan trains (NullTokenizer ids below `vocab`)."""

    layers: int = 4
    hidden: int = 256
    heads: int = 8
    seq: int = 128
    vocab: int = 512
    global_batch: int = 16
    ranks: int = 4
    iters: int = 6
    extra_flags: tuple[str, ...] = ()
    """Further pretrain_gpt flags (precision, kernels) of every run."""

    def model(self) -> ModelSpec:
        # pretrain_gpt's NullTokenizer adds an end-of-document id (Megatron's rule).
        return uniform_model("pretrain_gpt", self.layers, self.hidden, self.heads, self.seq, self.vocab + 1)

    def flags(self) -> list[str]:
        return ["--num-layers", str(self.layers), "--hidden-size", str(self.hidden), "--num-attention-heads",
                str(self.heads), "--seq-length", str(self.seq), "--max-position-embeddings", str(self.seq),
                "--global-batch-size", str(self.global_batch), "--train-iters", str(self.iters), "--mock-data",
                "--tokenizer-type", "NullTokenizer", "--vocab-size", str(self.vocab), "--log-interval", "1",
                *self.extra_flags]


FULL_CONFIGS = {
    "dp4 mbs1": UniformConfig(tp=1, pp=1, micro_batch_size=1),
    "dp4 mbs4": UniformConfig(tp=1, pp=1, micro_batch_size=4),
    "dp4 mbs2 distopt": UniformConfig(tp=1, pp=1, micro_batch_size=2, distributed_optimizer=True),
    "dp4 mbs2 rc=full": UniformConfig(tp=1, pp=1, micro_batch_size=2, recompute="full"),
    "tp2 dp2 mbs2": UniformConfig(tp=2, pp=1, micro_batch_size=2),
    "tp2 dp2 mbs2 sp": UniformConfig(tp=2, pp=1, micro_batch_size=2, sequence_parallel=True),
    "tp2 dp2 mbs2 rc=sel": UniformConfig(tp=2, pp=1, micro_batch_size=2, recompute="selective"),
    "tp2 dp2 mbs2 sp rc=sel": UniformConfig(tp=2, pp=1, micro_batch_size=2, sequence_parallel=True,
                                            recompute="selective"),
    "tp2 dp2 mbs8 sp distopt": UniformConfig(tp=2, pp=1, micro_batch_size=8, sequence_parallel=True,
                                             distributed_optimizer=True),
    "tp4 mbs2": UniformConfig(tp=4, pp=1, micro_batch_size=2),
    "pp2 dp2 mbs2": UniformConfig(tp=1, pp=2, micro_batch_size=2),
    "pp4 mbs1": UniformConfig(tp=1, pp=4, micro_batch_size=1),
    "pp2 tp2 mbs2": UniformConfig(tp=2, pp=2, micro_batch_size=2),
    "pp2 v2 dp2 mbs2": UniformConfig(tp=1, pp=2, micro_batch_size=2, vp=2),
}
def mixed_hybrid_plan(job: "Job", micro_batches: int) -> Plan:
    """A per-layer plan stock Megatron cannot express: two tp2·dp2 layers, then two dp4 ZeRO-1 layers."""
    from megatron_auto.plan import Chunk, LayerStrategy
    from megatron_auto.search.hybrid import embedding_layout

    tp2 = LayerStrategy(tp=2, dp=job.ranks // 2)
    dp = LayerStrategy(tp=1, dp=job.ranks, zero=1)
    layers = (tp2,) * (job.layers // 2) + (dp,) * (job.layers - job.layers // 2)
    return Plan(space="hybrid", world_size=job.ranks, pipeline_parallel=1, global_batch_size=job.global_batch,
                num_micro_batches=micro_batches, chunks=(Chunk(layers),), embedding=embedding_layout([tp2, dp]),
                model=job.model())


TINY_CONFIGS = {"dp2 mbs1": UniformConfig(tp=1, pp=1, micro_batch_size=1)}  # + the planner's pick
TINY_JOB = Job(layers=2, hidden=64, heads=4, seq=32, vocab=128, global_batch=4, ranks=2, iters=4)


def cpu_cluster(job: Job, profiles: list[str]):
    """The cpu-gloo preset shaped to the job's ranks, with the profiles attached when given."""
    cluster = replace(CLUSTER_PRESETS["cpu-gloo"], gpus_per_node=job.ranks)
    return replace(cluster, measured=measured_costs(profiles)) if profiles else cluster


def run_plan(plan: Plan, job: Job, workdir: Path) -> tuple[float, float]:
    """Median step seconds and max-over-ranks peak tensor bytes of one real run."""
    plan_path, memory_dir = workdir / "plan.json", workdir / "memory"
    memory_dir.mkdir(exist_ok=True)
    for old in memory_dir.glob("rank*.json"):
        old.unlink()
    save_plan(plan, plan_path)
    env = {**__import__("os").environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(worker_command(job, plan_path, memory_dir), capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=900, pass_fds=held_lock_fds())
    steps = [float(x) / 1000 for x in ELAPSED.findall(done.stdout)]
    if done.returncode != 0 or len(steps) < job.iters:
        raise RuntimeError(f"run failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    ranks = [json.loads(p.read_text()) for p in sorted(memory_dir.glob("rank*.json"))]
    top = max(ranks, key=lambda r: r["peak_bytes"])
    sys.stderr.write(f"  peak on rank {top['rank']}: {top['baseline_bytes'] / 2**20:.1f} MiB before the step"
                     f" + {top['step_peak_bytes'] / 2**20:.1f} MiB in it\n")
    return statistics.median(steps[1:-1]), float(top["peak_bytes"])


def worker_command(job: Job, plan_path: Path, memory_dir: Path) -> list[str]:
    """torchrun of validation/validation_worker.py: `plan_path` on `job.ranks` ranks, peaks into `memory_dir`
    (run as a module: the caller's working directory is the repository root, ROOT or a run's own)."""
    return [*lock_prefix(), sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(job.ranks),
            "--master_port", "29533", "-m", "validation.validation_worker", "--memory-out",
            str(memory_dir), *job.flags(), "--auto-parallel-plan", str(plan_path)]


@dataclass(frozen=True)
class Row:
    """One plan: its predictions and its measurements."""

    name: str
    analytic_s: float
    profiled_s: float
    measured_s: float
    predicted_bytes: float
    measured_bytes: float
    measured_samples_s: list[float] = field(default_factory=list)
    """Every round's median step seconds (`measured_s` is their median)."""
    plan_digest: str = ""
    """plan_digest(plan) of the plan measured (matches --reuse rows to today's plans)."""


PICK = " (planner pick)"


def plan_digest(plan: Plan) -> str:
    """A short fingerprint of what a run executes: layout, micro-batches, chunks, schedule."""
    key = repr((plan.pipeline_parallel, plan.num_micro_batches, plan.virtual_stages, plan.schedule,
                plan.chunks, plan.embedding))
    return hashlib.sha256(key.encode()).hexdigest()[:12]


def reusable_measurements(stored: list[dict], plans: dict[str, Plan]) -> dict[str, tuple[float, float, list[float]]]:
    """The stored measurements of today's plans, by name less the pick mark. A plan that is
    no fixed configuration (today's pick, named "planner pick") is matched only by its digest:
    an older file's "planner pick" may be another plan. Unmatched plans are left out (stderr)."""
    by_base = {r["name"].removesuffix(PICK): r for r in stored}
    by_digest = {r["plan_digest"]: r for r in stored if r.get("plan_digest")}
    reuse = {}
    for name, plan in plans.items():
        row = by_digest.get(plan_digest(plan)) if name == "planner pick" else by_base.get(name.removesuffix(PICK))
        if row is None:
            sys.stderr.write(f"{name}: not measured in the --reuse file, left out\n")
            continue
        reuse[name] = (row["measured_s"], row["measured_bytes"], row.get("measured_samples_s", [row["measured_s"]]))
    return reuse


def build_plans(job: Job, configs: dict[str, UniformConfig], cluster, training,
                hybrid: bool = False) -> dict[str, Plan]:
    """The named plans, plus the planner's pick (searched under `cluster`) unless it is one of them."""
    model = job.model()
    plans = {name: build_uniform_plan(model, cluster, training, config) for name, config in configs.items()}
    if hybrid:
        plans["hybrid tp2·dp2 ×2 + dp4 z1 ×2, m=4"] = mixed_hybrid_plan(job, 4)
    pick = search_plan(model, cluster, training, space="megatron").plan
    for name, plan in plans.items():
        if plan.chunks == pick.chunks and plan.num_micro_batches == pick.num_micro_batches \
                and plan.virtual_stages == pick.virtual_stages and plan.embedding == pick.embedding:
            return plans | {f"{name} (planner pick)": plans.pop(name)}
    return plans | {"planner pick": pick}


def measure_rounds(job: Job, plans: dict[str, Plan], rounds: int) -> dict[str, tuple[float, float, list[float]]]:
    """Run every plan `rounds` times, the order reversed every other round (against drift in the
    machine's other load); per plan the median step seconds, the largest peak bytes and the samples."""
    samples: dict[str, list[float]] = {name: [] for name in plans}
    peaks: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for round_index in range(rounds):
            for name in (list(plans) if round_index % 2 == 0 else list(reversed(plans))):
                seconds, peak = run_plan(plans[name], job, Path(tmp))
                samples[name].append(seconds)
                peaks[name] = max(peaks.get(name, 0.0), peak)
                sys.stderr.write(f"round {round_index + 1}: {name:28s} {seconds * 1e3:8.1f} ms\n")
    return {name: (statistics.median(samples[name]), peaks[name], samples[name]) for name in plans}


def measure_all(job: Job, plans: dict[str, Plan], analytic, profiled, training,
                reuse: dict[str, tuple[float, float, list[float]]] | None = None, rounds: int = 1) -> list[Row]:
    """Measure every plan (or take its measurement from `reuse`); predictions under both cost models."""
    measured = reuse if reuse is not None else measure_rounds(job, plans, rounds)
    rows = []
    for name, plan in plans.items():
        seconds, peak, samples = measured[name]
        a = estimate_plan(plan, job.model(), analytic, training)
        p = estimate_plan(plan, job.model(), profiled, training)
        predicted = p.peak_memory_gib * GIB - profiled.framework_overhead_bytes
        rows.append(Row(name, a.iteration_time_s, p.iteration_time_s, seconds, predicted, peak, list(samples),
                        plan_digest(plan)))
        sys.stderr.write(f"{name:28s} measured {seconds * 1e3:8.1f} ms  analytic {a.iteration_time_s * 1e3:8.1f}"
                         f"  profiled {p.iteration_time_s * 1e3:8.1f}  memory {peak / 2**20:.1f} MiB"
                         f" (predicted {predicted / 2**20:.1f})\n")
    return rows


def summary(rows: list[Row]) -> dict[str, float | bool | str]:
    """MAPE and Spearman of both models, the memory error, and the planner pick's standing."""
    measured = [r.measured_s for r in rows]
    fastest = min(rows, key=lambda r: r.measured_s)
    pick = next((r for r in rows if "planner pick" in r.name), None)
    return {
        "analytic_mape_pct": mape([r.analytic_s for r in rows], measured),
        "profiled_mape_pct": mape([r.profiled_s for r in rows], measured),
        "analytic_spearman": spearman([r.analytic_s for r in rows], measured),
        "profiled_spearman": spearman([r.profiled_s for r in rows], measured),
        "memory_mape_pct": mape([r.predicted_bytes for r in rows], [r.measured_bytes for r in rows]),
        "memory_max_error_pct": 100 * max(abs(r.predicted_bytes / r.measured_bytes - 1) for r in rows),
        "fastest_measured": fastest.name,
        "pick_vs_fastest_pct": None if pick is None else 100 * (pick.measured_s / fastest.measured_s - 1),
    }


def table(rows: list[Row], stats: dict) -> str:
    """Markdown table of the rows and a line of summary statistics."""
    lines = ["| plan | measured ms | analytic ms | error | profiled ms | error | measured MiB | predicted MiB | error |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r.name} | {r.measured_s * 1e3:.1f} | {r.analytic_s * 1e3:.1f} | "
                     f"{100 * (r.analytic_s / r.measured_s - 1):+.1f}% | {r.profiled_s * 1e3:.1f} | "
                     f"{100 * (r.profiled_s / r.measured_s - 1):+.1f}% | {r.measured_bytes / 2**20:.1f} | "
                     f"{r.predicted_bytes / 2**20:.1f} | {100 * (r.predicted_bytes / r.measured_bytes - 1):+.1f}% |")
    lines.append("")
    lines.append(f"Step time: profiled MAPE {stats['profiled_mape_pct']:.1f}% (target <= 15%), Spearman "
                 f"{stats['profiled_spearman']:.2f} (target >= 0.8); analytic MAPE {stats['analytic_mape_pct']:.1f}%, "
                 f"Spearman {stats['analytic_spearman']:.2f}. Planner pick vs fastest measured "
                 f"({stats['fastest_measured']}): {_percent(stats['pick_vs_fastest_pct'])} (target <= 10%). "
                 f"Peak memory: MAPE {stats['memory_mape_pct']:.1f}%, worst {stats['memory_max_error_pct']:.1f}% "
                 f"(target <= 10%).")
    return "\n".join(lines) + "\n"


def _percent(value: float | None) -> str:
    return "not measured" if value is None else f"{value:+.1f}%"


def scatter_png(rows: list[Row], path: Path) -> None:
    """Predicted (analytic and profiled) against measured step time, log-log, with y = x."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 5))
    measured = [r.measured_s * 1e3 for r in rows]
    ax.scatter(measured, [r.analytic_s * 1e3 for r in rows], marker="x", label="analytic (cpu-gloo preset)")
    ax.scatter(measured, [r.profiled_s * 1e3 for r in rows], marker="o", label="profiled (--profile)")
    for r, m in zip(rows, measured):
        ax.annotate(r.name, (m, r.profiled_s * 1e3), fontsize=6, xytext=(3, 3), textcoords="offset points")
    low = min(measured + [r.profiled_s * 1e3 for r in rows] + [r.analytic_s * 1e3 for r in rows]) * 0.8
    high = max(measured + [r.profiled_s * 1e3 for r in rows] + [r.analytic_s * 1e3 for r in rows]) * 1.25
    ax.plot([low, high], [low, high], "k--", lw=0.8, label="y = x")
    ax.fill_between([low, high], [low * 0.85, high * 0.85], [low * 1.15, high * 1.15], alpha=0.1, label="±15%")
    ax.set(xscale="log", yscale="log", xlabel="measured step time (ms)", ylabel="predicted step time (ms)",
           title="Cost model vs 4 gloo ranks on CPU")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", nargs="*", default=[], help="cluster and model profile JSON files")
    parser.add_argument("--tiny", action="store_true", help="2 plans, 2 ranks, few steps (the smoke test)")
    parser.add_argument("--out-dir", default=str(ROOT / "docs"), help="where the table and PNG go")
    parser.add_argument("--results", help="also write the rows and statistics as JSON here")
    parser.add_argument("--benchmarks", help="replace the validation section of this markdown file")
    parser.add_argument("--reuse", help="take the measurements from this earlier --results file and "
                                         "only recompute the predictions (no launches)")
    parser.add_argument("--no-hybrid", dest="hybrid", action="store_false",
                        help="leave out the per-layer (hybrid runtime) plan")
    parser.add_argument("--plans", nargs="*", help="only the fixed plans whose names contain one of these")
    parser.add_argument("--rounds", type=int, default=1, help="runs of every plan (median; the order "
                                                                 "reversed every other round)")
    parser.add_argument("--notes", help="markdown file whose text goes under the table in the --benchmarks "
                                        "section (the job, the profile commands, the reading of the numbers)")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                        help="cuda: the GPU validation (validation/cost_validation_gpu.py); auto: cuda when available")
    parser.add_argument("--gpus", type=int, help="with cuda: GPUs to use (default: all)")
    parser.add_argument("--measured-log", nargs="*", help="GPU validation without a GPU: take the measurements "
                        "from these logs of earlier GPU runs (their per-run lines) and recompute the predictions")
    parser.add_argument("--cluster", help="with --measured-log: the cluster preset the runs had "
                                          "(default: detected from this machine's GPU)")
    return parser.parse_args(argv)


def use_cuda(device: str) -> bool:
    if device != "auto":
        return device == "cuda"
    import torch

    return torch.cuda.is_available()


GPU_JOB = Job(layers=24, hidden=2304, heads=24, seq=2048, vocab=51200, global_batch=16, ranks=1, iters=10,
              extra_flags=("--bf16",))
"""The GPT 1.7B shape of data/reference/h100/runs_gpt_1.7b.json."""


def gpu_measurements(args: argparse.Namespace, job: Job, plans: dict[str, Plan]) -> dict:
    """Each plan's GpuMeasurement: run on this machine's GPUs, or read from `--measured-log` files
    (then only the plans those logs measured are kept)."""
    if not args.measured_log:
        return gpu.measure_cuda(job, plans, lambda plan_path, memory_dir: worker_command(job, plan_path, memory_dir))
    logged = {}
    for path in args.measured_log:
        logged.update(gpu.measured_from_log(Path(path).read_text()))
    return {name: logged[name] for name in plans if name in logged}


def main_cuda(args: argparse.Namespace) -> int:
    """The GPU validation: every configuration of gpu_configs on this machine, table into docs."""
    import torch

    from megatron_auto.runtime.planning import detect_cluster_name, job_cluster

    world = args.gpus or (1 if args.measured_log else torch.cuda.device_count())
    job = replace(GPU_JOB, ranks=world, extra_flags=(*GPU_JOB.extra_flags, *gpu.kernel_flags()))
    cluster, training = job_cluster(world, args.cluster or detect_cluster_name()), gpu.gpu_training(job.global_batch)
    configs = gpu.gpu_configs(world, job.layers, job.heads, job.global_batch)
    if args.plans:
        configs = {name: c for name, c in configs.items() if any(key in name for key in args.plans)}
    plans = build_plans(job, configs, cluster, training)
    measured = gpu_measurements(args, job, plans)
    rows = [gpu.gpu_row(name, plan, job.model(), cluster, training, measured[name])
            for name, plan in plans.items() if name in measured]
    text = gpu.gpu_table(rows)
    if args.results:
        Path(args.results).write_text(json.dumps([{**r.__dict__, "measured": r.measured.__dict__} for r in rows],
                                                 indent=2))
    heading = f"## Cost model on GPUs: predicted vs measured ({world} x {cluster.name})"
    command = "`python3 -m validation.validate_cost_model" + (f" --gpus {args.gpus}" if args.gpus else "") + "`"
    if args.measured_log:
        command += (" (the runs' lines are kept in " + ", ".join(f"`{p}`" for p in args.measured_log) +
                    "; `python3 -m validation.validate_cost_model --measured-log` recomputes the predictions "
                    "without a GPU)")
    body = (f"Command: {command} on the GPU machine (GPT 1.7B shape, global batch 16, bf16, {job.iters} "
            f"iterations per run; validation/cost_validation_gpu.py says what is compared). Cluster preset "
            f"`{cluster.name}`.\n\n{text}")
    target = Path(args.benchmarks or ROOT / "docs" / "benchmarks.md")
    write_section(target, heading, f"{heading}\n\n{body.rstrip()}\n\n")
    sys.stdout.write(text)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.measured_log is not None or use_cuda(args.device):
        return main_cuda(args)
    job, configs = (TINY_JOB, TINY_CONFIGS) if args.tiny else (Job(), FULL_CONFIGS)
    if args.plans:
        configs = {name: c for name, c in configs.items() if any(key in name for key in args.plans)}
    training = TrainingSpec.fp32(job.global_batch)
    analytic, profiled = cpu_cluster(job, []), cpu_cluster(job, args.profile)
    plans = build_plans(job, configs, profiled, training, hybrid=not args.tiny and args.hybrid)
    reuse = None
    if args.reuse:
        reuse = reusable_measurements(json.loads(Path(args.reuse).read_text())["rows"], plans)
        plans = {name: plan for name, plan in plans.items() if name in reuse}
    rows = measure_all(job, plans, analytic, profiled, training, reuse, args.rounds)
    stats = summary(rows)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    text = table(rows, stats)
    (out / "cost_model_validation.md").write_text("# Cost model: predicted vs measured\n\n" + text)
    scatter_png(rows, out / "cost_model_validation.png")
    if args.results:
        Path(args.results).write_text(json.dumps({"rows": [r.__dict__ for r in rows], "summary": stats}, indent=2))
    if args.benchmarks:
        command = "`flock /tmp/megatron-auto-heavy.lock .venv/bin/python -m validation.validate_cost_model " + " ".join(
            ["--profile", *args.profile] if args.profile else []) + "".join(
            f" --{flag} {getattr(args, flag)}" for flag in ("rounds", "results", "notes") if getattr(args, flag)) \
            + f" --benchmarks {args.benchmarks}`"
        notes = Path(args.notes).read_text().strip() + "\n" if args.notes else ""
        body = (f"Command: {command} (`--reuse RESULTS` recomputes the predictions from the stored "
                f"measurements). Plot: `docs/cost_model_validation.png`.\n\n{text}\n{notes}")
        write_section(Path(args.benchmarks), HEADING, f"{HEADING}\n\n{body.rstrip()}\n\n")
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
