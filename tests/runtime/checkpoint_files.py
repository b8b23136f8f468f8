"""Reading what a run wrote: every tensor of a checkpoint iteration, and the losses of its log."""
from __future__ import annotations

import re
from pathlib import Path

import torch


def logged_losses(stdout: str) -> dict[int, set[str]]:
    """Every logged loss per iteration (an iteration run twice, before and after a restart, logs twice)."""
    found: dict[int, set[str]] = {}
    for iteration, loss in re.findall(r" iteration +(\d+)/ .*?\| lm loss: (\S+) \|", stdout):
        found.setdefault(int(iteration), set()).add(loss)
    return found


def checkpoint_tensors(iteration_dir: Path, tmp_path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a checkpoint iteration, read back without a process group."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    target = tmp_path / f"{iteration_dir.parent.name}_{iteration_dir.name}.pt"
    dcp_to_torch_save(str(iteration_dir), str(target))

    def flat(tree, prefix=""):
        for key, value in tree.items():
            if isinstance(value, dict):
                yield from flat(value, f"{prefix}{key}.")
            elif torch.is_tensor(value):
                yield f"{prefix}{key}", value
    return dict(flat(torch.load(target, weights_only=False)))
