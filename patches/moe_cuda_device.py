"""Patch: CUDA streams and devices in megatron-core's MoE layer (router, experts, dispatchers, aux-loss tracker).

Why: `MoEAlltoAllTokenDispatcher.__init__` creates a `torch.cuda.Stream()` for its device-to-host
copies and waits on it with `torch.cuda.current_stream()` / `torch.cuda.stream(...)`; the router
and experts move weights and build scratch tensors on `torch.cuda.current_device()`;
`track_moe_metrics` builds its tracker with `device="cuda"`; `SharedExpertMLP` makes a stream for
its overlap. All raise on a CPU-only torch. The patch swaps the `torch` name inside exactly these
modules for the CPU stand-in (patches/_cpu_torch.py): streams and events that never wait, buffers
on the CPU.
Targets: megatron-core 0.16.1.
Removable when: megatron-core's MoE layer takes its device from its inputs and skips streams off-GPU.
Applied only when CUDA is absent (patches.apply_all).
"""
from __future__ import annotations

from . import _cpu_torch

NAME = "moe_cuda_device"
TARGET_VERSIONS = ("0.16.1",)
TARGETS = (
    ("megatron.core.transformer.moe.token_dispatcher", "torch.cuda.Stream()"),
    ("megatron.core.transformer.moe.router", "device=torch.cuda.current_device()"),
    ("megatron.core.transformer.moe.experts", "device=torch.cuda.current_device()"),
    ("megatron.core.transformer.moe.moe_utils", 'device="cuda"'),
    ("megatron.core.transformer.moe.shared_experts", "torch.cuda.Stream()"),
)


check, apply, is_applied = _cpu_torch.module_swap_patch(NAME, TARGET_VERSIONS, TARGETS)
