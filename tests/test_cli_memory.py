"""estimate/plan --json: the kernels priced, the memory breakdown, the reserve and the margin (issue 12)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
H100_RUN = ["--model", "gpt3-1.7b", "--cluster", "dgx-h100-80gb", "--num-nodes", "1", "--gpus-per-node", "1",
            "--global-batch-size", "16", "--tp", "1", "--pp", "1", "--micro-batch-size", "2",
            "--attention-backend", "unfused", "--optimizer-impl", "foreach", "--json"]


def run_cli(*args: str) -> subprocess.CompletedProcess:
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path, "MEGATRON_AUTO_PROGRESS": "0"}
    return subprocess.run([sys.executable, "-m", "megatron_auto", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)


def estimate(*extra: str) -> dict:
    result = run_cli("estimate", *H100_RUN, *extra)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_estimate_json_names_the_kernels_and_the_memory_terms():
    data = estimate()
    assert (data["attention_backend"], data["optimizer_impl"]) == ("unfused", "foreach")
    breakdown = data["memory_breakdown"]
    assert breakdown["peak_moment"] in ("backward", "loss", "optimizer step")
    assert breakdown["states_gib"] > 0 and breakdown["workspace_gib"] > 0 and breakdown["nccl_communicators"] == 1
    # allocated < reserved and allocated < device (the reserve is reported, not required: cost/peak_memory.py),
    # and the reserve is the breakdown's
    assert data["peak_memory_gib"] < data["peak_reserved_gib"]
    outside = breakdown["cuda_context_gib"] + breakdown["nccl_gib"]
    assert data["device_memory_gib"] == pytest.approx(data["peak_memory_gib"] + outside)
    assert data["peak_reserved_gib"] - data["peak_memory_gib"] == pytest.approx(breakdown["allocator_reserve_gib"])


def test_memory_margin_sets_the_budget():
    default, none = estimate(), estimate("--memory-margin", "0")
    assert none["memory_budget_gib"] == pytest.approx(79.18)
    assert default["memory_budget_gib"] == pytest.approx(79.18 * 0.99)
    # A margin that leaves less than the plan's device memory makes it not fit.
    squeeze = 1 - default["device_memory_gib"] / 79.18 + 0.01
    assert not estimate("--memory-margin", f"{squeeze:.4f}")["fits"]


def test_a_margin_out_of_range_is_a_user_error():
    result = run_cli("estimate", *H100_RUN, "--memory-margin", "1.5")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "fraction in [0, 1)" in result.stderr
