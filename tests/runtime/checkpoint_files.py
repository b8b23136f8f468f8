"""Reading what a run wrote: every tensor of a checkpoint iteration, and the losses of its log."""
from __future__ import annotations

import re
from pathlib import Path

import torch

from validation import check_checkpoint_masters


def logged_losses(stdout: str) -> dict[int, set[str]]:
    """Every logged loss per iteration (an iteration run twice, before and after a restart, logs twice)."""
    found: dict[int, set[str]] = {}
    for iteration, loss in re.findall(r" iteration +(\d+)/ .*?\| lm loss: (\S+) \|", stdout):
        found.setdefault(int(iteration), set()).add(loss)
    return found


def checkpoint_tensors(iteration_dir: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a checkpoint iteration, read without a process group (as
    validation/check_checkpoint_masters.py reads them)."""
    return check_checkpoint_masters.checkpoint_tensors(iteration_dir)
