"""Run several tools/pretrain_gpt.py command lines (megatron_auto.train.main) one after another in the same ranks.

Usage (as each rank, under tests/runtime/launcher.py): launch_lines_worker.py RUNS.json OUT.json.
RUNS.json is a list of {"name": ..., "argv": [...]}; each run is framed in the log by
`#### launch line NAME start` / `#### launch line NAME exit CODE`, and OUT.json gets {name: code}.
The ranks keep one default process group across the runs (importing torch and megatron-core
once is most of a small run's cost); each run builds and tears down its own Megatron groups.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path


def _keep_default_group() -> None:
    """Between runs, destroy only Megatron's groups (pretrain_gpt's shutdown would end the job's group)."""
    from megatron.core import parallel_state
    from megatron_auto.runtime import distributed

    def shutdown() -> None:
        if parallel_state.model_parallel_is_initialized():
            parallel_state.destroy_model_parallel()

    distributed.shutdown = shutdown


def main() -> None:
    import torch

    from megatron_auto.train import main as pretrain_gpt_main

    runs = json.loads(Path(sys.argv[1]).read_text())
    _keep_default_group()
    codes = {}
    for run in runs:
        print(f"#### launch line {run['name']} start", flush=True)
        try:
            codes[run["name"]] = pretrain_gpt_main(run["argv"])
        except SystemExit as stop:  # argparse refusals
            codes[run["name"]] = stop.code
        print(f"#### launch line {run['name']} exit {codes[run['name']]}", flush=True)
        sys.stdout.flush()
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    if int(__import__("os").environ.get("RANK", "0")) == 0:
        Path(sys.argv[2]).write_text(json.dumps(codes))


if __name__ == "__main__":
    main()
