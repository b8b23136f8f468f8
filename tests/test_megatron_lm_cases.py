"""Megatron-LM 0.16.1's own GPT and MoE functional-test training cases, shrunk to 4 CPU ranks
(tests/megatron_lm_cases/cases.json, made by tests/megatron_lm_cases/shrink.py), each run as a dry run of
tools/pretrain_gpt.py as it is and with --auto-parallel: none meets "unrecognized arguments", and each keeps the
verdict recorded beside it (it plans, or it is refused with its one-line reason). The dry runs go in one
process forked from the test launcher's fork server (the run applies its megatron-core patches, which must not
reach the other tests' process; the server has torch and megatron-core imported already).

Record the verdicts again after a deliberate change:
    .venv/bin/python tests/test_megatron_lm_cases.py --record
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import sys
from pathlib import Path

import pytest

from validation.launcher import run_script

CASES_FILE = Path(__file__).with_name("megatron_lm_cases") / "cases.json"
VARIANTS = {"flags": [], "auto": ["--auto-parallel"]}
WORLD = {"WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "4", "RANK": "0"}


def dry_run(argv: list[str]) -> str:
    """'plans', or the run's one error line (argparse's or a refusal's), with the program name left out."""
    from megatron_auto.train import main

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = main([*argv, "--auto-parallel-dry-run"])
        except SystemExit as stop:
            code = stop.code
    if code in (0, None):
        return "plans"
    errors = [line for line in err.getvalue().splitlines() if "error:" in line]
    return errors[-1].split("error:", 1)[1].strip() if errors else f"exit {code}"


def load_cases() -> list[dict]:
    return json.loads(CASES_FILE.read_text())["cases"]


def verdicts_now() -> dict:
    """{case name: {variant: verdict}} from a dry run of every case, in this process."""
    os.environ.update(WORLD)
    return {case["name"]: {variant: dry_run(case["argv"] + extra) for variant, extra in VARIANTS.items()}
            for case in load_cases()}


@pytest.fixture(scope="module")
def measured() -> dict:
    done = run_script([__file__, "--print"], {**os.environ, "PYTHONWARNINGS": "ignore"}, timeout_s=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


@pytest.mark.parametrize("case", load_cases(), ids=lambda case: case["name"])
def test_each_case_keeps_its_verdict_and_no_flag_is_unrecognized(case, measured):
    for variant in VARIANTS:
        verdict = measured[case["name"]][variant]
        assert "unrecognized arguments" not in verdict, (case["source"], verdict)
        assert verdict == case["verdicts"][variant], (case["source"], variant, verdict)


def test_the_corpus_covers_megatron_lms_cases_and_most_plan():
    cases = load_cases()
    verdicts = [verdict for case in cases for verdict in case["verdicts"].values()]
    suites = {case["source"].split("/")[3] for case in cases}  # the mixtral cases need more than 4 ranks
    assert len(cases) >= 100 and suites == {"gpt", "moe"}
    assert verdicts.count("plans") >= 0.8 * len(verdicts)


if __name__ == "__main__":
    if sys.argv[1:] == ["--print"]:
        sys.stdout.write(json.dumps(verdicts_now()))
    elif sys.argv[1:] == ["--record"]:
        data = json.loads(CASES_FILE.read_text())
        now = verdicts_now()
        for case in data["cases"]:
            case["verdicts"] = now[case["name"]]
        CASES_FILE.write_text(json.dumps(data, indent=1) + "\n")
    else:
        sys.stderr.write("usage: tests/test_megatron_lm_cases.py --record | --print\n")
        raise SystemExit(2)
