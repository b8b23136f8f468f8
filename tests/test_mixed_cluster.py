"""Issue 39, first part: clusters of unlike node groups, priced stage by stage and planned with the layers balanced
over the groups (specs/cluster.py NodeGroup, specs/presets.py mixed_cluster, cost/estimate.py stage_clusters,
search/mixed_splits.py)."""
from __future__ import annotations

import itertools
import json
from dataclasses import replace

import pytest

from megatron_auto import serde
from megatron_auto.cli.main import main
from megatron_auto.cost.estimate import estimate_plan
from megatron_auto.errors import UserError
from megatron_auto.pipeline_layout import chunk_layers_of_layout
from megatron_auto.search import SearchConstraints, search_plan
from megatron_auto.search.integers import divisors
from megatron_auto.search.mixed_splits import EXHAUSTIVE_SPLITS, _compositions, chunk_layout, interleaved_layouts
from megatron_auto.search.uniform import UniformConfig, build_uniform_plan
from megatron_auto.specs import TrainingSpec, load_cluster, load_model
from megatron_auto.specs.presets import CLUSTER_PRESETS, mixed_cluster

H100, A100 = CLUSTER_PRESETS["dgx-h100-80gb"], CLUSTER_PRESETS["dgx-a100-80gb"]
MIXED = "mixed-h100-a100"


def test_the_preset_holds_its_groups_in_node_rank_order():
    cluster = load_cluster(MIXED)
    assert cluster.num_nodes == 4 and cluster.world_size == 32 and cluster.is_mixed
    assert cluster.stage_groups(4) == (0, 0, 1, 1) and cluster.stage_groups(2) == (0, 1)
    assert cluster.stage_cluster(0, 4).gpu == H100.gpu and cluster.stage_cluster(3, 4).gpu == A100.gpu
    assert cluster.stage_cluster(3, 4).inter_node == A100.inter_node
    # One stage over all four nodes runs at the A100s' pace, within the smaller memory and over the slower NICs.
    assert cluster.stage_spans(1) == ((0, 1),) and cluster.stage_groups(1) == (1,)
    whole = cluster.stage_cluster(0, 1)
    assert whole.gpu.peak_flops == A100.gpu.peak_flops and whole.compute == A100.compute
    assert whole.gpu.capacity_bytes == min(H100.gpu.capacity_bytes, A100.gpu.capacity_bytes)
    assert whole.inter_node == A100.inter_node
    # The envelope the search's bounds read: no group's GPU is faster or holds more.
    assert cluster.gpu.peak_flops == H100.gpu.peak_flops and cluster.gpu.capacity_bytes >= A100.gpu.capacity_bytes
    assert cluster.gpu.fp8_peak_flops == 0  # FP8 only where every group has it


def test_a_mixed_cluster_file_loads_and_a_bad_one_is_refused_in_one_line(tmp_path, capsys):
    path = tmp_path / "mine.json"
    path.write_text(json.dumps(serde.to_dict(load_cluster(MIXED))))
    assert load_cluster(str(path)) == load_cluster(MIXED)
    data = serde.to_dict(load_cluster(MIXED))
    data["num_nodes"] = 5
    path.write_text(json.dumps(data))
    assert main(["plan", "--model", "llama3-8b", "--cluster", str(path), "--global-batch-size", "64"]) == 2
    err = capsys.readouterr().err.strip()
    assert "node groups hold 4 nodes, the cluster 5" in err and "\n" not in err


def test_a_slow_group_runs_its_stages_at_its_speed():
    cluster = load_cluster(MIXED)
    slow = replace(cluster, node_groups=(cluster.node_groups[0], replace(cluster.node_groups[1], speed_factor=0.5)))
    assert slow.stage_cluster(3, 4).gpu.peak_flops == A100.gpu.peak_flops * 0.5
    model, training = load_model("llama3-8b"), TrainingSpec(64)
    config = UniformConfig(tp=8, pp=4, micro_batch_size=1, sequence_parallel=True, distributed_optimizer=True)
    plan = build_uniform_plan(model, cluster, training, config)
    fast_times = estimate_plan(plan, model, cluster, training).stage_time_s
    slow_times = estimate_plan(plan, model, slow, training).stage_time_s
    assert fast_times[3] > fast_times[0]  # an A100 stage of the same layers takes longer than an H100 one
    assert slow_times[3] > fast_times[3] and slow_times[0] == fast_times[0]


def test_groups_of_one_kind_price_as_the_uniform_cluster():
    """Stage by stage pricing changes nothing where every group is the same: the estimate equals the uniform one."""
    same = mixed_cluster("h100-twice", ((H100, 2), (H100, 2)))
    uniform = H100.with_nodes(4)
    model, training = load_model("llama3-70b"), TrainingSpec(128)
    for pp, v in ((2, 1), (4, 1), (4, 5)):
        config = UniformConfig(tp=8, pp=pp, micro_batch_size=1, vp=v, sequence_parallel=True,
                               distributed_optimizer=True, recompute="full")
        plan = build_uniform_plan(model, uniform, training, config)
        ours, theirs = (estimate_plan(plan, model, c, training) for c in (same, uniform))
        assert ours.iteration_time_s == pytest.approx(theirs.iteration_time_s, rel=1e-12)
        assert ours.stage_memory_gib == pytest.approx(theirs.stage_memory_gib, rel=1e-12)
        assert ours.fits == theirs.fits


def test_the_plan_balances_layers_over_the_groups_and_beats_the_slower_kind_everywhere(capsys):
    """Issue 39's example: Llama 3 70B on 2 DGX-H100 and 2 DGX-A100 nodes is predicted faster than the best plan
    on 4 DGX-A100 nodes, and its H100 stages hold more layers; the report names each group's node ranks."""
    model, training = load_model("llama3-70b"), TrainingSpec(128)
    mixed = search_plan(model, load_cluster(MIXED), training, "megatron", choose_recompute_modules=True).plan
    slower = search_plan(model, A100.with_nodes(4), training, "megatron", choose_recompute_modules=True).plan
    assert mixed.prediction.fits and mixed.prediction.iteration_time_s < slower.prediction.iteration_time_s
    counts, groups = mixed.stage_layer_counts(), load_cluster(MIXED).stage_groups(mixed.pipeline_parallel)
    h100 = [count for count, group in zip(counts, groups) if group == 0]
    a100 = [count for count, group in zip(counts, groups) if group == 1]
    assert min(h100) > max(a100)
    assert main(["plan", "--model", "llama3-70b", "--cluster", MIXED, "--global-batch-size", "128", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["node_groups"][0].startswith("dgx-h100-80gb: node ranks 0-1")
    assert any("--pipeline-model-parallel-layout" == flag for flag in out["megatron_flags"])


@pytest.mark.parametrize("argv, words", [
    (["--num-nodes", "8"], "leave --num-nodes out"),
    (["--gpus-per-node", "4"], "has 4 nodes of 8 GPUs in its groups; leave --gpus-per-node out"),
    (["--precision", "fp8"], "no FP8 tensor cores"),
])
def test_what_a_mixed_cluster_cannot_do_is_one_line_and_exit_2(capsys, argv, words):
    assert main(["plan", "--model", "llama3-8b", "--cluster", MIXED, "--global-batch-size", "64", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert words in err and "\n" not in err


def test_a_stage_that_straddles_the_groups_runs_at_the_slower_ones_pace(capsys):
    """Every step of a stage waits for its slowest rank: one stage over H100 and A100 nodes is the A100s' run."""
    job = ["--model", "llama3-8b", "--global-batch-size", "64", "--tp", "8", "--pp", "1", "--micro-batch-size", "1",
           "--distributed-optimizer", "--sequence-parallel", "--json"]
    assert main(["estimate", "--cluster", MIXED, *job]) == 0
    mixed = json.loads(capsys.readouterr().out)
    assert main(["estimate", "--cluster", "dgx-a100-80gb", "--num-nodes", "4", *job]) == 0
    a100 = json.loads(capsys.readouterr().out)
    assert mixed["iteration_time_s"] == pytest.approx(a100["iteration_time_s"], rel=1e-12)


def test_the_runtime_refuses_a_job_of_another_shape_on_a_mixed_cluster():
    from megatron_auto.runtime.planning import cluster_for_world

    cluster = load_cluster(MIXED)
    assert cluster_for_world(cluster, 32, 8) is cluster
    with pytest.raises(UserError, match="has 4 nodes of 8 GPUs"):
        cluster_for_world(cluster, 16, 8)


def _layouts(split, every_v: bool = False):
    """(stage_layers, chunk_layers, v) of `split` at one chunk per stage, then interleaved: at the chunk counts the
    search offers, or with `every_v` at every count from 2 to the fewest layers of a stage."""
    if split is None:
        return [(None, None, 1)]
    chunked = [chunk_layout(split, v) for v in range(2, min(split) + 1)] if every_v else interleaved_layouts(split)
    return [(split, None, 1)] + [(split, layout, len(layout) // len(split)) for layout in chunked]


def _brute_force(model, cluster, training, every_v: bool = False) -> float:
    """The fastest fitting plan over every tp, pp, micro-batch, split of the layers into stages and chunk count of
    the split (SP, the distributed optimizer, no recomputation): a part of the megatron space that the search must
    find the best of."""
    best = float("inf")
    world = cluster.world_size
    for tp, pp in itertools.product(divisors(cluster.gpus_per_node), divisors(world)):
        dp = world // (tp * pp)
        if dp < 1 or world % (tp * pp) or model.layers[0].tensor_parallel_error(tp) or pp > model.num_layers \
                or cluster.stage_groups(pp) is None:
            continue
        splits = [None] if pp == 1 else list(_compositions(model.num_layers, pp))
        layouts = [layout for split in splits for layout in _layouts(split, every_v)]
        for mbs, (split, chunks, v) in itertools.product(divisors(training.global_batch_size // dp), layouts):
            config = UniformConfig(tp=tp, pp=pp, micro_batch_size=mbs, sequence_parallel=tp > 1,
                                   distributed_optimizer=dp > 1, stage_layers=split, chunk_layers=chunks,
                                   vp=v)
            try:
                prediction = estimate_plan(build_uniform_plan(model, cluster, training, config), model, cluster,
                                           training)
            except UserError:
                continue
            if prediction.fits:
                best = min(best, prediction.iteration_time_s)
    return best


def test_the_search_is_at_least_as_fast_as_every_split_tried_one_by_one():
    """On a model small enough that every split is searched (mixed_splits.EXHAUSTIVE_SPLITS), the search's plan is
    no slower than the best of every (tp, pp, micro-batch, split, chunk layout) priced one by one: its bounds (the
    envelope's, the stages' own floors) prune nothing that wins."""
    cluster = mixed_cluster("h100-a100-small", ((H100, 1), (A100, 1)))
    model, training = load_model("tiny-gpt"), TrainingSpec(32)
    assert all(len(list(_compositions(model.num_layers, pp))) <= EXHAUSTIVE_SPLITS for pp in (2, 4))
    found = search_plan(model, cluster, training, "megatron").plan.prediction.iteration_time_s
    assert found <= _brute_force(model, cluster, training) * (1 + 1e-12)


def test_the_search_is_at_least_as_fast_as_every_interleaved_layout_tried_one_by_one():
    """Ten Llama 3 8B layers on two single-GPU H100 nodes, node 1 at half speed: every split is searched, and the
    best of the searches at each pinned chunk count is no slower than any (tp, pp, micro-batch, split, v of 1 up
    to the fewest layers of a stage) priced one by one. The searches at 2, 3 and 4 chunks interleave uneven
    stages; replayed chunk by chunk (cost.estimate.interleaved_iteration) none of them beats the one-chunk 9, 1."""
    from megatron_auto.specs.presets import with_node_speeds

    cluster = with_node_speeds(_single_gpu_nodes(2), (1.0, 0.5))
    eight_b = load_model("llama3-8b")
    model, training = replace(eight_b, layers=eight_b.layers[:10]), TrainingSpec(8)
    assert len(list(_compositions(model.num_layers, 2))) <= EXHAUSTIVE_SPLITS
    plans = [search_plan(model, cluster, training, "megatron", SearchConstraints(vp=v)).plan
             for v in range(1, model.num_layers // 2 + 1)]  # each chunk count pinned, as a user would pin it
    best = min(plans, key=lambda plan: plan.prediction.iteration_time_s)
    assert sum(plan.virtual_stages > 1 and len(set(plan.stage_layer_counts())) > 1 for plan in plans) >= 3
    assert best.prediction.iteration_time_s <= _brute_force(model, cluster, training, every_v=True) * (1 + 1e-12)


def _single_gpu_nodes(nodes: int):
    from megatron_auto.runtime.planning import cluster_for_world

    return cluster_for_world(H100, nodes, 1)


def test_a_chunk_layout_spreads_each_stages_layers_over_its_chunks():
    """Chunk c of pp x v sits on stage c % pp (Megatron's order); each stage's chunks hold its layers, differ by at
    most one layer, the earlier ones taking the remainder, and none is empty."""
    for split, v in itertools.chain(itertools.product(((5, 5, 2, 4), (27, 5), (9, 9, 5, 9), (3, 3)), (2, 3)),
                                    (((32, 32, 8, 8), 8), ((7, 2), 2))):
        if v > min(split):
            continue
        layout, pp = chunk_layout(split, v), len(split)
        assert len(layout) == pp * v and sum(layout) == sum(split) and min(layout) >= 1
        for stage, layers in enumerate(split):
            chunks = layout[stage::pp]
            assert sum(chunks) == layers and max(chunks) - min(chunks) <= 1
            assert list(chunks) == sorted(chunks, reverse=True)
    assert chunk_layout((5, 5, 2, 4), 2) == (3, 3, 1, 2, 2, 2, 1, 2)
    assert [len(layout) // 4 for layout in interleaved_layouts((32, 32, 9, 9))] == [2, 4, 8, 9]
    assert [len(layout) // 2 for layout in interleaved_layouts((27, 5))] == [2, 4, 5]
    assert interleaved_layouts((5, 5, 2, 4)) == [(3, 3, 1, 2, 2, 2, 1, 2)]
    assert interleaved_layouts((5, 5, 1, 4)) == [] and interleaved_layouts((7,)) == []
    assert interleaved_layouts((27, 5), 3) == [chunk_layout((27, 5), 3)] and interleaved_layouts((27, 5), 6) == []
    assert interleaved_layouts((27, 5), 1) == []


def test_on_a_slow_node_uneven_stages_interleave_only_at_a_pinned_chunk_count():
    """Llama 3 8B on four single-GPU H100 nodes, node 2 at half speed, 8 micro-batches. By default the search keeps
    one chunk per stage on the uneven splits (megatron_space._mixed_splits says why: uneven interleaved layouts ran
    far slower than predicted); with --virtual-stages 5 pinned it spreads each stage's layers over 5 chunks (a
    --pipeline-model-parallel-layout), which the cost model prices faster."""
    from megatron_auto.megatron_flags import megatron_flags
    from megatron_auto.specs.presets import with_node_speeds

    cluster = with_node_speeds(_single_gpu_nodes(4), (1.0, 1.0, 0.5, 1.0))
    model, training = load_model("llama3-8b"), TrainingSpec.for_precision("bf16", 8)
    plan = search_plan(model, cluster, training, "megatron").plan
    assert plan.virtual_stages == 1 and len(set(plan.stage_layer_counts())) > 1
    pinned = search_plan(model, cluster, training, "megatron", SearchConstraints(vp=5)).plan
    counts = pinned.stage_layer_counts()
    assert pinned.virtual_stages == 5 and len(set(counts)) > 1 and counts[2] == min(counts)
    assert tuple(len(chunk.layers) for chunk in pinned.chunks) == chunk_layout(counts, 5)
    assert "--pipeline-model-parallel-layout" in megatron_flags(pinned)
    assert pinned.prediction.iteration_time_s < plan.prediction.iteration_time_s


def test_the_stage_floors_stay_below_the_estimate_on_a_mixed_cluster():
    """What the search prunes on (search/stage_bound.py, each stage on its own group as estimate_plan prices it)
    never exceeds the estimate, in time or memory, on the splits it searches, interleaved or not."""
    from megatron_auto.search.mixed_splits import mixed_stage_splits
    from megatron_auto.search.uniform_floors import candidate_floors, cannot_fit

    cluster, model = load_cluster(MIXED), load_model("llama3-8b")
    training = TrainingSpec(64, memory_budget_bytes=40 * 2**30)
    checked = unfit = interleaved = 0
    for tp, pp, recompute, mbs in itertools.product((2, 8), (2, 4), ("none", "selective", "full"), (1, 2)):
        for split, chunks, v in (layout for split in mixed_stage_splits(model, cluster, training, tp, pp)
                                 for layout in _layouts(split)):
            config = UniformConfig(tp=tp, pp=pp, micro_batch_size=mbs, sequence_parallel=True,
                                   distributed_optimizer=True, stage_layers=split, recompute=recompute,
                                   chunk_layers=chunks, vp=v)
            prediction = estimate_plan(build_uniform_plan(model, cluster, training, config), model, cluster,
                                       training)
            floors = candidate_floors(model, cluster, training, config, v, memory=True)
            assert floors.time_s <= prediction.iteration_time_s
            if cannot_fit(model, cluster, training, config, floors):
                assert not prediction.fits
                unfit += 1
            checked += 1
            interleaved += v > 1
    assert checked > 20 and unfit > 0 and interleaved > 20


LAUNCH_LINE = ["--num-layers", "32", "--hidden-size", "4096", "--ffn-hidden-size", "14336", "--num-attention-heads",
               "32", "--group-query-attention", "--num-query-groups", "8", "--seq-length", "8192",
               "--max-position-embeddings", "8192", "--swiglu", "--normalization", "RMSNorm", "--disable-bias-linear",
               "--position-embedding-type", "rope", "--untie-embeddings-and-output-weights", "--mock-data",
               "--tokenizer-type", "NullTokenizer", "--vocab-size", "128256", "--micro-batch-size", "1",
               "--global-batch-size", "128", "--lr", "3e-4", "--train-iters", "10", "--bf16",
               "--use-distributed-optimizer", "--auto-parallel", "--auto-parallel-cluster", MIXED,
               "--auto-parallel-dry-run"]


@pytest.mark.parametrize("local_world", ["8", "4"])
def test_a_launch_line_under_auto_parallel_names_the_node_ranks_of_each_group(monkeypatch, capsys, caplog, local_world):
    """tools/pretrain_gpt.py --auto-parallel on the mixed preset: the dry run prints which node ranks each group
    must take, and the log line says what was priced; torchrun's nodes of another size are one line, exit 2."""
    import logging

    from megatron_auto import train

    monkeypatch.setenv("WORLD_SIZE", "32")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", local_world)
    monkeypatch.delenv("RANK", raising=False)
    caplog.set_level(logging.INFO)
    code = train.main(list(LAUNCH_LINE))
    captured = capsys.readouterr()
    if local_world == "4":
        assert code == 2 and "has 4 nodes of 8 GPUs in its groups" in captured.err
        return
    assert code == 0
    assert "dgx-h100-80gb: node ranks 0-1" in captured.out and "dgx-a100-80gb: node ranks 2-3" in captured.out
    assert "the launch line's own parallelism flags" in captured.out  # pp 1: all four nodes at the A100s' pace
    assert "node groups: dgx-h100-80gb at node ranks 0-1, dgx-a100-80gb at node ranks 2-3" in caplog.text


def test_node_speeds_make_groups_of_the_nodes_that_run_alike():
    from megatron_auto.specs.presets import with_node_speeds

    uniform = H100.with_nodes(4)
    assert with_node_speeds(uniform, (1, 1, 1, 1)) == uniform
    slowed = with_node_speeds(uniform, (1, 1, 0.5, 1))
    assert [(g.num_nodes, g.speed_factor) for g in slowed.node_groups] == [(2, 1.0), (1, 0.5), (1, 1.0)]
    assert slowed.gpu == uniform.gpu  # the envelope: no node runs faster than before
    mixed = with_node_speeds(load_cluster(MIXED), (1, 0.8, 1, 1))
    assert [(g.gpu.name, g.num_nodes, g.speed_factor) for g in mixed.node_groups] == [
        (H100.gpu.name, 1, 1.0), (H100.gpu.name, 1, 0.8), (A100.gpu.name, 2, 1.0)]


@pytest.mark.parametrize("speeds, words", [(["0.5", "1"], "2 node speeds for the 8 nodes"),
                                           (["1.5"] * 8, "in (0, 1]")])
def test_bad_node_speeds_are_one_line_and_exit_2(capsys, speeds, words):
    argv = ["plan", "--model", "llama3-70b", "--cluster", "dgx-h100-80gb", "--num-nodes", "8",
            "--global-batch-size", "128", "--node-speeds", *speeds]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert words in err and "\n" not in err


def test_a_plan_for_a_slow_node_moves_work_off_it(capsys):
    """Llama 3 70B on 8 H100 nodes, node 0 at half speed (`--node-speeds 0.5 1 1 1 1 1 1 1`): the plan for it is
    predicted faster than the plan for 8 healthy nodes run on them, and the slow node's stage holds the fewest
    layers."""
    job = ["--model", "llama3-70b", "--cluster", "dgx-h100-80gb", "--num-nodes", "8", "--global-batch-size", "128"]
    slow = ["--node-speeds", "0.5", *["1"] * 7]
    assert main(["plan", *job, "--json"]) == 0
    healthy = json.loads(capsys.readouterr().out)
    assert main(["plan", *job, *slow, "--json"]) == 0
    replanned = json.loads(capsys.readouterr().out)
    flags = healthy["megatron_flags"]
    own = flags[:flags.index("--global-batch-size")]  # the healthy plan's layout flags
    values = dict(zip(own[::2], own[1::2]))
    argv = ["estimate", *job, *slow, "--tp", values["--tensor-model-parallel-size"],
            "--pp", values["--pipeline-model-parallel-size"], "--cp", values["--context-parallel-size"],
            "--micro-batch-size", values["--micro-batch-size"], "--sequence-parallel", "--distributed-optimizer",
            "--json"]
    assert main(argv) == 0
    as_before = json.loads(capsys.readouterr().out)
    assert replanned["iteration_time_s"] < as_before["iteration_time_s"]
    assert replanned["node_groups"][0].startswith("dgx-h100-80gb at 0.5: node rank 0")
    flags = replanned["megatron_flags"]
    pp = int(flags[flags.index("--pipeline-model-parallel-size") + 1])
    chunks = chunk_layers_of_layout(flags[flags.index("--pipeline-model-parallel-layout") + 1], pp, 80)
    layers = [sum(chunks[stage::pp]) for stage in range(pp)]  # chunk c on stage c % pp
    assert layers[0] == min(layers) < max(layers)
