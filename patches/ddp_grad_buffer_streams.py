"""Patch: CUDA streams, synchronize and device buffers in the DDP grad buffer.

Why: `param_and_grad_buffer.py` allocates the contiguous param/grad buffers with
`device=torch.cuda.current_device()` and brackets its bucket communication with
`torch.cuda.stream(...)`, `default_stream().wait_stream(...)`;
`distributed_data_parallel.py` creates `torch.cuda.Stream`s and calls
`torch.cuda.synchronize()`. On CPU, gloo collectives are already ordered with
compute, so streams become no-ops and buffers live on the CPU.
Targets: megatron-core 0.16.1.
Removable when: megatron-core's DDP takes the buffer device from the parameters and skips streams off-GPU.
Applied only when CUDA is absent (patches.apply_all).
"""
from __future__ import annotations

from . import _cpu_torch

NAME = "ddp_grad_buffer_streams"
TARGET_VERSIONS = ("0.16.1",)
TARGETS = (
    ("megatron.core.distributed.param_and_grad_buffer", "torch.cuda.default_stream()"),
    ("megatron.core.distributed.param_and_grad_buffer", "device=torch.cuda.current_device()"),
    ("megatron.core.distributed.distributed_data_parallel", "torch.cuda.synchronize()"),
    ("megatron.core.distributed.distributed_data_parallel", "torch.cuda.Stream("),
)


check, apply, is_applied = _cpu_torch.module_swap_patch(NAME, TARGET_VERSIONS, TARGETS)
