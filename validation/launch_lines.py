"""Run several tools/pretrain_gpt.py command lines (megatron_auto.train.main) one after another in the same ranks.

Usage (as each rank, under validation/launcher.py): validation/launch_lines.py RUNS.json OUT.json.
RUNS.json is a list of {"name": ..., "argv": [...]} (optionally "timeout_s": a rank still in that line after
so many seconds dumps its stack and exits); each run is framed in the log by `#### launch line NAME start` /
`#### launch line NAME exit CODE (SECONDS s)` (`framed_runs` reads them back), and OUT.json gets {name: code}.
The ranks keep one default process group across the runs (importing torch and megatron-core
once is most of a small run's cost); each run builds and tears down its own Megatron groups.
"""
from __future__ import annotations

import faulthandler
import json
import re
import sys
import time
from pathlib import Path
from typing import NamedTuple, Optional

FRAME = re.compile(r"^#### launch line (\S+) start\n(.*?)(?:^#### launch line \1 exit (\S+)(?: \((\S+) s\))?$|\Z)",
                   re.S | re.M)


class FramedRun(NamedTuple):
    log: str
    """What the rank printed between the run's start and exit lines (to the end of the log when it never exited)."""
    code: Optional[int]
    """The run's exit code; None when the rank never reached the exit line (it crashed, hung or was killed)."""
    seconds: Optional[float]


def framed_runs(log: str) -> dict[str, FramedRun]:
    """{run name: FramedRun} of each run that started in one rank's log, in the order they ran."""
    runs = {}
    for name, body, code, seconds in FRAME.findall(log):
        runs[name] = FramedRun(body, int(code) if code else None, float(seconds) if seconds else None)
    return runs


def exit_code(value) -> int:
    """sys.exit's convention: None is 0, an int is itself, anything else (a message) is 1."""
    return 0 if value is None else value if isinstance(value, int) else 1


def _keep_default_group() -> None:
    """Between runs, destroy the run's groups, Megatron's and ours, and what still holds them (pretrain_gpt's
    shutdown would end the job's group): a gloo group's threads end only when it is freed, so a rank that ran
    dozens of lines otherwise held thousands of threads."""
    from megatron_auto.runtime import distributed

    distributed.shutdown = distributed.destroy_parallel_groups


def main() -> None:
    import torch

    from megatron_auto.train import main as pretrain_gpt_main

    runs = json.loads(Path(sys.argv[1]).read_text())
    _keep_default_group()
    codes = {}
    for run in runs:
        print(f"#### launch line {run['name']} start", flush=True)
        start = time.perf_counter()
        if run.get("timeout_s"):
            faulthandler.dump_traceback_later(run["timeout_s"], exit=True)
        try:
            codes[run["name"]] = exit_code(pretrain_gpt_main(run["argv"]))
        except SystemExit as stop:  # argparse refusals
            codes[run["name"]] = exit_code(stop.code)
        faulthandler.cancel_dump_traceback_later()
        print(f"#### launch line {run['name']} exit {codes[run['name']]} ({time.perf_counter() - start:.2f} s)",
              flush=True)
        sys.stdout.flush()
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    if int(__import__("os").environ.get("RANK", "0")) == 0:
        Path(sys.argv[2]).write_text(json.dumps(codes))


if __name__ == "__main__":
    main()
