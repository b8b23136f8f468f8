"""`megatron-auto plan --verbose`: what the decision tree pruned and where the search's time went."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from megatron_auto.search import search_plan
from megatron_auto.specs import TrainingSpec, load_cluster, load_model

REPO = Path(__file__).resolve().parents[1]
ARGS = ["plan", "--model", "tiny-gpt-8l", "--cluster", "cpu-gloo", "--global-batch-size", "16", "--space", "hybrid"]


def _run(*extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "MEGATRON_AUTO_PROGRESS": "0"}
    return subprocess.run([sys.executable, "-m", "megatron_auto", *ARGS, *extra], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)


def test_verbose_logs_pruning_with_reasons_and_timings():
    result = _run("--verbose")
    assert result.returncode == 0, result.stderr
    err = result.stderr
    assert re.search(r"pruned +\d+ by sp-with-tp +\(with TP, SP moves", err)
    assert re.search(r"pruned +\d+ by tp-divides-heads", err)
    assert re.search(r"megatron space: [\d.]+ s over \d+ flag configurations", err)
    assert re.search(r"hybrid space: [\d.]+ s over \d+", err)
    for phase in ("megatron space: recompute full", "megatron space", "hybrid space"):
        assert re.search(rf"time +[\d.]+ s +[\d.]+%  {re.escape(phase)}$", err, re.MULTILINE), phase
    assert result.stdout.startswith("plan (")  # the table still goes to stdout


def test_without_verbose_nothing_is_logged():
    result = _run()
    assert result.returncode == 0, result.stderr
    assert "pruned" not in result.stderr and "time " not in result.stderr


def test_search_result_timings_cover_both_spaces():
    result = search_plan(load_model("tiny-gpt-8l"), load_cluster("cpu-gloo"), TrainingSpec.fp32(16), "hybrid")
    timings = dict(result.timings)
    assert set(timings) >= {"megatron space", "hybrid space", "megatron space: recompute none"}
    assert timings["megatron space"] + timings["hybrid space"] <= result.search_time_s
    assert timings["megatron space: recompute none"] <= timings["megatron space"]
