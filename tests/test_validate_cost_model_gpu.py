"""validation/validate_cost_model.py's CUDA path (validation/cost_validation_gpu.py), on CPU with fake
measurements."""
from __future__ import annotations

import re

import pytest

from megatron_auto.cost.estimate import estimate_plan
from megatron_auto.runtime.planning import job_cluster
from megatron_auto.search.uniform import build_uniform_plan
from megatron_auto.specs.training import GIB
from validation import cost_validation_gpu as gpu
from validation import validate_cost_model as validate


def test_one_gpu_grid_is_the_reference_grid():
    configs = gpu.gpu_configs(1, 24, 24, 16)
    assert {(c.micro_batch_size, c.recompute) for c in configs.values()} == {
        (m, r) for m in (1, 2, 4, 8) for r in ("none", "selective", "full")}


@pytest.mark.parametrize("world", [2, 4, 8])
def test_every_multi_gpu_layout_is_a_valid_plan(world):
    job = validate.GPU_JOB
    cluster, training = job_cluster(world, "dgx-h100-80gb"), gpu.gpu_training(job.global_batch)
    configs = gpu.gpu_configs(world, job.layers, job.heads, job.global_batch)
    layouts = {(c.tp, c.pp) for c in configs.values()}
    assert layouts == {(t, p) for t in (1, 2, 4, 8) for p in (1, 2, 4, 8) if t * p <= world and world % (t * p) == 0}
    for config in configs.values():
        plan = build_uniform_plan(job.model(), cluster, training, config)
        assert plan.world_size == world and plan.global_batch_size == 16


def _fake_measurement(prediction_row: gpu.GpuRow, out_of_memory: bool = False) -> gpu.GpuMeasurement:
    # The run took 25% longer, held 10% more tensors and 20% more device memory than predicted.
    return gpu.GpuMeasurement(
        seconds=None if out_of_memory else prediction_row.predicted_s * 1.25,
        allocated_bytes=prediction_row.predicted_tensor_bytes * 1.1,
        reserved_bytes=prediction_row.predicted_tensor_bytes * 1.15,
        device_bytes=prediction_row.predicted_peak_bytes * 1.2, out_of_memory=out_of_memory)


def test_row_errors_are_predicted_over_measured():
    job = validate.GPU_JOB
    cluster, training = job_cluster(1, "dgx-h100-80gb"), gpu.gpu_training(16)
    plan = build_uniform_plan(job.model(), cluster, training, gpu.gpu_configs(1, 24, 24, 16)["mbs2 rc=none"])
    blank = gpu.gpu_row("mbs2", plan, job.model(), cluster, training, gpu.GpuMeasurement(None))
    row = gpu.gpu_row("mbs2", plan, job.model(), cluster, training, _fake_measurement(blank))
    assert row.time_error == pytest.approx(1 / 1.25 - 1)
    assert row.allocated_error == pytest.approx(1 / 1.1 - 1)
    assert row.device_error == pytest.approx(1 / 1.2 - 1)
    prediction = estimate_plan(plan, job.model(), cluster, training)
    assert (row.predicted_tensor_bytes, row.predicted_peak_bytes) == (prediction.peak_memory_gib * GIB,
                                                                       prediction.device_memory_gib * GIB)
    assert row.predicted_peak_bytes > row.predicted_tensor_bytes  # reserve, context and NCCL on top
    assert row.fit_agrees == row.predicted_fits


def test_measurement_takes_the_median_between_warm_up_and_last_and_the_max_over_ranks():
    ranks = [{"peak_bytes": 5.0, "reserved_bytes": 6.0, "device_bytes": 7.0},
             {"peak_bytes": 4.0, "reserved_bytes": 8.0, "device_bytes": 9.0}]
    m = gpu.measurement_from_ranks(ranks, [9.0, 1.0, 3.0, 2.0, 7.0], out_of_memory=False)
    assert (m.seconds, m.allocated_bytes, m.reserved_bytes, m.device_bytes) == (2.0, 5.0, 8.0, 9.0)
    assert gpu.measurement_from_ranks([], [1.0], out_of_memory=True).seconds is None


def test_cuda_main_writes_the_docs_section(tmp_path, monkeypatch):
    import torch

    import megatron_auto.runtime.planning as planning

    monkeypatch.setattr(planning, "detect_cluster_name", lambda: "dgx-h100-80gb")
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H100 80GB HBM3")

    def fake_measure(job, plans, command_for):
        command = command_for(tmp_path / "plan.json", tmp_path / "memory")
        assert "--bf16" in command and "--auto-parallel-plan" in command
        cluster, training = job_cluster(1, "dgx-h100-80gb"), gpu.gpu_training(job.global_batch)
        rows = {name: gpu.gpu_row(name, plan, job.model(), cluster, training, gpu.GpuMeasurement(None))
                for name, plan in plans.items()}
        # The runs run out of memory where the model says they do not fit, and one that it says fits
        # runs out too (a miss the table must show).
        return {name: _fake_measurement(row, out_of_memory=not row.predicted_fits or name == "mbs1 rc=full")
                for name, row in rows.items()}

    monkeypatch.setattr(gpu, "measure_cuda", fake_measure)
    docs = tmp_path / "benchmarks.md"
    docs.write_text("# Benchmarks\n\n## Other\n\nkept\n")
    assert validate.main(["--device", "cuda", "--gpus", "1", "--benchmarks", str(docs)]) == 0
    text = docs.read_text()
    assert "## Other\n\nkept" in text
    assert "## Cost model on GPUs: predicted vs measured (1 x dgx-h100-80gb)" in text
    assert "| mbs8 rc=full |" in text and "-20.0%" in text and "planner pick" in text
    # Every fake run but mbs1 rc=full ran out of memory exactly where the model said it would not fit.
    right, total = map(int, re.search(r"Fits / out of memory predicted right for (\d+) of (\d+)\.", text).groups())
    assert right == total - 1
    assert re.search(r"\| mbs1 rc=full \|.*\| yes \| out of memory \|", text)


def test_log_lines_read_back_as_the_measurements_they_print():
    runs = {"mbs2 rc=none": gpu.GpuMeasurement(1.0324, 36.3 * GIB, 37.05 * GIB, 39.9 * GIB),
            "mbs8 rc=none (planner pick)": gpu.GpuMeasurement(None, out_of_memory=True)}
    log = "warning: unrelated\n" + "\n".join(gpu.measured_line(name, m) for name, m in runs.items())
    read = gpu.measured_from_log(log + "\nmbs1 rc=full   2554.9 ms   28.73 GiB allocated   29.87 GiB reserved\n")
    assert read["mbs2 rc=none"].seconds == pytest.approx(1.0324, abs=1e-4)
    assert read["mbs2 rc=none"].device_bytes == pytest.approx(39.9 * GIB, rel=1e-3)
    assert read["mbs8 rc=none (planner pick)"].out_of_memory
    assert read["mbs1 rc=full"].device_bytes == 0.0 and read["mbs1 rc=full"].seconds == pytest.approx(2.5549)
    assert len(read) == 3


def test_measured_log_rebuilds_the_section_without_a_gpu(tmp_path):
    log = tmp_path / "runs.log"
    log.write_text("mbs2 rc=none   1032.4 ms   36.30 GiB allocated   37.05 GiB reserved\n"
                   "mbs4 rc=full   1043.3 ms   31.17 GiB allocated   32.08 GiB reserved\n")
    docs = tmp_path / "benchmarks.md"
    assert validate.main(["--measured-log", str(log), "--cluster", "dgx-h100-80gb", "--benchmarks", str(docs)]) == 0
    text = docs.read_text()
    assert re.search(r"\| mbs2 rc=none \| 1032 \| \d+ \| [-+]\d+\.\d% \| 36\.30 \|", text)
    assert "| mbs4 rc=full | 1043 |" in text and "| mbs1 rc=none |" not in text
    assert "over 2 runs" in text and "device memory not measured" in text and str(log) in text
