"""Patch: CUDA synchronisation and "cuda" buffers in distributed checkpointing.

Why: the torch_dist save path calls `torch.cuda.synchronize()` before copying
tensors to host memory (strategies/filesystem_async.py, async_utils.py,
fully_parallel.py, tensor_aware_state_dict.py) and verifies results in tensors
on `device='cuda'` / `torch.cuda.current_device()` (state_dict_saver.py,
async_utils.py). On CPU there is nothing to synchronise and the small
verification tensors live on the CPU (gloo reduces CPU tensors).
Targets: megatron-core 0.16.1.
Removable when: dist_checkpointing takes its device from the process group backend.
Applied only when CUDA is absent (patches.apply_all).
"""
from __future__ import annotations

from . import _cpu_torch

NAME = "dist_checkpointing_cuda"
TARGET_VERSIONS = ("0.16.1",)
_PREFIX = "megatron.core.dist_checkpointing."
TARGETS = (
    (_PREFIX + "strategies.filesystem_async", "torch.cuda.synchronize()"),
    (_PREFIX + "strategies.async_utils", "torch.cuda.synchronize()"),
    (_PREFIX + "strategies.fully_parallel", "torch.cuda.synchronize()"),
    (_PREFIX + "tensor_aware_state_dict", "torch.cuda.synchronize()"),
    (_PREFIX + "strategies.state_dict_saver", "device='cuda'"),
    (_PREFIX + "exchange_utils", 'device="cuda"'),
)


check, apply, is_applied = _cpu_torch.module_swap_patch(NAME, TARGET_VERSIONS, TARGETS)
