"""Which checkpoints a run keeps: Megatron-LM's --save-retain-interval and its global non-persistent
checkpoints (--non-persistent-save-interval with --non-persistent-ckpt-type global).

- With --save-retain-interval R, each save to --save removes the checkpoint the tracker named before
  it, unless that iteration is a multiple of R (or its directory is a symbolic link): the newest
  checkpoint and every R-th one stay (Megatron-LM's checkpointing.save_checkpoint).
- A non-persistent checkpoint is a full checkpoint written between the persistent ones to its own
  folder (TrainSettings.non_persistent_dir: --non-persistent-global-ckpt-dir, default SAVE/non_persistent),
  which keeps only the newest: before each such save every other iteration there is removed, so a
  complete one stays on disk while the next is written.
- A resume takes the non-persistent checkpoint where it is at least as new as the persistent one
  (runtime.checkpoint.load_checkpoint's `non_persistent`).

Rank 0 removes; a save's first barrier holds the other ranks until it has.
"""
from __future__ import annotations

import logging
import os
import shutil
from typing import Optional

import torch

from .checkpoint import complete_iterations, iteration_dir, iterations_in

logger = logging.getLogger(__name__)


def retire_previous(root: str, previous: Optional[int], saved: int, retain_interval: Optional[int]) -> None:
    """After saving iteration `saved` to `root`: remove iteration `previous` (the tracker's before the save)
    unless it is a multiple of `retain_interval` or a symbolic link. Nothing without a retain interval."""
    if not retain_interval or not previous or previous == saved or previous % retain_interval == 0:
        return
    if torch.distributed.get_rank() != 0:
        return
    path = iteration_dir(root, previous)
    if os.path.islink(path):
        logger.info("--save-retain-interval: kept %s, a symbolic link", path)
        return
    shutil.rmtree(path, ignore_errors=True)
    logger.info("--save-retain-interval %d: removed the checkpoint of iteration %d (%s)", retain_interval,
                previous, path)


def clear_for_non_persistent_save(root: str) -> None:
    """Before a non-persistent save to `root`: remove every iteration there but the newest complete one."""
    if torch.distributed.get_rank() != 0:
        return
    kept = complete_iterations(root)[:1]
    removed = [i for i in iterations_in(root) if i not in kept]
    for iteration in removed:
        shutil.rmtree(iteration_dir(root, iteration), ignore_errors=True)
    if removed:
        logger.info("non-persistent checkpoints: removed iteration(s) %s of %s, kept %s",
                    ", ".join(map(str, removed)), root, kept[0] if kept else "none")
