"""Version-pinned runtime patches that let megatron-core 0.16.1 train on CPU with gloo.

One patch per module; each states why it exists, which megatron-core versions
it targets and when it can be removed, and offers `check()` (raise
`PatchTargetChanged` when upstream no longer looks as expected), `apply()`
(idempotent) and `is_applied()`. `apply_all()` applies every patch when CUDA is
absent; on a GPU host only those whose row in `registry.PATCHES` (the one table of every patch: its kind,
whether it applies on CUDA, the versions it targets, when it can go) says so: the fixes of faults that bite
on GPUs too, and the torch fallbacks where apex or Transformer Engine does not import (`applies_on_cuda()`).

Importing this package imports megatron-core, with torch.compile deferred (see `deferred_compile`).
"""
from __future__ import annotations

import importlib
import logging
from types import ModuleType

from . import registry
from ._source import PatchTargetChanged
from .deferred_compile import import_megatron_core

import_megatron_core()

logger = logging.getLogger(__name__)

PATCH_MODULES = registry.applied_names()
"""The patches apply_all applies, in order (patches/registry.py's table)."""

__all__ = ["PATCH_MODULES", "PatchTargetChanged", "apply_all", "check_all", "patch_modules", "registry"]


def patch_modules() -> list[ModuleType]:
    """The patch modules, in the order they are applied."""
    return [importlib.import_module(f"{__name__}.{name}") for name in PATCH_MODULES]


def check_all() -> None:
    """Raise PatchTargetChanged if any patch no longer fits the installed megatron-core."""
    for patch in patch_modules():
        patch.check()


def needed(patch: ModuleType, on_cuda: bool) -> bool:
    """Whether `patch` applies here: every patch on CPU; on CUDA as its registry row says (`applies_on_cuda()`
    deciding for the rows that leave it to the module)."""
    if not on_cuda:
        return True
    on_cuda_rule = registry.RECORDS[patch.NAME].on_cuda
    if on_cuda_rule == "when-needed":
        return bool(patch.applies_on_cuda())
    return on_cuda_rule == "yes"


def apply_all(force: bool = False) -> list[str]:
    """Apply the patches this host needs (every one when `force`); return the names applied."""
    import torch

    on_cuda = torch.cuda.is_available() and not force
    applied = []
    for patch in patch_modules():
        if needed(patch, on_cuda):
            patch.apply()
            applied.append(patch.NAME)
    logger.debug("applied megatron-core patches (%s): %s", "CUDA host" if on_cuda else "CPU host",
                 ", ".join(applied) or "none")
    return applied
