"""The planning caps (megatron_auto/limits.py): accepted up to the cap, and below it the search grows
about linearly in the layers. Seconds are not asserted (benchmarks/bench_search.py, --only limits, measures them);
the peak of Python allocations is, since equal runs allocate alike."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from megatron_auto.errors import UserError
from megatron_auto.limits import MAX_GPUS, MAX_LAYERS
from megatron_auto.search.uniform import divisors
from megatron_auto.specs import load_cluster, load_model

REPO = Path(__file__).resolve().parents[1]
PEAK_SEARCH = """
import sys, tracemalloc
from megatron_auto.search import search_plan
from megatron_auto.specs import TrainingSpec, load_cluster
from megatron_auto.specs.model import uniform_model
layers, space = int(sys.argv[1]), sys.argv[2]
model = uniform_model("growth", layers, 1024, 16, 2048, 51200)
tracemalloc.start()
search_plan(model, load_cluster("dgx-a100-80gb", 1), TrainingSpec(512), space)
print(tracemalloc.get_traced_memory()[1])
"""


def peak_search_bytes(layers: int, space: str) -> int:
    """Peak traced bytes of one search (a 1024-wide model on 8 A100s) in a fresh interpreter,
    so that no cache that an earlier test warmed lowers it."""
    done = subprocess.run([sys.executable, "-c", PEAK_SEARCH, str(layers), space], check=True,
                          capture_output=True, text=True, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    return int(done.stdout)


@pytest.mark.parametrize("space", ["megatron", "hybrid"])
def test_search_memory_grows_about_linearly_in_layers(space):
    # 4x the layers: linear growth gives at most 4x the peak (less with fixed costs), quadratic 16x;
    # measured 32 -> 128 layers: megatron 2.6x, hybrid 3.6x; 8x leaves twice that as margin and
    # still catches L^2.
    ratio = peak_search_bytes(128, space) / peak_search_bytes(32, space)
    assert ratio < 8.0, ratio


def test_a_model_at_the_layer_cap_loads_and_one_more_does_not(tmp_path):
    compact = {"hidden_size": 64, "num_attention_heads": 4, "seq_length": 32, "vocab_size": 128}
    at_cap, above = tmp_path / "at.json", tmp_path / "above.json"
    at_cap.write_text(json.dumps({**compact, "num_layers": MAX_LAYERS}))
    above.write_text(json.dumps({**compact, "num_layers": MAX_LAYERS + 1}))
    assert load_model(str(at_cap)).num_layers == MAX_LAYERS
    with pytest.raises(UserError, match=str(MAX_LAYERS)):
        load_model(str(above))


def test_a_cluster_at_the_gpu_cap_loads_and_one_more_node_does_not():
    cluster = load_cluster("dgx-a100-80gb", MAX_GPUS // 8)
    assert cluster.world_size == MAX_GPUS
    with pytest.raises(UserError, match=str(MAX_GPUS)):
        load_cluster("dgx-a100-80gb", MAX_GPUS // 8 + 1)
    with pytest.raises(ValueError, match=str(MAX_GPUS)):
        replace(cluster, gpus_per_node=9)


def test_divisors_agree_with_trial_division():
    for n in range(1, 1500):
        assert divisors(n) == [d for d in range(1, n + 1) if n % d == 0]
    assert divisors(2**24) == [2**k for k in range(25)]
