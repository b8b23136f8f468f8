"""validation/validate_cost_model.py on CUDA: the GPT 1.7B shape on this machine's GPUs, predicted vs measured.

One command on a GPU machine (NCCL, one rank per GPU, the cluster preset detected
from the GPU's name) re-validates the cost model and rewrites its docs section:

    python3 -m validation.validate_cost_model       # CUDA found: this module; --gpus N to use fewer

Configurations (`gpu_configs`): on one GPU, micro-batch 1/2/4/8 x recompute
none/selective/full (the grid of data/reference/h100/runs_gpt_1.7b.json); on N GPUs,
every TP x PP layout with TP x PP dividing N (DP the rest, sequence parallel with TP,
the distributed optimizer with DP), plus the planner's pick. Each runs
tools/pretrain_gpt.py (through validation/validation_worker.py) for `GPU_JOB.iters`
iterations in bf16 with mock data; time is the median `elapsed time per iteration`
after the first and before the last, memory is torch.cuda.max_memory_allocated and
max_memory_reserved over the run (max over ranks) plus what the process holds outside
torch's allocator (runtime.memory_check.MeasuredPeak). A run that runs out of memory
is a row too: the prediction said it fits or not.

Compared: the cost model's iteration time; its allocated peak (Prediction.peak_memory_gib)
against the peak allocated; its device memory (Prediction.device_memory_gib: the allocator's
reserve, the CUDA context, workspaces and NCCL included) against the device memory used
(peak reserved + outside torch).
"""
from __future__ import annotations

import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from megatron_auto.cost.estimate import estimate_plan
from megatron_auto.kernel_choice import resolve_attention_backend, resolve_optimizer_impl
from megatron_auto.plan import Plan, save_plan
from megatron_auto.search.uniform import UniformConfig
from megatron_auto.specs.cluster import ClusterSpec
from megatron_auto.specs.training import GIB, TrainingSpec
from validation.agreement import spearman

ROOT = Path(__file__).resolve().parents[1]
RECOMPUTE = ("none", "selective", "full")


def kernel_flags() -> list[str]:
    """`--attention-backend auto --optimizer-impl auto`, pretrain_gpt.py's kernel flags (megatron_auto.train):
    the runtime then runs what the cost model prices (flash + fused on GPUs)."""
    return ["--attention-backend", "auto", "--optimizer-impl", "auto"]


def gpu_training(global_batch: int) -> TrainingSpec:
    """bf16 mixed precision with the kernels the runtime resolves `auto` to on GPUs."""
    attention = resolve_attention_backend("auto", on_gpu=True)
    optimizer = resolve_optimizer_impl("auto", on_gpu=True)
    return TrainingSpec(global_batch_size=global_batch, precision="bf16", attention_backend=attention,
                        optimizer_impl=optimizer)


def _layout_name(tp: int, pp: int, dp: int, config: UniformConfig) -> str:
    parts = [f"tp{tp}" if tp > 1 else "", f"pp{pp}" if pp > 1 else "", f"dp{dp}" if dp > 1 else "",
             f"mbs{config.micro_batch_size}", "sp" if config.sequence_parallel else "",
             "distopt" if config.distributed_optimizer else ""]
    return " ".join(p for p in parts if p)


def gpu_configs(world: int, layers: int, heads: int, global_batch: int) -> dict[str, UniformConfig]:
    """The configurations measured on `world` GPUs (see the module docstring)."""
    if world == 1:
        return {f"mbs{m} rc={r}": UniformConfig(tp=1, pp=1, micro_batch_size=m, recompute=r)
                for r in RECOMPUTE for m in (1, 2, 4, 8)}
    configs = {}
    for tp in (t for t in (1, 2, 4, 8) if world % t == 0 and heads % t == 0):
        for pp in (p for p in (1, 2, 4, 8) if (world // tp) % p == 0 and layers % p == 0):
            dp = world // (tp * pp)
            micro = 2 if global_batch % (2 * dp) == 0 else 1
            if global_batch % (micro * dp):
                continue
            config = UniformConfig(tp=tp, pp=pp, micro_batch_size=micro, sequence_parallel=tp > 1,
                                   distributed_optimizer=dp > 1)
            configs[_layout_name(tp, pp, dp, config)] = config
    return configs


@dataclass(frozen=True)
class GpuMeasurement:
    """What one run measured (seconds is None when it did not finish)."""

    seconds: Optional[float]
    allocated_bytes: float = 0.0
    reserved_bytes: float = 0.0
    device_bytes: float = 0.0
    """Peak reserved plus the process's device memory outside torch (max over ranks)."""
    out_of_memory: bool = False
    samples: list = field(default_factory=list)


@dataclass(frozen=True)
class GpuRow:
    """One configuration: the cost model's numbers and the run's."""

    name: str
    predicted_s: float
    predicted_peak_bytes: float
    """Device memory at the peak: reserved by the allocator plus what lives outside it."""
    predicted_tensor_bytes: float
    """The allocated peak: what live tensors hold (torch.cuda.max_memory_allocated's counterpart)."""
    predicted_fits: bool
    measured: GpuMeasurement

    @property
    def time_error(self) -> Optional[float]:
        return None if self.measured.seconds is None else self.predicted_s / self.measured.seconds - 1

    @property
    def allocated_error(self) -> Optional[float]:
        m = self.measured
        return None if m.out_of_memory or not m.allocated_bytes else self.predicted_tensor_bytes / m.allocated_bytes - 1

    @property
    def device_error(self) -> Optional[float]:
        m = self.measured
        return None if m.out_of_memory or not m.device_bytes else self.predicted_peak_bytes / m.device_bytes - 1

    @property
    def fit_agrees(self) -> bool:
        return self.predicted_fits != self.measured.out_of_memory


def gpu_row(name: str, plan: Plan, model, cluster: ClusterSpec, training: TrainingSpec,
            measured: GpuMeasurement) -> GpuRow:
    """The cost model's prediction for `plan` beside its measurement."""
    prediction = estimate_plan(plan, model, cluster, training)
    return GpuRow(name, prediction.iteration_time_s, prediction.device_memory_gib * GIB,
                  prediction.peak_memory_gib * GIB, prediction.fits, measured)


def measurement_from_ranks(ranks: list[dict], steps_s: list[float], out_of_memory: bool) -> GpuMeasurement:
    """The run's figures: median step after the first and before the last; memory max over ranks."""
    finished = not out_of_memory and len(steps_s) >= 3
    return GpuMeasurement(
        seconds=statistics.median(steps_s[1:-1]) if finished else None,
        allocated_bytes=max((r["peak_bytes"] for r in ranks), default=0.0),
        reserved_bytes=max((r.get("reserved_bytes", 0.0) for r in ranks), default=0.0),
        device_bytes=max((r.get("device_bytes", 0.0) for r in ranks), default=0.0),
        out_of_memory=out_of_memory, samples=list(steps_s))


def run_plan_cuda(plan: Plan, job, workdir: Path, command_for) -> GpuMeasurement:
    """One run of `plan` on the GPUs; an out-of-memory exit is a measurement, another failure raises."""
    plan_path, memory_dir = workdir / "plan.json", workdir / "memory"
    memory_dir.mkdir(exist_ok=True)
    for old in memory_dir.glob("rank*.json"):
        old.unlink()
    save_plan(plan, plan_path)
    # In `workdir`: a run that runs out of memory writes its re-plan (runtime/fit.py) to the working directory;
    # the repository root on PYTHONPATH finds the worker module (python -m validation.validation_worker) there.
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    done = subprocess.run(command_for(plan_path, memory_dir), capture_output=True, text=True, cwd=workdir,
                          env=env, timeout=1800)
    steps = [float(x) / 1000 for x in re.findall(r"elapsed time per iteration \(ms\): ([0-9.]+)", done.stdout)]
    out_of_memory = "out of memory" in (done.stdout + done.stderr).lower() and done.returncode != 0
    if done.returncode != 0 and not out_of_memory:
        raise RuntimeError(f"run failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    ranks = [json.loads(p.read_text()) for p in sorted(memory_dir.glob("rank*.json"))]
    return measurement_from_ranks(ranks, steps, out_of_memory)


def measured_line(name: str, m: GpuMeasurement) -> str:
    """The log line of one run, which measured_from_log reads back."""
    if m.out_of_memory:
        return f"{name:32s} out of memory"
    return (f"{name:32s} {m.seconds * 1e3:8.1f} ms  {m.allocated_bytes / GIB:6.2f} GiB allocated  "
            f"{m.reserved_bytes / GIB:6.2f} GiB reserved  {m.device_bytes / GIB:6.2f} GiB device")


_LINE = re.compile(r"^(?P<name>\S.*?)\s+(?:(?P<oom>out of memory)|(?P<ms>[0-9.]+) ms\s+(?P<alloc>[0-9.]+) GiB allocated"
                   r"\s+(?P<reserved>[0-9.]+) GiB reserved(?:\s+(?P<device>[0-9.]+) GiB device)?)\s*$")


def measured_from_log(text: str) -> dict[str, GpuMeasurement]:
    """The measurements of a GPU validation's log (its measured_line lines; other lines are skipped).
    Logs written before the device column have device memory 0: not compared."""
    measured = {}
    for line in text.splitlines():
        match = _LINE.match(line)
        if not match:
            continue
        if match["oom"]:
            measured[match["name"]] = GpuMeasurement(seconds=None, out_of_memory=True)
            continue
        measured[match["name"]] = GpuMeasurement(
            seconds=float(match["ms"]) / 1e3, allocated_bytes=float(match["alloc"]) * GIB,
            reserved_bytes=float(match["reserved"]) * GIB, device_bytes=float(match["device"] or 0) * GIB)
    return measured


def measure_cuda(job, plans: dict[str, Plan], command_for) -> dict[str, GpuMeasurement]:
    measured = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, plan in plans.items():
            measured[name] = run_plan_cuda(plan, job, Path(tmp), command_for)
            sys.stderr.write(measured_line(name, measured[name]) + "\n")
            sys.stderr.flush()
    return measured


def _pct(value: Optional[float]) -> str:
    return "–" if value is None else f"{100 * value:+.1f}%"


def _gib(value: float) -> str:
    return f"{value / GIB:.2f}"


def gpu_table(rows: list[GpuRow]) -> str:
    """Markdown table of the rows and a summary line."""
    lines = ["| plan | measured ms | predicted ms | error | allocated GiB | predicted tensors GiB | error | "
             "reserved GiB | device GiB | predicted peak GiB | error | predicted fits | ran |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        m = r.measured
        measured_ms = "–" if m.seconds is None else f"{m.seconds * 1e3:.0f}"
        ran = "out of memory" if m.out_of_memory else "yes"
        lines.append(f"| {r.name} | {measured_ms} | {r.predicted_s * 1e3:.0f} | {_pct(r.time_error)} | "
                     f"{_gib(m.allocated_bytes)} | {_gib(r.predicted_tensor_bytes)} | {_pct(r.allocated_error)} | "
                     f"{_gib(m.reserved_bytes)} | {_gib(m.device_bytes) if m.device_bytes else '–'} | "
                     f"{_gib(r.predicted_peak_bytes)} | "
                     f"{_pct(r.device_error)} | {'yes' if r.predicted_fits else 'no'} | {ran} |")
    return "\n".join(lines) + "\n\n" + gpu_summary_line(rows) + "\n"


def gpu_summary_line(rows: list[GpuRow]) -> str:
    """Time MAPE and Spearman over the runs that finished, memory MAPEs, and fit agreement."""
    finished = [r for r in rows if r.time_error is not None]
    timed = [abs(r.time_error) for r in finished]
    allocated = [abs(r.allocated_error) for r in rows if r.allocated_error is not None]
    device = [abs(r.device_error) for r in rows if r.device_error is not None]
    rank = spearman([r.predicted_s for r in finished], [r.measured.seconds for r in finished]) \
        if len(finished) > 1 else math.nan
    def mape(errors: list[float]) -> str:
        return f"MAPE {100 * statistics.mean(errors):.1f}%" if errors else "not measured"

    return (f"Step time: {mape(timed)} over {len(finished)} runs, Spearman {rank:.2f}. Peak memory: "
            f"tensors vs allocated {mape(allocated)}, peak vs device memory {mape(device)}. "
            f"Fits / out of memory predicted right for {sum(r.fit_agrees for r in rows)} of {len(rows)}.")
