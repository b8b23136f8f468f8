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

import importlib

from . import _cpu_torch
from ._checks import require_text, require_version

NAME = "ddp_grad_buffer_streams"
TARGET_VERSIONS = ("0.16.1",)
TARGETS = (
    ("megatron.core.distributed.param_and_grad_buffer", "torch.cuda.default_stream()"),
    ("megatron.core.distributed.param_and_grad_buffer", "device=torch.cuda.current_device()"),
    ("megatron.core.distributed.distributed_data_parallel", "torch.cuda.synchronize()"),
    ("megatron.core.distributed.distributed_data_parallel", "torch.cuda.Stream("),
)


def check() -> list:
    require_version(NAME, TARGET_VERSIONS)
    return [require_text(module, text, NAME) for module, text in TARGETS]


def apply() -> None:
    for module in check():
        _cpu_torch.install(module)


def is_applied() -> bool:
    return all(_cpu_torch.is_installed(importlib.import_module(m)) for m, _ in TARGETS)
