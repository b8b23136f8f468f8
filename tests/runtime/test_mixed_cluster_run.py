"""Issue 39: a plan made for a mixed cluster runs as Megatron-Core runs any uneven pipeline.

Four gloo ranks stand for a cluster of unlike nodes (a cluster file the test writes): one "node" of two ranks
beside two of one rank each (torchrun agents of --nproc-per-node 2, 1 and 1: LOCAL_WORLD_SIZE differs per node),
the one-rank nodes running at a third of the first's speed. Under --auto-parallel the search gives the fast node's
stage more layers, the log names each group's node ranks and node size, and the run trains with its loss falling.
That uneven splits compute what one process computes is tests/runtime/test_equivalence.py's pp2_uneven_3_1 and,
interleaved, pp2_vp2_pipeline_layout.
"""
from __future__ import annotations

import json
import re
from dataclasses import replace

from validation.launcher import launch
from megatron_auto.pipeline_layout import chunk_layers_of_layout

ARGV = ["tools/pretrain_gpt.py", "--num-layers", "8", "--hidden-size", "64", "--num-attention-heads", "4",
        "--seq-length", "64", "--max-position-embeddings", "64", "--micro-batch-size", "2", "--global-batch-size",
        "16", "--train-iters", "12", "--lr", "3e-3", "--mock-data", "--tokenizer-type", "NullTokenizer",
        "--vocab-size", "512", "--log-interval", "1", "--eval-iters", "0", "--pipeline-model-parallel-size", "2",
        "--auto-parallel"]


def _cluster_file(tmp_path) -> str:
    from megatron_auto import serde
    from megatron_auto.specs.presets import CLUSTER_PRESETS, mixed_cluster

    cpu = CLUSTER_PRESETS["cpu-gloo"]
    fast = replace(cpu, name="cpu-fast", gpus_per_node=2)
    slow = replace(cpu, name="cpu-slow", gpus_per_node=1, gpu=replace(cpu.gpu, peak_flops=cpu.gpu.peak_flops / 3))
    path = tmp_path / "cpu-mixed.json"
    path.write_text(json.dumps(serde.to_dict(mixed_cluster("cpu-mixed", ((fast, 1), (slow, 2))))))
    return str(path)


def test_a_mixed_cluster_of_unlike_nodes_puts_more_layers_on_the_fast_node_and_trains(tmp_path):
    argv = [*ARGV, "--auto-parallel-cluster", _cluster_file(tmp_path)]
    result = launch(4, argv, timeout_s=300, log_dir=tmp_path / "logs", local_world_size=(2, 1, 1))
    assert result.ok, result.output[-4000:]
    assert "node groups: cpu-fast at node rank 0 (2 GPUs each), cpu-slow at node ranks 1-2 (1 GPU each)" in result.output
    layout = re.search(r"--pipeline-model-parallel-layout (\S+)", result.output)
    first = re.search(r"--decoder-first-pipeline-num-layers (\d+)", result.output)
    assert layout or first, result.output[-4000:]
    fast_stage = sum(chunk_layers_of_layout(layout.group(1), 2, 8)[::2]) if layout else int(first.group(1))
    assert fast_stage > 4  # the fast node's stage (its chunks 0, 2, ...) holds most of the 8 layers
    losses = [float(x) for x in re.findall(r"iteration +\d+/ +12 \|.*\| lm loss: (\S+) \|", result.output)]
    assert len(losses) == 12 and sum(losses[-3:]) / 3 < sum(losses[:3]) / 3
