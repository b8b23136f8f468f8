"""An injected rank failure, for the restart tests (tests/runtime/test_checkpoint_safety.py).

MEGATRON_AUTO_INJECT_KILL=ITERATION:RANK kills that rank with SIGKILL right after it
finishes iteration ITERATION (and the checkpoint save due then), in a job's first attempt
only (torchrun's TORCHELASTIC_RESTART_COUNT 0 or unset), so a job restarted by
`torchrun --max-restarts N` runs through. Unset, nothing happens.
"""
from __future__ import annotations

import os
import signal

import torch

ENV = "MEGATRON_AUTO_INJECT_KILL"


def maybe_kill(iteration: int) -> None:
    spec = os.environ.get(ENV)
    if not spec or os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0":
        return
    at, rank = (int(part) for part in spec.split(":"))
    if iteration == at and torch.distributed.get_rank() == rank:
        os.kill(os.getpid(), signal.SIGKILL)
