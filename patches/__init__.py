"""Version-pinned runtime patches that let megatron-core 0.16.1 train on CPU with gloo.

One patch per module; each states why it exists, which megatron-core versions
it targets and when it can be removed, and offers `check()` (raise
`PatchTargetChanged` when upstream no longer looks as expected), `apply()`
(idempotent) and `is_applied()`. `apply_all()` applies every patch when CUDA is
absent; on a GPU host it applies only the patches whose `applies_on_cuda()` says the fault
they fix is there too (a fallback that apex or Transformer Engine would otherwise replace).

Importing this package imports megatron-core, with torch.compile deferred (see `deferred_compile`).
"""
from __future__ import annotations

import importlib
import logging
from types import ModuleType

from ._source import PatchTargetChanged
from .deferred_compile import import_megatron_core

import_megatron_core()

logger = logging.getLogger(__name__)

PATCH_MODULES = (
    "cuda_current_device",
    "cuda_rng_tracker",
    "ddp_grad_buffer_streams",
    "hardcoded_cuda_device",
    "clip_grads_type_dispatch",
    "torch_norm_sequence_parallel",
    "torch_norm_zero_centered_gamma",
    "embedding_weight_sync",
    "vpp_batched_p2p_guard",
    "dist_checkpointing_cuda",
    "distrib_optimizer_gather",
    "fully_reshardable_bucket_offsets",
    "distrib_optimizer_torch_adam_step",
    "grad_scaler_cuda",
    "multi_tensor_on_device",
    "wgrad_accumulation_torch",
    "moe_cuda_device",
    "moe_split_sizes_cpu",
    "moe_router_gemm_without_te",
    "expert_bias_inplace",
    "glu_offset_copy",
    "expert_bias_sequence_parallel",
    "gloo_uneven_gather",
    "moe_aux_loss_avg_gloo",
    "moe_per_token_aux_loss_tp",
    "checkpoint_without_output_te",
    "rope_cp_rank_cpu",
    "mla_without_te",
    "mla_tensor_parallel",
    "mla_latent_norm_grads",
    "mtp_tied_output_weight",
)

__all__ = ["PATCH_MODULES", "PatchTargetChanged", "apply_all", "check_all", "patch_modules"]


def patch_modules() -> list[ModuleType]:
    """The patch modules, in the order they are applied."""
    return [importlib.import_module(f"{__name__}.{name}") for name in PATCH_MODULES]


def check_all() -> None:
    """Raise PatchTargetChanged if any patch no longer fits the installed megatron-core."""
    for patch in patch_modules():
        patch.check()


def needed(patch: ModuleType, on_cuda: bool) -> bool:
    """Whether `patch` applies here: every patch on CPU; on CUDA those whose `applies_on_cuda()` holds."""
    if not on_cuda:
        return True
    applies_on_cuda = getattr(patch, "applies_on_cuda", None)
    return bool(applies_on_cuda and applies_on_cuda())


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
