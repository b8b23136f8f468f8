"""Issue 39: node groups whose nodes hold different numbers of GPUs (specs.cluster.NodeGroup.gpus_per_node).

The example: 2 DGX-H100 nodes of 8 GPUs beside 2 A100 nodes of 4 (a cloud's 4-GPU A100 machines), 24 ranks.
torchrun numbers the ranks node by node, so nodes 2 and 3 hold ranks 16-19 and 20-23; a TP group stays inside a
node wherever it lands only up to 4 GPUs; each stage's links are its own group's. The run on CPU ranks in nodes of
2, 1 and 1 is tests/runtime/test_mixed_cluster_run.py."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest

from megatron_auto import serde
from megatron_auto.cli.main import main
from megatron_auto.errors import UserError
from megatron_auto.runtime.planning import cluster_for_world, describe_job_cluster
from megatron_auto.specs.cluster import ClusterSpec
from megatron_auto.specs.presets import CLUSTER_PRESETS, mixed_cluster, with_node_speeds

H100 = CLUSTER_PRESETS["dgx-h100-80gb"]
A100_QUAD = replace(CLUSTER_PRESETS["dgx-a100-80gb"], name="a100-quad", gpus_per_node=4)
UNLIKE = mixed_cluster("h100-a100-quads", ((H100, 2), (A100_QUAD, 2)))


def test_the_ranks_go_node_by_node_and_tp_stays_within_the_smallest_node():
    assert UNLIKE.world_size == 24
    assert UNLIKE.node_ranks() == ((0, 8), (8, 8), (16, 4), (20, 4))
    assert UNLIKE.gpus_per_node == 8 and UNLIKE.common_node_gpus == 4  # the envelope's node; TP's limit
    assert mixed_cluster("odd", ((H100, 1), (replace(A100_QUAD, gpus_per_node=6), 1))).common_node_gpus == 2


def test_each_stage_is_priced_on_its_own_groups_nodes():
    # 3 stages of 8 ranks: one per H100 node, the third on both A100 nodes.
    assert UNLIKE.stage_rank_shares(3) == (((0, 1.0),), ((0, 1.0),), ((1, 1.0),))
    # 2 stages of 12: the second takes half of node 1 (H100) and the A100 nodes.
    assert UNLIKE.stage_rank_shares(2) == (((0, 1.0),), ((0, 4 / 12), (1, 8 / 12)))
    quads = UNLIKE.stage_cluster(2, 3)
    assert (quads.gpus_per_node, quads.num_nodes, quads.gpu.name) == (4, 2, A100_QUAD.gpu.name)
    assert quads.link_for_group(4) is quads.intra_node and quads.link_for_group(8) is quads.inter_node
    assert UNLIKE.stage_cluster(0, 3).link_for_group(8) is UNLIKE.stage_cluster(0, 3).intra_node
    straddling = UNLIKE.stage_cluster(1, 2)
    assert straddling.gpus_per_node == 4 and straddling.gpu.peak_flops == A100_QUAD.gpu.peak_flops


def test_the_node_sizes_survive_a_file_and_node_speeds(tmp_path):
    path = tmp_path / "unlike.json"
    path.write_text(json.dumps(serde.to_dict(UNLIKE)))
    assert serde.from_dict(ClusterSpec, json.loads(path.read_text()), "cluster") == UNLIKE
    slowed = with_node_speeds(UNLIKE, (1.0, 0.5, 1.0, 1.0))
    assert slowed.node_ranks() == UNLIKE.node_ranks() and slowed.world_size == 24
    assert [slowed.group_gpus_per_node(i) for i in range(len(slowed.node_groups))] == [8, 8, 4]


def test_an_envelope_smaller_than_a_node_is_refused_in_one_line(tmp_path, capsys):
    data = serde.to_dict(UNLIKE)
    data["gpus_per_node"] = 4
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    assert main(["plan", "--model", "llama3-8b", "--cluster", str(path), "--global-batch-size", "48"]) == 2
    err = capsys.readouterr().err.strip()
    assert "nodes of [4, 8] GPUs" in err and "must be the largest" in err and "\n" not in err


def test_the_plan_keeps_tp_within_every_node_and_names_each_groups_node_size(tmp_path, capsys):
    path = tmp_path / "unlike.json"
    path.write_text(json.dumps(serde.to_dict(UNLIKE)))
    assert main(["plan", "--model", "llama3-8b", "--cluster", str(path), "--global-batch-size", "48", "--json"]) == 0
    found = json.loads(capsys.readouterr().out)
    flags = found["megatron_flags"]
    assert found["world_size"] == 24 and int(flags[flags.index("--tensor-model-parallel-size") + 1]) <= 4
    assert dict(found["pruning"])["tp-within-node"] > 0  # TP 8 fills an H100 node, but straddles two A100 ones
    assert found["node_groups"][1].startswith("a100-quad: node ranks 2-3, 4 x A100")


def test_the_runtime_checks_each_ranks_node_against_its_group():
    assert cluster_for_world(UNLIKE, 24, 8, rank=0) is UNLIKE
    assert cluster_for_world(UNLIKE, 24, 4, rank=17) is UNLIKE
    assert cluster_for_world(UNLIKE, 24) is UNLIKE  # LOCAL_WORLD_SIZE unset: the file's shape
    with pytest.raises(UserError, match="rank 17 runs on a node of 8 ranks .* node 2, of 4 GPUs"):
        cluster_for_world(UNLIKE, 24, 8, rank=17)
    with pytest.raises(UserError, match=r"has 2 nodes of 8 GPUs \+ 2 nodes of 4 GPUs in its groups \(24 GPUs\); "
                                        "this job has 24 ranks in nodes of 2"):
        cluster_for_world(UNLIKE, 24, 2)
    assert describe_job_cluster(UNLIKE, 24, 4).endswith(
        "node groups: dgx-h100-80gb at node ranks 0-1 (8 GPUs each), a100-quad at node ranks 2-3 (4 GPUs each)")


def test_the_hybrid_space_prices_each_stage_on_its_own_group(tmp_path, capsys):
    """The per-layer search on unlike nodes: each stage's layer DP runs on its group's cost tables and memory
    (search/hybrid.py), so a stage at the A100s' pace gets fewer layers; the plan's prediction is estimate_plan's,
    and here it beats the megatron space's best, interleaved splits and all (the exactness against brute force is
    tests/test_search_optimality.py's slow-node case)."""
    path, out = tmp_path / "unlike.json", tmp_path / "plan.json"
    path.write_text(json.dumps(serde.to_dict(UNLIKE)))
    job = ["plan", "--model", "gpt3-1.7b", "--cluster", str(path), "--global-batch-size", "48", "--json"]
    assert main([*job, "--space", "hybrid", "--out", str(out)]) == 0
    hybrid = json.loads(capsys.readouterr().out)
    assert main(job) == 0
    megatron = json.loads(capsys.readouterr().out)
    assert hybrid["space"] == "hybrid" and hybrid["iteration_time_s"] < megatron["iteration_time_s"]
    chunks = json.loads(out.read_text())["chunks"]
    assert all(layer["tp"] <= UNLIKE.common_node_gpus for chunk in chunks for layer in chunk["layers"])
    a100_paced = [stage for stage, group in enumerate(UNLIKE.stage_groups(len(chunks))) if group == 1]
    assert a100_paced and all(len(chunks[s]["layers"]) < len(chunks[0]["layers"]) for s in a100_paced)
