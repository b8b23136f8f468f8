"""Patch: parameter-type dispatch on `type() == 'torch.cuda.FloatTensor'`.

Why: `clip_grad_by_total_norm_fp32` asserts every grad is a
`torch.cuda.FloatTensor`, and the optimizers sort parameters into fp32 and
16-bit groups by comparing `param.type()` with the CUDA type strings, raising
`TypeError` for CPU tensors (`torch.FloatTensor`). The patch rewrites just those
comparisons (patches/_source.py) to accept the CPU spelling as well.
Targets: megatron-core 0.16.1.
Removable when: megatron-core dispatches on `param.dtype` instead of the legacy type strings.
Applied only when CUDA is absent (patches.apply_all).
"""
from __future__ import annotations

import importlib

from ._checks import require_version
from ._source import Replacement, patched_source, rewrite_function

NAME = "clip_grads_type_dispatch"
TARGET_VERSIONS = ("0.16.1",)

_FP32_GRAD = Replacement("param.grad.type() == 'torch.cuda.FloatTensor'",
                         "param.grad.type() in ('torch.cuda.FloatTensor', 'torch.FloatTensor')")
_FP32_MODEL = Replacement("model_param.type() == 'torch.cuda.FloatTensor'",
                          "model_param.type() in ('torch.cuda.FloatTensor', 'torch.FloatTensor')")
_FP32_PARAM = Replacement("param.type() == 'torch.cuda.FloatTensor'",
                          "param.type() in ('torch.cuda.FloatTensor', 'torch.FloatTensor')")
_HALF = "['torch.cuda.HalfTensor', 'torch.cuda.BFloat16Tensor']"
_HALF_ANY = "['torch.cuda.HalfTensor', 'torch.cuda.BFloat16Tensor', 'torch.HalfTensor', 'torch.BFloat16Tensor']"


def _targets():
    """(owner, function name, replacements, modules that imported it by name)."""
    clip_grads = importlib.import_module("megatron.core.optimizer.clip_grads")
    optimizer = importlib.import_module("megatron.core.optimizer.optimizer")
    distrib = importlib.import_module("megatron.core.optimizer.distrib_optimizer")
    half = Replacement(_HALF, _HALF_ANY)
    return (
        (clip_grads, "clip_grad_by_total_norm_fp32", (_FP32_GRAD,), (optimizer,)),
        (distrib.DistributedOptimizer, "_build_model_and_main_param_groups", (half, _FP32_MODEL), ()),
        (distrib.DistributedOptimizer, "__init__", (half,), ()),
        (optimizer.Float16OptimizerWithFloat16Params, "__init__", (half, _FP32_PARAM), ()),
    )


def check() -> None:
    """Raise PatchTargetChanged unless every comparison still occurs exactly as expected."""
    require_version(NAME, TARGET_VERSIONS)
    for owner, name, replacements, _ in _targets():
        patched_source(owner, name, replacements)


def apply() -> None:
    check()
    for owner, name, replacements, rebind in _targets():
        rewrite_function(owner, name, replacements, rebind)


def is_applied() -> bool:
    def patched(owner, name):
        raw = owner.__dict__[name]
        return getattr(getattr(raw, "__func__", raw), "__megatron_auto_patched__", False)

    return all(patched(owner, name) for owner, name, _, _ in _targets())
