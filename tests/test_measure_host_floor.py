"""validation/measure_host_floor.py end to end on CPU (--tiny) and its case parsing."""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import pytest

from validation import measure_host_floor as host_floor
from validation.launcher import run_script

ROOT = Path(__file__).resolve().parents[1]


def test_cases_parse_and_bad_ones_are_named():
    assert host_floor.parse_case("llama:flash:full") == host_floor.Case("llama", "flash", "full")
    assert len(host_floor.ALL_CASES) == 18
    for bad in ("llama:flash", "bert:flash:none", "gpt:sdpa:none", "gpt:flash:block"):
        with pytest.raises(argparse.ArgumentTypeError, match="STRUCTURE:BACKEND:RECOMPUTE"):
            host_floor.parse_case(bad)


def test_llama_structure_is_what_megatron_lms_llama_flags_build():
    layer = host_floor.model_spec("llama", 2, host_floor.GPU_SHAPE).layers[0]
    assert (layer.swiglu, layer.normalization, layer.add_bias_linear) == (True, "RMSNorm", False)
    assert (layer.num_query_groups, layer.ffn_hidden_size) == (6, 6144)


def test_tiny_run_builds_each_structure_in_the_runtime(tmp_path):
    out = tmp_path / "host_floor.json"
    done = run_script(["-m", "validation.measure_host_floor", "--tiny", "--cases", "gpt:flash:none",
                       "llama:unfused:full", "moe:flash:none", "--warmup", "1", "--iters", "1", "--out", str(out)],
                      {"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}, timeout_s=300)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert [r["case"] for r in rows] == ["gpt:flash:none", "llama:unfused:full", "moe:flash:none"]
    for row in rows:
        # The runtime's decoder layer has the parameters the structure's spec counts (RMSNorm, no biases,
        # SwiGLU and GQA for llama): the flags reached the session that was timed.
        assert row["layer_parameters"] == row["spec_layer_parameters"], row
        assert all(math.isfinite(row[k]) for k in ("layer_pass_s", "rest_of_iteration_s", "priced_layer_pass_s"))
    gpt, llama, moe = (r["spec_layer_parameters"] for r in rows)
    assert len({gpt, llama, moe}) == 3  # the MoE case's 16 experts are in its timed layer
    assert "| gpt | flash | none |" in done.stdout and "| llama | unfused | full |" in done.stdout
