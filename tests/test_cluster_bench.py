"""profile-cluster's group tiling against Megatron-Core's own rank groups (no processes started)."""
from __future__ import annotations

import pytest

pytest.importorskip("torch")
from megatron.core.parallel_state import RankGenerator  # noqa: E402

from megatron_auto.profiling.cluster_bench import group_shapes, tiled_groups  # noqa: E402


def _megatron_groups(world: int, tp: int, pp: int, token: str) -> list[list[int]]:
    dp = world // (tp * pp)
    generator = RankGenerator(tp=tp, ep=1, dp=dp, pp=pp, cp=1, order="tp-cp-ep-dp-pp")
    return sorted(generator.get_ranks(token))


@pytest.mark.parametrize("world,tp", [(4, 2), (8, 2), (8, 4), (16, 4), (16, 2)])
def test_tiling_is_megatrons_tp_and_dp_groups(world, tp):
    """A TP group is `tp` consecutive ranks; a DP group (pp=1) is `world/tp` ranks `tp` apart."""
    assert sorted(tiled_groups(world, tp, 1)) == _megatron_groups(world, tp, 1, "tp")
    assert sorted(tiled_groups(world, world // tp, tp)) == _megatron_groups(world, tp, 1, "dp")


def test_every_shape_tiles_the_world_once():
    for world in (2, 4, 8, 16):
        for size, stride in group_shapes(world):
            groups = tiled_groups(world, size, stride)
            assert sorted(r for g in groups for r in g) == list(range(world))
            assert all(len(g) == size and all(b - a == stride for a, b in zip(g, g[1:])) for g in groups)


def test_tiling_golden():
    assert tiled_groups(4, 2, 1) == [[0, 1], [2, 3]]
    assert tiled_groups(4, 2, 2) == [[0, 2], [1, 3]]
    assert tiled_groups(8, 2, 4) == [[0, 4], [1, 5], [2, 6], [3, 7]]


def test_a_swamped_paired_difference_falls_back_to_the_call_alone(monkeypatch):
    """Where noise makes (chunk + call) - chunk non-positive, the call's own time is recorded, never 0."""
    from megatron_auto.profiling import cluster_bench
    from megatron_auto.profiling.cluster_bench import ClusterBenchConfig, time_collective

    call, chunk = (lambda: None), (lambda: None)
    times = {"call": 0.003, "chunk": 1.2, "both": 1.0}

    def fake_block_seconds(fn, iters, warmup=1, barrier=None, repeats=1):
        return times["call" if fn is call else "chunk" if fn is chunk else "both"]

    monkeypatch.setattr(cluster_bench, "_collective", lambda *args: call)
    monkeypatch.setattr(cluster_bench, "block_seconds", fake_block_seconds)
    monkeypatch.setattr(cluster_bench, "_max_over_world", lambda value, device: value)
    config = ClusterBenchConfig(message_bytes=(1024,))
    assert time_collective("all_reduce", None, 2, 256, config, "cpu", chunk) == 0.003
    times.update(chunk=1.0, both=1.2)
    assert time_collective("all_reduce", None, 2, 256, config, "cpu", chunk) == pytest.approx(0.2)
