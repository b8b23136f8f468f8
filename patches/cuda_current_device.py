"""Patch: `torch.cuda.current_device()` as a buffer device, answered with the CPU.

Why: tensor-parallel mappings and layers, pipeline p2p, the global memory
buffer, GPTModel, attention and rotary embeddings allocate their scratch
buffers with `device=torch.cuda.current_device()`, which raises on a CPU-only
torch. The patch swaps the `torch` name inside exactly these modules for a
proxy (patches/_cpu_torch.py) whose `cuda.current_device()` is the CPU.
Targets: megatron-core 0.16.1.
Removable when: megatron-core allocates on the device of its inputs (or on a
configurable device) in these modules.
Applied only when CUDA is absent (patches.apply_all).
"""
from __future__ import annotations

import importlib

from . import _cpu_torch
from ._checks import require_text, require_version

NAME = "cuda_current_device"
TARGET_VERSIONS = ("0.16.1",)
MARKER = "torch.cuda.current_device()"
MODULES = (
    "megatron.core.tensor_parallel.mappings",
    "megatron.core.tensor_parallel.layers",
    "megatron.core.tensor_parallel.utils",
    "megatron.core.tensor_parallel.data",
    "megatron.core.pipeline_parallel.p2p_communication",
    "megatron.core.utils",
    "megatron.core.models.gpt.gpt_model",
    "megatron.core.transformer.attention",
    "megatron.core.transformer.dot_product_attention",
    "megatron.core.transformer.transformer_layer",
    "megatron.core.models.common.embeddings.rotary_pos_embedding",
)


def check() -> list:
    """Raise PatchTargetChanged unless every target module still uses the CUDA device call."""
    require_version(NAME, TARGET_VERSIONS)
    return [require_text(name, MARKER, NAME) for name in MODULES]


def apply() -> None:
    for module in check():
        _cpu_torch.install(module)


def is_applied() -> bool:
    return all(_cpu_torch.is_installed(importlib.import_module(name)) for name in MODULES)
