"""validation/gpu_session.sh: valid bash, one line and exit 2 for an unknown step, and every flag it passes
is one that the tool it calls accepts (it runs only on the lent GPU machine, so this is its check here)."""
from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from validation.launcher import run_script

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "validation" / "gpu_session.sh"


def test_script_parses_and_refuses_an_unknown_step(tmp_path):
    assert subprocess.run(["bash", "-n", str(SCRIPT)]).returncode == 0
    done = subprocess.run(["bash", str(SCRIPT), "bogus"], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1 and "bogus" in done.stderr
    assert not any(tmp_path.iterdir()), "nothing is written before the step is known"


def _tool_calls() -> dict[str, set[str]]:
    """{tool: flags passed to it} from the script's `python3 tools/X.py ...` and `python3 -m validation.X ...`
    lines (with continuations); a tool is its path or its module."""
    text = SCRIPT.read_text().replace("\\\n", " ")
    for name, value in re.findall(r'^([A-Z_]+)="([^"]*)"', text, flags=re.M):  # the script's flag lists
        text = text.replace(f"${name}", " ".join(value.split()))
    calls: dict[str, set[str]] = {}
    for tool, rest in re.findall(r"python3 (tools/\w+\.py|-m validation\.\w+)([^\n]*)", text):
        tool = tool.removeprefix("-m ")
        calls.setdefault(tool, set()).update(re.findall(r"(--[a-z][a-z0-9-]*)", rest))
    return calls


def test_every_flag_the_script_passes_is_accepted():
    calls = _tool_calls()
    assert set(calls) == {"validation.bench_gpu_vs_torch", "validation.profile_gpu_step",
                          "validation.validate_cost_model", "tools/pretrain_gpt.py", "validation.measure_host_floor",
                          "validation.check_layer_memory", "validation.check_checkpoint_masters", "validation.gemm_rates"}
    for tool, flags in calls.items():
        command = [tool] if tool.endswith(".py") else ["-m", tool]
        done = run_script([*command, "--help"], dict(os.environ), timeout_s=120)  # forked: torch imported once
        assert done.returncode == 0, done.stderr[-2000:]
        missing = {flag for flag in flags if not re.search(rf"{flag}\b", done.stdout)}
        assert not missing, f"{tool} does not take {missing}"
