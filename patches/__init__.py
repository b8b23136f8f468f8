"""Version-pinned runtime patches that let megatron-core 0.16.1 train on CPU with gloo.

One patch per module; each states why it exists, which megatron-core versions
it targets and when it can be removed, and offers `check()` (raise
`PatchTargetChanged` when upstream no longer looks as expected), `apply()`
(idempotent) and `is_applied()`. `apply_all()` applies every patch, and only
when CUDA is absent: on a GPU host it changes nothing.
"""
from __future__ import annotations

import importlib
import logging
from types import ModuleType

from ._source import PatchTargetChanged

logger = logging.getLogger(__name__)

PATCH_MODULES = (
    "cuda_current_device",
    "cuda_rng_tracker",
    "ddp_grad_buffer_streams",
    "hardcoded_cuda_device",
    "clip_grads_type_dispatch",
    "torch_norm_sequence_parallel",
    "embedding_weight_sync",
    "vpp_batched_p2p_guard",
    "dist_checkpointing_cuda",
    "distrib_optimizer_gather",
    "distrib_optimizer_torch_adam_step",
    "grad_scaler_cuda",
)

__all__ = ["PATCH_MODULES", "PatchTargetChanged", "apply_all", "check_all", "patch_modules"]


def patch_modules() -> list[ModuleType]:
    """The patch modules, in the order they are applied."""
    return [importlib.import_module(f"{__name__}.{name}") for name in PATCH_MODULES]


def check_all() -> None:
    """Raise PatchTargetChanged if any patch no longer fits the installed megatron-core."""
    for patch in patch_modules():
        patch.check()


def apply_all(force: bool = False) -> list[str]:
    """Apply every patch when CUDA is absent (or when `force`); return the names applied."""
    import torch

    if torch.cuda.is_available() and not force:
        logger.debug("CUDA is available: megatron-core runs unpatched")
        return []
    applied = []
    for patch in patch_modules():
        patch.apply()
        applied.append(patch.NAME)
    logger.debug("applied megatron-core CPU patches: %s", ", ".join(applied))
    return applied
