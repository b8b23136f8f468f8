"""Patch: Megatron-Core's apex-free multi-tensor fallbacks synchronise the host once per tensor.

Why: without apex or Transformer Engine, `optimizer/clip_grads.py` computes the
gradient norm with `megatron.core.utils.local_multi_tensor_l2_norm`, which turns
the list of per-tensor norms into `torch.tensor(list)`: one device-to-host copy,
hence one stream synchronisation, per gradient tensor, then another for
`float(l2_reduced)`. On one H100 the GPT 1.7B shape spent 77 ms of a 0.99 s
iteration in 311 `cudaStreamSynchronize` calls with the GPU idle between them
(torch.profiler, docs/benchmarks.md "Where the runtime's time goes"). Its
`local_multi_tensor_scale` (gradient clipping, fp32-to-16-bit parameter copies)
launches two kernels per tensor. The patch swaps in equivalents on torch's
foreach kernels that stay on the device: the norm is `torch._foreach_norm`,
stacked and reduced on the device (Megatron's own `.item()` after the all-reduce
remains the one host sync), and the scaled copy is `torch._foreach_mul` then
`torch._foreach_copy_`.
Targets: megatron-core 0.16.1.
Removable when: upstream's fallbacks keep the norm on the device.
Applied where the fallbacks are in use: on CPU always, and on GPUs without apex or
Transformer Engine (`applies_on_cuda`).
"""
from __future__ import annotations

import importlib

import torch

from ._checks import require_version
from ._source import PatchTargetChanged

NAME = "multi_tensor_on_device"
TARGET_VERSIONS = ("0.16.1",)
# (module, attribute holding the implementation, Megatron's fallback it must still be)
_SLOTS = (
    ("megatron.core.optimizer.clip_grads", "l2_norm_impl", "local_multi_tensor_l2_norm"),
    ("megatron.core.optimizer.clip_grads", "multi_tensor_scale_impl", "local_multi_tensor_scale"),
    ("megatron.core.optimizer.optimizer", "multi_tensor_scale_impl", "local_multi_tensor_scale"),
)


def l2_norm_on_device(chunk_size, noop_flag, tensor_lists, per_tensor, *args):
    """Drop-in for amp_C.multi_tensor_l2norm without per-tensor norms: the 2-norm of every
    tensor of `tensor_lists`, as a one-element fp32 tensor on their device."""
    tensors = [tensor for tensor_list in tensor_lists for tensor in tensor_list]
    norms = torch._foreach_norm(tensors)
    return torch.linalg.vector_norm(torch.stack([norm.float() for norm in norms])).reshape(1), None


def scale_on_device(chunk_size, noop_flag, tensor_lists, scale):
    """Drop-in for amp_C.multi_tensor_scale: dst = src * scale for each pair (in place when dst is src)."""
    sources, destinations = tensor_lists
    if not sources:
        return
    if all(src is dst for src, dst in zip(sources, destinations)):
        torch._foreach_mul_(destinations, scale)
        return
    scaled = sources if scale == 1.0 else torch._foreach_mul(sources, scale)
    torch._foreach_copy_(destinations, scaled)


_REPLACEMENTS = {"local_multi_tensor_l2_norm": l2_norm_on_device, "local_multi_tensor_scale": scale_on_device}


def _slots():
    utils = importlib.import_module("megatron.core.utils")
    for module_name, attribute, fallback in _SLOTS:
        yield importlib.import_module(module_name), attribute, getattr(utils, fallback), _REPLACEMENTS[fallback]


def check() -> None:
    """Raise PatchTargetChanged unless each slot holds Megatron's fallback or this patch's function."""
    require_version(NAME, TARGET_VERSIONS)
    for module, attribute, fallback, replacement in _slots():
        current = getattr(module, attribute, None)
        if current is not fallback and current is not replacement:
            raise PatchTargetChanged(f"{NAME}: {module.__name__}.{attribute} is no longer Megatron's fallback")


def applies_on_cuda() -> bool:
    """True when Megatron-Core uses its local fallbacks (neither apex nor Transformer Engine imported)."""
    return all(getattr(module, attribute, None) in (fallback, replacement)
               for module, attribute, fallback, replacement in _slots())


def apply() -> None:
    check()
    for module, attribute, _, replacement in _slots():
        setattr(module, attribute, replacement)


def is_applied() -> bool:
    return all(getattr(module, attribute, None) is replacement for module, attribute, _, replacement in _slots())
