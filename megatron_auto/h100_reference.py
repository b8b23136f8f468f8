"""The H100 measurements (data/reference/h100/) against the cost model: GEMMs, layers, whole runs.

Used by validation/calibrate_compute.py --gemms (the fit of the H100 GEMM law), by
validation/check_h100_reference.py (the figures in docs/benchmarks.md) and by
tests/test_h100_reference.py (the same figures as regression tests).
Every run and profile was taken with unfused attention and torch's foreach Adam in bf16
on one H100 (data/reference/h100/README.md), so they are priced that way.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from .cost.compute import gemm_time
from .cost.flops import Gemm
from .specs.cluster import ClusterSpec, ComputeEfficiency
from .specs.model import LayerSpec, ModelSpec
from .specs.presets import CLUSTER_PRESETS, MODEL_PRESETS
from .specs.training import TrainingSpec

DATA = Path(__file__).resolve().parents[1] / "data" / "reference" / "h100"
PROFILES = ("profile_gpt_1.7b_bf16.json", "profile_gpt3_7.5b_bf16.json")


def h100_cluster() -> ClusterSpec:
    """dgx-h100-80gb on one GPU, as the measurements ran."""
    return replace(CLUSTER_PRESETS["dgx-h100-80gb"], num_nodes=1, gpus_per_node=1)


def measured_training(global_batch_size: int = 16) -> TrainingSpec:
    """bf16 with the kernels the measurements ran: unfused attention, foreach Adam."""
    return TrainingSpec(global_batch_size=global_batch_size, attention_backend="unfused", optimizer_impl="foreach")


def load_gemms(path: Path = DATA / "gemm_bf16.jsonl") -> tuple[np.ndarray, np.ndarray]:
    """(shapes [N, 3] as m, k, n; seconds [N]) of the GEMM benchmark."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return np.array([[r["m"], r["k"], r["n"]] for r in rows], dtype=float), np.array([r["s"] for r in rows])


def gemm_errors(compute: ComputeEfficiency, cluster: ClusterSpec | None = None) -> np.ndarray:
    """Relative error (predicted / measured - 1) of each benchmarked GEMM under `compute`."""
    cluster = replace(cluster or h100_cluster(), compute=compute)
    shapes, seconds = load_gemms()
    predicted = np.array([gemm_time(Gemm(int(m), int(k), int(n)), cluster) for m, k, n in shapes])
    return predicted / seconds - 1


def fit_gemm_law(peak_flops: float, half_dims=np.arange(0.0, 400.0, 4.0),
                 latencies=np.arange(10e-6, 30e-6, 0.5e-6)) -> tuple[ComputeEfficiency, float]:
    """The (half_dim, latency_s) grid point, with max_fraction by least squares in relative error
    over the GEMMs above the floor, of least mean |error|; and that error."""
    shapes, seconds = load_gemms()
    flops = 2.0 * shapes.prod(axis=1)
    best = None
    for half_dim in half_dims:
        ideal = flops / (peak_flops * np.prod(shapes / (shapes + half_dim), axis=1))  # time at max_fraction 1
        for latency in latencies:
            above = ideal > latency * 0.7  # least squares over the compute-bound GEMMs
            ratio = ideal[above] / seconds[above]
            inverse_fraction = ratio.sum() / (ratio**2).sum()  # min sum (c * ideal / t - 1)^2
            predicted = np.maximum(latency, ideal * inverse_fraction)
            error = float(np.mean(np.abs(predicted / seconds - 1)))
            if best is None or error < best[0]:
                best = (error, ComputeEfficiency(max_fraction=round(float(1.0 / inverse_fraction), 4),
                                                 half_dim=float(half_dim), latency_s=round(float(latency), 7)))
    return best[1], best[0]


@dataclass(frozen=True)
class LayerPoint:
    """One measured (tp, micro-batch) point of a layer profile and its prediction, seconds."""

    profile: str
    tp: int
    micro_batch: int
    measured_s: float
    predicted_s: float
    measured_core_s: float
    predicted_core_s: float

    @property
    def error(self) -> float:
        return self.predicted_s / self.measured_s - 1


def layer_points(name: str, cluster: ClusterSpec | None = None) -> list[LayerPoint]:
    """Forward + backward of every point of profile `name`, measured and predicted."""
    from .cost.models import ANALYTIC_COMPUTE

    cluster = cluster or h100_cluster()
    data = json.loads((DATA / name).read_text())
    points = []
    for entry in data["layers"]:
        layer = LayerSpec(**entry["layer"])
        for t in entry["timings"]:
            times = ANALYTIC_COMPUTE.layer_times(layer, t["seq_length"], t["micro_batch"], t["tp"], False,
                                                 cluster, 2, "unfused")
            points.append(LayerPoint(name, t["tp"], t["micro_batch"], t["forward_s"] + t["backward_s"],
                                     times.forward_s + times.backward_s, t["attention_core_forward_s"],
                                     times.attention_core_forward_s))
    return points


@dataclass(frozen=True)
class RunPoint:
    """One end-to-end run of runs_gpt_1.7b.json and what `megatron-auto estimate` says of it."""

    name: str
    micro_batch: int
    recompute: str
    measured_s: float | None
    """Seconds per iteration; None where the run ran out of memory."""
    predicted_s: float
    measured_allocated_gib: float
    predicted_peak_gib: float
    out_of_memory: bool
    predicted_fits: bool

    @property
    def error(self) -> float | None:
        return None if self.measured_s is None else self.predicted_s / self.measured_s - 1


def gpt_1_7b() -> ModelSpec:
    """The runs' shape (24 layers, hidden 2304, 24 heads, seq 2048, vocab 51200): preset gpt3-1.7b."""
    return MODEL_PRESETS["gpt3-1.7b"]


def run_points(cluster: ClusterSpec | None = None) -> list[RunPoint]:
    """The six runs estimated as `megatron-auto estimate --tp 1 --pp 1` would price them."""
    from .search.uniform import UniformConfig, best_uniform_plan

    cluster = cluster or h100_cluster()
    runs = json.loads((DATA / "runs_gpt_1.7b.json").read_text())["runs"]
    points = []
    for name, run in runs.items():
        config = UniformConfig(tp=1, pp=1, micro_batch_size=run["micro_batch_size"], recompute=run["recompute"])
        plan = best_uniform_plan(gpt_1_7b(), cluster, measured_training(16), config,
                                 choose_micro_batch=False, choose_virtual_stages=False)
        prediction = plan.prediction
        points.append(RunPoint(name, run["micro_batch_size"], run["recompute"], run["iteration_s"],
                               prediction.iteration_time_s, run["max_allocated_gib"], prediction.peak_memory_gib,
                               run["out_of_memory"], prediction.fits))
    return points


TORCH_REFERENCE_S = {2: 0.883, 4: 0.786}
"""Seconds per iteration of scripts/torch_reference.py (plain PyTorch, GPT 1.7B shape, global batch 16,
SDPA flash attention, fused AdamW, bf16, eager) by micro-batch size: data/reference/h100/README.md."""


def flash_reference_errors(cluster: ClusterSpec | None = None) -> dict[int, tuple[float, float]]:
    """{micro-batch: (measured, predicted)} for the flash + fused reference runs (not Megatron runs:
    a check of the flash attention and fused Adam pricing, which no Megatron measurement ran)."""
    from .search.uniform import UniformConfig, best_uniform_plan

    cluster = cluster or h100_cluster()
    training = TrainingSpec(global_batch_size=16, attention_backend="flash", optimizer_impl="fused")
    result = {}
    for micro_batch, measured in TORCH_REFERENCE_S.items():
        config = UniformConfig(tp=1, pp=1, micro_batch_size=micro_batch, recompute="none")
        plan = best_uniform_plan(gpt_1_7b(), cluster, training, config, choose_micro_batch=False,
                                 choose_virtual_stages=False)
        result[micro_batch] = (measured, plan.prediction.iteration_time_s)
    return result


def mape(errors) -> float:
    """Mean absolute relative error."""
    values = [abs(e) for e in errors if e is not None]
    return float(np.mean(values))


__all__ = ["fit_gemm_law", "gemm_errors", "layer_points", "run_points", "mape", "h100_cluster"]
