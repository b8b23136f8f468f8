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
