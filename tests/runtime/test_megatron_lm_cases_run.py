"""Issue 40: a few of Megatron-LM's own functional-test cases (tests/megatron_lm_cases/cases.json, shrunk to 4 CPU
ranks) run end to end, as they are and with --auto-parallel, and train with their loss falling.

The dry runs of every case are tests/test_megatron_lm_cases.py; these run a GPT case with a pipeline of 4 and
interleaving, a MoE case with expert parallelism and the distributed optimizer, and a LLaMA-style case (RoPE,
SwiGLU, RMSNorm, GQA, bf16) for 12 iterations instead of their 4, all in one launch (validation/launch_lines.py).
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from validation.launch_lines import framed_runs
from validation.launcher import launch

CASES_FILE = Path(__file__).resolve().parents[1] / "megatron_lm_cases" / "cases.json"
NAMES = ("gpt3_7b_tp1_pp4_memory_speed", "gpt3_moe_mcore_te_ep8_resume_torch_dist_dist_optimizer",
         "gpt3_mcore_reruns_disable")
STEPS = 12
ITERATIONS = ["--train-iters", str(STEPS), "--eval-interval", str(STEPS), "--log-interval", "1"]
VARIANTS = {"flags": [], "auto": ["--auto-parallel"]}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    """{(case, variant): (exit code, the last rank's log of that run)}."""
    tmp = tmp_path_factory.mktemp("megatron_lm_cases")
    cases = {case["name"]: case["argv"] for case in json.loads(CASES_FILE.read_text())["cases"]}
    plan = [{"name": f"{name}:{variant}", "argv": [*cases[name], *ITERATIONS, *extra]}
            for name in NAMES for variant, extra in VARIANTS.items()]
    (tmp / "runs.json").write_text(json.dumps(plan))
    result = launch(4, ["validation/launch_lines.py", str(tmp / "runs.json"), str(tmp / "codes.json")],
                    timeout_s=900, log_dir=tmp / "logs")
    assert result.ok, result.output[-8000:]
    codes = json.loads((tmp / "codes.json").read_text())
    logs = framed_runs((tmp / "logs" / "rank3.log").read_text())
    return {tuple(name.split(":")): (codes[name], logs[name].log if name in logs else "") for name in codes}


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("name", NAMES)
def test_the_case_trains_and_its_loss_falls(runs, name, variant):
    code, log = runs[(name, variant)]
    assert code == 0, log[-4000:]
    losses = [float(x) for x in re.findall(rf" iteration +\d+/ +{STEPS} \|.*\| lm loss: (\S+) \|", log)]
    assert len(losses) == STEPS, log[-3000:]
    assert sum(losses[-4:]) / 4 < sum(losses[:3]) / 3, losses
