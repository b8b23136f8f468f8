"""Profile records, the interpolation laws and the profiled cost path (no torch)."""
from __future__ import annotations

import json
import math
import subprocess
import sys
from dataclasses import replace

import pytest

from megatron_auto import serde
from megatron_auto.cost.compute import layer_compute_times
from megatron_auto.cost.estimate import estimate_plan
from megatron_auto.cost.interpolate import linear_interpolate, loglog_interpolate
from megatron_auto.cost.layer_cost import layer_cost
from megatron_auto.cost.models import ANALYTIC_COMM, ANALYTIC_COMPUTE, comm_model, compute_model
from megatron_auto.errors import UserError
from megatron_auto.plan import LayerStrategy
from megatron_auto.search import search_plan
from megatron_auto.search.uniform import UniformConfig, build_uniform_plan
from megatron_auto.specs.presets import CLUSTER_PRESETS, MODEL_PRESETS
from megatron_auto.specs.profiles import (ClusterProfile, CollectiveCurve, LayerProfile, LayerTiming,
                                          MeasuredCosts, ModelProfile, load_profile, measured_costs)
from megatron_auto.specs.training import TrainingSpec

MODEL = MODEL_PRESETS["tiny-gpt"]
LAYER = MODEL.layers[0]
CLUSTER = replace(CLUSTER_PRESETS["cpu-gloo"], gpus_per_node=4)
TRAINING = TrainingSpec.fp32(8)


def _timing(tp: int, mb: int, forward: float) -> LayerTiming:
    return LayerTiming(tp=tp, micro_batch=mb, seq_length=MODEL.seq_length, forward_s=forward,
                       backward_s=2 * forward, attention_core_forward_s=forward / 4,
                       activation_bytes=1000 * mb, param_bytes=100)


def model_profile() -> ModelProfile:
    timings = (_timing(1, 1, 0.010), _timing(1, 2, 0.018), _timing(1, 4, 0.030), _timing(2, 2, 0.011))
    return ModelProfile(name="tiny-gpt", device="cpu", precision="fp32", concurrent_processes=4,
                        layers=(LayerProfile(LAYER, timings),), optimizer_s_per_state_byte=1e-9)


def cluster_profile() -> ClusterProfile:
    sizes = (1024, 4096, 16384)
    curves = (CollectiveCurve("all_reduce", 2, 1, False, sizes, (1e-4, 2e-4, 8e-4)),
              CollectiveCurve("all_reduce", 4, 1, False, sizes, (2e-4, 4e-4, 1.6e-3)),
              CollectiveCurve("p2p", 2, 1, False, sizes, (5e-5, 6e-5, 1e-4)))
    return ClusterProfile(name="toy", backend="gloo", device="cpu", world_size=4, gpus_per_node=4,
                          curves=curves, grad_overlap_fraction=0.0)


def test_profiles_round_trip_through_json_exactly(tmp_path):
    for record in (model_profile(), cluster_profile()):
        path = tmp_path / f"{record.kind}.json"
        path.write_text(serde.dumps(record))
        loaded = load_profile(str(path))
        assert loaded == record and hash(loaded) == hash(record)
        assert serde.dumps(loaded) == path.read_text()


def test_measured_costs_combines_one_of_each_and_refuses_two(tmp_path):
    paths = []
    for record in (model_profile(), cluster_profile()):
        paths.append(str(tmp_path / f"{record.kind}.json"))
        (tmp_path / f"{record.kind}.json").write_text(serde.dumps(record))
    both = measured_costs(paths)
    assert both.model == model_profile() and both.cluster == cluster_profile()
    with pytest.raises(UserError, match="more than one cluster profile"):
        measured_costs([paths[1], paths[1]])


def test_wrong_kind_or_version_is_a_user_error(tmp_path):
    data = serde.to_dict(cluster_profile())
    (tmp_path / "a.json").write_text(json.dumps({**data, "kind": "plan"}))
    with pytest.raises(UserError, match="kind"):
        load_profile(str(tmp_path / "a.json"))
    (tmp_path / "b.json").write_text(json.dumps({**data, "schema_version": 99}))
    with pytest.raises(UserError, match="schema_version"):
        load_profile(str(tmp_path / "b.json"))


def test_loglog_interpolation_is_a_power_law_between_points_and_bandwidth_bound_beyond():
    xs, ys = (1.0, 100.0), (1.0, 10.0)  # slope 1/2 in log-log
    assert loglog_interpolate(10.0, xs, ys) == pytest.approx(math.sqrt(10.0))
    assert loglog_interpolate(0.5, xs, ys) == 1.0            # latency floor below the smallest size
    assert loglog_interpolate(200.0, xs, ys) == pytest.approx(20.0)  # proportional above the largest
    assert loglog_interpolate(100.0, xs, ys) == pytest.approx(10.0)


def test_linear_interpolation_in_tokens_and_proportional_outside():
    xs, ys = (128.0, 512.0), (0.01, 0.03)
    assert linear_interpolate(320.0, xs, ys) == pytest.approx(0.02)
    assert linear_interpolate(64.0, xs, ys) == pytest.approx(0.005)
    assert linear_interpolate(1024.0, xs, ys) == pytest.approx(0.06)


def test_without_profiles_the_models_are_analytic():
    assert compute_model(CLUSTER) is ANALYTIC_COMPUTE and type(comm_model(CLUSTER)) is type(ANALYTIC_COMM)
    assert comm_model(CLUSTER).grad_overlap == CLUSTER.grad_overlap == 0.0  # cpu-gloo reduces after backward
    only_model = replace(CLUSTER, measured=MeasuredCosts(model=model_profile()))
    assert type(comm_model(only_model)) is type(ANALYTIC_COMM) and compute_model(only_model) is not ANALYTIC_COMPUTE


def test_profiled_layer_times_interpolate_the_measured_points():
    cluster = replace(CLUSTER, measured=MeasuredCosts(model=model_profile()))
    seq = MODEL.seq_length
    times = compute_model(cluster).layer_times(LAYER, seq, 3, 1, False, cluster, 4)
    assert times.forward_s == pytest.approx(0.024)  # halfway between mb 2 (0.018) and mb 4 (0.030)
    assert times.backward_s == pytest.approx(0.048)
    cost = layer_cost(LAYER, LayerStrategy(tp=1, dp=4), 2, seq, cluster, TRAINING)
    assert cost.forward_s == pytest.approx(0.018) and cost.backward_s == pytest.approx(0.036)


def test_unmeasured_tp_scales_the_nearest_point_by_the_analytic_ratio():
    cluster = replace(CLUSTER, measured=MeasuredCosts(model=model_profile()))
    seq = MODEL.seq_length
    times = compute_model(cluster).layer_times(LAYER, seq, 2, 4, False, cluster, 4)
    want = layer_compute_times(LAYER, seq, 2, 4, False, cluster, 4)
    have = layer_compute_times(LAYER, seq, 2, 2, False, cluster, 4)
    assert times.forward_s == pytest.approx(0.011 * want.forward_s / have.forward_s)


def test_profiled_collectives_use_the_matching_curve_and_scale_other_group_sizes():
    cluster = replace(CLUSTER, measured=MeasuredCosts(cluster=cluster_profile()))
    comm = comm_model(cluster)
    assert comm.collective_time("all_reduce", 4096, 4, 1, cluster) == pytest.approx(4e-4)
    assert comm.collective_time("all_reduce", 2048, 2, 1, cluster) == pytest.approx(1e-4 * 2 ** 0.5)
    # 8 ranks: the 4-rank curve times the ring factor (7/8) / (3/4).
    wide = replace(cluster, gpus_per_node=8)
    assert comm.collective_time("all_reduce", 4096, 8, 1, wide) == pytest.approx(4e-4 * (7 / 8) / (3 / 4))
    # No all-gather curve: the analytic ring formula.
    assert comm.collective_time("all_gather", 4096, 4, 1, cluster) == \
        ANALYTIC_COMM.collective_time("all_gather", 4096, 4, 1, cluster)
    assert comm.p2p_time(4096, False, cluster) == pytest.approx(6e-5)


def test_profiles_change_the_estimate_and_the_search_still_runs():
    plain = build_uniform_plan(MODEL, CLUSTER, TRAINING, UniformConfig(tp=1, pp=1, micro_batch_size=2))
    profiled = replace(CLUSTER, measured=MeasuredCosts(cluster_profile(), model_profile()))
    a = estimate_plan(plain, MODEL, CLUSTER, TRAINING)
    b = estimate_plan(plain, MODEL, profiled, TRAINING)
    assert a.iteration_time_s != b.iteration_time_s
    # 4 layers x 1 micro-batch x (forward + backward) of the measured points dominate the profiled time.
    assert b.iteration_time_s > 4 * (0.018 + 0.036)
    result = search_plan(MODEL, profiled, TRAINING, space="megatron")
    assert result.plan.prediction.iteration_time_s == pytest.approx(
        estimate_plan(result.plan, MODEL, profiled, TRAINING).iteration_time_s)


def test_cli_estimate_with_profile_files(tmp_path):
    files = []
    for record in (model_profile(), cluster_profile()):
        files += ["--profile", str(tmp_path / f"{record.kind}.json")]
        (tmp_path / f"{record.kind}.json").write_text(serde.dumps(record))
    base = [sys.executable, "-m", "megatron_auto", "estimate", "--model", "tiny-gpt", "--cluster", "cpu-gloo",
            "--gpus-per-node", "4", "--global-batch-size", "8", "--tp", "1", "--pp", "1",
            "--micro-batch-size", "2", "--json"]
    plain = subprocess.run(base, capture_output=True, text=True, timeout=60)
    measured = subprocess.run(base + files, capture_output=True, text=True, timeout=60)
    assert plain.returncode == 0 and measured.returncode == 0, measured.stderr
    assert json.loads(measured.stdout)["iteration_time_s"] != json.loads(plain.stdout)["iteration_time_s"]
    bad = subprocess.run(base + ["--profile", str(tmp_path / "missing.json")], capture_output=True, text=True,
                         timeout=60)
    assert bad.returncode == 2 and "cannot read profile" in bad.stderr


def test_monotone_fit_pools_noisy_dips_and_keeps_monotone_curves():
    from megatron_auto.cost.interpolate import monotone_fit

    assert monotone_fit((1.0, 2.0, 3.0)) == (1.0, 2.0, 3.0)
    assert monotone_fit((1.0, 7.0, 3.0, 4.0)) == pytest.approx((1.0, 14 / 3, 14 / 3, 14 / 3))


def test_measured_overlap_exposes_gradient_traffic_that_the_analytic_model_hides():
    from megatron_auto.cost.pipeline import exposed_dp_time

    assert exposed_dp_time(1.0, 3.0) == 0.0
    assert exposed_dp_time(1.0, 3.0, overlap=0.25) == pytest.approx(0.75)
    assert exposed_dp_time(3.0, 1.0, overlap=0.0) == 3.0


def test_measured_overlap_applies_only_where_the_runtime_overlaps():
    """The profile says what the hardware can hide; ClusterSpec.grad_overlap whether the runtime tries."""
    profile = replace(cluster_profile(), grad_overlap_fraction=0.5)
    on_cpu = replace(CLUSTER, measured=MeasuredCosts(cluster=profile))           # grad_overlap 0
    overlapping = replace(on_cpu, grad_overlap=1.0)
    assert comm_model(on_cpu).grad_overlap == 0.0
    assert comm_model(overlapping).grad_overlap == pytest.approx(0.5)
