"""Patch: Megatron's fp16 loss scaler keeps its scale tensors on "cuda".

Why: `optimizer/grad_scaler.py` creates the loss scale, the minimum scale and
the growth/backoff factors with `device='cuda'`, and `load_state_dict` moves a
checkpoint's scale with `.cuda(torch.cuda.current_device())`, so `--fp16` (dynamic
or constant loss scaling) fails on a CPU host when the optimizer is built or
resumed. The patch points the module's `torch` at the CPU stand-in
(patches/_cpu_torch.py) and moves the loaded scale with `.to(...)` onto the
device that stand-in names (the CPU).
Targets: megatron-core 0.16.1.
Removable when: the grad scaler allocates on the parameters' device.
Applied only when CUDA is absent (patches.apply_all).
"""
from __future__ import annotations

from . import _cpu_torch
from ._source import Replacement, source_rewrite_patch

NAME = "grad_scaler_cuda"
TARGET_VERSIONS = ("0.16.1",)
MODULE = "megatron.core.optimizer.grad_scaler"
_swap = _cpu_torch.module_swap_patch(NAME, TARGET_VERSIONS, ((MODULE, "device='cuda'"),))
_load = source_rewrite_patch(NAME, TARGET_VERSIONS, MODULE, "DynamicGradScaler", (
    ("load_state_dict", (Replacement(".cuda(torch.cuda.current_device())", ".to(torch.cuda.current_device())"),)),
))


def check() -> None:
    """Raise PatchTargetChanged unless the version and both targets still match."""
    _swap[0]()
    _load[0]()


def apply() -> None:
    _swap[1]()
    _load[1]()


def is_applied() -> bool:
    return _swap[2]() and _load[2]()
