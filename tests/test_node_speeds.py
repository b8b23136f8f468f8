"""Issue 39: node speeds that `profile-cluster` measures (profiling/node_speeds.py) and that `plan --profile` then
plans for, as it plans for `--node-speeds`. The measurement on two ranks is tests/runtime/test_node_speed_profile.py."""
from __future__ import annotations

import json

import pytest
import torch

from fake_clock import FakeClock
from megatron_auto import serde
from megatron_auto.cli.main import main
from megatron_auto.profiling import node_speeds as node_speeds_module
from megatron_auto.profiling.node_speeds import matmul_seconds, node_speeds
from megatron_auto.specs.profiles import ClusterProfile

JOB = ["plan", "--model", "llama3-8b", "--cluster", "dgx-h100-80gb", "--num-nodes", "4", "--gpus-per-node", "1",
       "--global-batch-size", "16", "--json"]


def test_a_node_goes_at_its_slowest_ranks_pace_against_the_healthy_ranks():
    assert node_speeds([1.0, 1.0, 2.0, 1.0], [0, 1, 2, 3]) == (1.0, 1.0, 0.5, 1.0)
    assert node_speeds([1.0, 2.0], [0, 1]) == (1.0, 0.5)  # the faster half is the reference, not the mean of two
    assert node_speeds([1.0, 1.05, 1.0, 1.3], [0, 0, 1, 1]) == (1.0, 0.75)  # 1 / 1.3, in steps of 0.05
    assert node_speeds([1.0, 1.08, 0.95, 1.02], [0, 1, 2, 3]) == (1.0,) * 4  # within NOISE: healthy


class _LoadedCore(FakeClock):
    """Every matmul takes 0.01 s of CPU and, as other processes share the core, 0.02 to 0.04 s of wall time."""

    runs = 0

    def matmul(self, a, b):
        self.runs += 1
        self.compute(0.01, 0.01 * (2 + self.runs % 3))


@pytest.mark.parametrize("slowdown, seconds", [(None, 0.02), (1.0, 0.01), (2.0, 0.02), (3.0, 0.03)])
def test_a_slowed_rank_times_its_matmul_as_its_cpu_seconds_times_the_slowdown(monkeypatch, slowdown, seconds):
    """Off the switch (None) the fastest wall time counts; under it (any factor, 1.0 for the healthy ranks) each run
    lasts its CPU seconds times the factor, so the load on the cores moves no rank's time and the ratio is the
    factor's (a slowdown applied to the wall time, as before, would make the slow rank's best 2 x 0.02 s here)."""
    core = _LoadedCore()
    monkeypatch.setattr(node_speeds_module, "time", core)
    monkeypatch.setattr(node_speeds_module.torch, "matmul", core.matmul)
    assert matmul_seconds(torch.device("cpu"), 4, torch.float32, slowdown) == pytest.approx(seconds)


def _profile(tmp_path, speeds) -> str:
    profile = ClusterProfile(name="measured", backend="nccl", device="H100", world_size=len(speeds),
                             gpus_per_node=1, curves=(), node_speeds=tuple(speeds))
    path = tmp_path / f"cluster-profile-{'-'.join(map(str, speeds))}.json"
    path.write_text(json.dumps(serde.to_dict(profile)))
    return str(path)


def _seconds(capsys, argv) -> float:
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)["iteration_time_s"]


def test_plan_with_a_profile_of_the_jobs_nodes_plans_for_their_speeds(tmp_path, capsys):
    healthy_profile = ["--profile", _profile(tmp_path, (1.0,) * 4)]
    slow = _seconds(capsys, [*JOB, "--profile", _profile(tmp_path, (1.0, 1.0, 0.5, 1.0))])
    as_flags = _seconds(capsys, [*JOB, *healthy_profile, "--node-speeds", "1", "1", "0.5", "1"])
    healthy = _seconds(capsys, [*JOB, *healthy_profile])
    assert slow == pytest.approx(as_flags, rel=1e-12) and slow > healthy
    # A profile of other nodes lends its curves but not its speeds; --node-speeds overrides the profile's.
    assert _seconds(capsys, [*JOB, "--profile", _profile(tmp_path, (1.0, 0.5))]) == pytest.approx(healthy, rel=1e-12)
    assert _seconds(capsys, [*JOB, "--profile", _profile(tmp_path, (0.5, 1.0, 1.0, 1.0)), "--node-speeds",
                             "1", "1", "1", "1"]) == pytest.approx(healthy, rel=1e-12)


def test_a_profile_with_a_speed_out_of_range_is_one_line_and_exit_2(tmp_path, capsys):
    path = tmp_path / "bad.json"
    data = json.loads(open(_profile(tmp_path, (1.0, 1.0, 0.5, 1.0))).read())
    data["node_speeds"] = [1.0, 1.0, 1.5, 1.0]
    path.write_text(json.dumps(data))
    assert main([*JOB, "--profile", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "node_speeds are shares of the modelled speed" in err and "\n" not in err


def test_estimate_of_a_plan_file_prices_the_node_speeds_given(tmp_path, capsys):
    """A plan file scored with --node-speeds (or a profile's speeds) runs at them, as the same flags do."""
    plan_path = tmp_path / "plan.json"
    assert main([*JOB, "--out", str(plan_path)]) == 0
    healthy = json.loads(capsys.readouterr().out)["iteration_time_s"]
    scored = ["estimate", "--plan", str(plan_path), "--num-nodes", "4", "--gpus-per-node", "1", "--json"]
    assert _seconds(capsys, scored) == pytest.approx(healthy, rel=1e-12)
    assert _seconds(capsys, [*scored, "--node-speeds", "1", "1", "0.5", "1"]) > healthy
    healthy_profile = ["--profile", _profile(tmp_path, (1.0,) * 4)]
    as_flags = _seconds(capsys, [*scored, *healthy_profile, "--node-speeds", "1", "1", "0.5", "1"])
    measured = _seconds(capsys, [*scored, "--profile", _profile(tmp_path, (1.0, 1.0, 0.5, 1.0))])
    assert measured == pytest.approx(as_flags, rel=1e-12) and measured > _seconds(capsys, [*scored, *healthy_profile])
