"""Reading what a run wrote: every tensor of a checkpoint iteration, and the losses of its log."""
from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import torch


def logged_losses(stdout: str) -> dict[int, set[str]]:
    """Every logged loss per iteration (an iteration run twice, before and after a restart, logs twice)."""
    found: dict[int, set[str]] = {}
    for iteration, loss in re.findall(r" iteration +(\d+)/ .*?\| lm loss: (\S+) \|", stdout):
        found.setdefault(int(iteration), set()).add(loss)
    return found


def _tool():
    spec = importlib.util.spec_from_file_location(
        "check_checkpoint_masters", Path(__file__).resolve().parents[2] / "tools" / "check_checkpoint_masters.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_READER = _tool()


def checkpoint_tensors(iteration_dir: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a checkpoint iteration, read without a process group (as tools/check_checkpoint_masters.py
    reads them)."""
    return _READER.checkpoint_tensors(iteration_dir)
