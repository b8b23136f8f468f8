"""Issue 39: `profile-cluster` measures each node's speed (profiling/node_speeds.py).

Two gloo ranks, each its own node (torchrun's LOCAL_WORLD_SIZE 1), profile the cluster with rank 1 slowed 2x by the
test-only switch MEGATRON_AUTO_SLOW_RANK=1:2 (its timed matmuls last twice their CPU seconds, the other rank's once
theirs). The profile must say node 1 runs at about half speed and node 0 at full. Each rank times the fastest of 16
matmuls by their CPU seconds, so the other pytest workers on the two cores move neither rank's time (by their wall
time, as before, they once moved node 1 to 0.30); the bound below allows either rank's best run to be 30% off.
"""
from __future__ import annotations

from validation.launcher import launch
from megatron_auto.specs.profiles import load_profile


def test_profile_cluster_measures_the_slow_nodes_speed(tmp_path, monkeypatch):
    out = tmp_path / "cluster.json"
    monkeypatch.setenv("MEGATRON_AUTO_SLOW_RANK", "1:2")
    argv = ["-m", "megatron_auto", "profile-cluster", "--out", str(out), "--min-bytes", "1024", "--max-bytes", "1024",
            "--iters", "1"]
    result = launch(2, argv, timeout_s=240, log_dir=tmp_path / "logs", local_world_size=1)
    assert result.ok, result.output[-4000:]
    speeds = load_profile(str(out)).node_speeds
    assert len(speeds) == 2 and speeds[0] == 1.0 and 0.35 <= speeds[1] <= 0.65, speeds
