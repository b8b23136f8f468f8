"""Patch: `device="cuda"` hard-coded in schedules, optimizer and clip_grads.

Why: `pipeline_parallel/schedules.py` counts tokens in
`torch.zeros([], device="cuda")`; `optimizer/optimizer.py` keeps `found_inf`,
the loss scale and overflow buffers on "cuda"; `optimizer/clip_grads.py`
builds the grad-norm accumulators on "cuda"; the distributed optimizer gathers
shards onto `torch.cuda.current_device()`; `transformer/utils.py` builds the
default causal attention mask on "cuda". The patch maps those devices to the
CPU inside exactly these modules (patches/_cpu_torch.py). finalize_model_grads
in 0.16.1 has no CUDA device of its own (it allocates like its inputs), so it
needs no change; its helpers in tensor_parallel are covered by cuda_current_device.
Targets: megatron-core 0.16.1.
Removable when: these modules allocate on the parameters' device.
Applied only when CUDA is absent (patches.apply_all).
"""
from __future__ import annotations

from . import _cpu_torch

NAME = "hardcoded_cuda_device"
TARGET_VERSIONS = ("0.16.1",)
TARGETS = (
    ("megatron.core.pipeline_parallel.schedules", 'device="cuda"'),
    ("megatron.core.optimizer.optimizer", "device='cuda'"),
    ("megatron.core.optimizer.clip_grads", "device='cuda'"),
    ("megatron.core.optimizer.distrib_optimizer", "torch.cuda.current_device()"),
    ("megatron.core.transformer.utils", 'device="cuda"'),
)


check, apply, is_applied = _cpu_torch.module_swap_patch(NAME, TARGET_VERSIONS, TARGETS)
