"""The job's node shape (runtime.planning): torchrun's LOCAL_WORLD_SIZE GPUs per node, checked before any work."""
from __future__ import annotations

import pytest

from megatron_auto.errors import UserError
from megatron_auto.runtime.planning import cluster_for_world, describe_job_cluster, gpus_per_node_from_env
from megatron_auto.specs.loaders import load_cluster


@pytest.mark.parametrize("world", range(1, 9))
def test_one_machine_is_the_one_node_priced_without_local_world_size(world):
    # The CPU test launcher sets LOCAL_WORLD_SIZE to WORLD_SIZE: its runs keep the cluster (and so the plans) of old.
    cpu = load_cluster("cpu-gloo")
    assert cluster_for_world(cpu, world, gpus_per_node_from_env(world, {"LOCAL_WORLD_SIZE": str(world)})) == \
        cluster_for_world(cpu, world)


def test_the_node_is_local_world_size_gpus_of_the_preset():
    h100 = load_cluster("dgx-h100-80gb")
    assert cluster_for_world(h100, 16, 8) == cluster_for_world(h100, 16)  # the preset's own 8-GPU nodes
    quads = cluster_for_world(h100, 16, 4)
    assert (quads.num_nodes, quads.gpus_per_node, quads.gpu, quads.inter_node) == (4, 4, h100.gpu, h100.inter_node)
    # TP 4 fills a 4-GPU node (NVLink); on 2-GPU nodes it crosses InfiniBand.
    assert quads.link_for_group(4) is quads.intra_node
    assert cluster_for_world(h100, 16, 2).link_for_group(4) is h100.inter_node
    assert cluster_for_world(h100, 12, 4).num_nodes == 3  # no whole number of the preset's 8-GPU nodes


def test_unset_local_world_size_is_none_and_the_log_says_so():
    assert gpus_per_node_from_env(16, {}) is None
    h100 = load_cluster("dgx-h100-80gb")
    assert describe_job_cluster(cluster_for_world(h100, 16, 2), 16, 2) == \
        "priced 8 nodes x 2 GPUs of dgx-h100-80gb (WORLD_SIZE 16, LOCAL_WORLD_SIZE 2)"
    assert describe_job_cluster(cluster_for_world(h100, 4), 4, None).startswith(
        "priced 1 node x 4 GPUs of dgx-h100-80gb (WORLD_SIZE 4, LOCAL_WORLD_SIZE unset")


@pytest.mark.parametrize("value, message", [
    ("3", "LOCAL_WORLD_SIZE 3 does not divide WORLD_SIZE 16"), ("32", "LOCAL_WORLD_SIZE 32 does not divide"),
    ("0", "must be a positive integer"), ("-8", "must be a positive integer"), ("8.0", "must be a positive integer"),
    ("", "must be a positive integer")])
def test_a_local_world_size_that_is_no_node_of_the_job_is_a_user_error(value, message):
    with pytest.raises(UserError, match=message):
        gpus_per_node_from_env(16, {"LOCAL_WORLD_SIZE": value})
