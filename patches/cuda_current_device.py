"""Patch: `torch.cuda.current_device()` as a buffer device, answered with the CPU.

Why: tensor-parallel mappings and layers, pipeline p2p, the global memory
buffer, GPTModel, attention, rotary embeddings (RoPE's and YaRN's) and multi-token prediction allocate their scratch
buffers with `device=torch.cuda.current_device()`, which raises on a CPU-only
torch. The patch swaps the `torch` name inside exactly these modules for a
proxy (patches/_cpu_torch.py) whose `cuda.current_device()` is the CPU.
Targets: megatron-core 0.16.1.
Removable when: megatron-core allocates on the device of its inputs (or on a
configurable device) in these modules.
Applied only when CUDA is absent (patches.apply_all).
"""
from __future__ import annotations

from . import _cpu_torch

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
    # YaRN's table, which multi-latent attention builds in each layer (its inverse frequencies move to the device).
    "megatron.core.models.common.embeddings.yarn_rotary_pos_embedding",
    # The MTP loss tracker (MTPLossLoggingHelper) and the context-parallel token roll of multi-token prediction.
    "megatron.core.transformer.multi_token_prediction",
)


check, apply, is_applied = _cpu_torch.module_swap_patch(
    NAME, TARGET_VERSIONS, tuple((module, MARKER) for module in MODULES))
