"""Issue 37, item 2: TP communication overlap (--tp-comm-overlap, Transformer Engine's userbuffers) as a choice of
the search: `plan --tp-comm-overlap search` weighs the run with it and without it, and keeps the faster plan with
the flags that run it."""
from __future__ import annotations

import json

import pytest

from megatron_auto.cli.main import main

JOB = ["--model", "llama3-70b", "--cluster", "dgx-h100-80gb", "--num-nodes", "8", "--global-batch-size", "128"]


def _plan(capsys, overlap: str) -> dict:
    assert main(["plan", *JOB, "--tp-comm-overlap", overlap, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_the_search_keeps_the_faster_of_the_runs_with_and_without_the_overlap(capsys):
    off, on, chosen = (_plan(capsys, overlap) for overlap in ("off", "on", "search"))
    assert chosen["iteration_time_s"] == min(off["iteration_time_s"], on["iteration_time_s"])
    assert on["iteration_time_s"] < off["iteration_time_s"]  # TP 8 over NVLink: hiding its traffic pays here
    assert "--tp-comm-overlap" in chosen["megatron_flags"] and "--tp-comm-overlap" not in off["megatron_flags"]
    assert chosen["megatron_flags"] == on["megatron_flags"]


def test_the_bare_flag_still_means_on(capsys):
    assert main(["plan", *JOB, "--tp-comm-overlap", "--json"]) == 0
    assert "--tp-comm-overlap" in json.loads(capsys.readouterr().out)["megatron_flags"]


def test_estimate_takes_no_search_in_one_line(capsys):
    argv = ["estimate", *JOB, "--tp", "8", "--pp", "1", "--tp-comm-overlap", "search"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "plan's choice" in err and "\n" not in err


@pytest.mark.parametrize("overlap", ["off", "search"])
def test_without_a_gain_the_search_keeps_the_plan_without_the_flag(capsys, overlap):
    """Llama 3 8B on one node plans at tp 1 either way: the overlap has nothing to hide, so no flag is added."""
    assert main(["plan", "--model", "llama3-8b", "--cluster", "dgx-h100-80gb", "--num-nodes", "1",
                 "--global-batch-size", "64", "--tp-comm-overlap", overlap, "--json"]) == 0
    flags = json.loads(capsys.readouterr().out)["megatron_flags"]
    assert "--tp-comm-overlap" not in flags and flags[flags.index("--tensor-model-parallel-size") + 1] == "1"
