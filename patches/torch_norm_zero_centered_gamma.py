"""Patch: let `WrappedTorchNorm` (the norm of the local layer spec) build zero-centred-gamma norms.

Why: Megatron-LM's --apply-layernorm-1p sets TransformerConfig.layernorm_zero_centered_gamma:
each norm stores gamma - 1, initialised to zero, and scales by (1 + weight). apex's
FusedLayerNorm and Transformer Engine's norms do this; without them the local spec builds
its norms through `WrappedTorchNorm`, which asserts `not config.layernorm_zero_centered_gamma`.
The patch builds the same torch LayerNorm/RMSNorm, zeroes its weight and gives it a forward that
scales by (1 + weight) (the formula of apex's FusedLayerNorm with zero_centered_gamma).
Targets: megatron-core 0.16.1.
Removable when: megatron-core's WrappedTorchNorm supports zero_centered_gamma itself.
Applied on CPU, and on CUDA hosts without Transformer Engine (applies_on_cuda): the runtime then builds the
local spec, whose norms are WrappedTorchNorm too (all of them without apex, RMSNorm with it:
LocalSpecProvider.layer_norm).
"""
from __future__ import annotations

import importlib

import torch
import torch.nn.functional as F

from ._checks import require_text, require_version
from .torch_norm_sequence_parallel import local_spec_builds_torch_norm

NAME = "torch_norm_zero_centered_gamma"
TARGET_VERSIONS = ("0.16.1",)
MODULE = "megatron.core.transformer.torch_norm"
MARKER = "not config.layernorm_zero_centered_gamma"


class ZeroCenteredLayerNorm(torch.nn.LayerNorm):
    """torch LayerNorm whose weight is gamma - 1."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, self.normalized_shape, self.weight + 1, self.bias, self.eps)


class ZeroCenteredRMSNorm(torch.nn.RMSNorm):
    """torch RMSNorm whose weight is gamma - 1."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, self.normalized_shape, self.weight + 1, self.eps)


_ZERO_CENTERED = {torch.nn.LayerNorm: ZeroCenteredLayerNorm, torch.nn.RMSNorm: ZeroCenteredRMSNorm}


def _zero_centered_new(inner):
    def __new__(cls, config, hidden_size, eps=1e-5, persist_layer_norm=False,
                zero_centered_gamma=False, normalization="LayerNorm"):
        if not config.layernorm_zero_centered_gamma:
            return inner(cls, config, hidden_size, eps, persist_layer_norm, zero_centered_gamma, normalization)
        config.layernorm_zero_centered_gamma = False  # only for the upstream assertion; restored below
        try:
            norm = inner(cls, config, hidden_size, eps, persist_layer_norm, zero_centered_gamma, normalization)
        finally:
            config.layernorm_zero_centered_gamma = True
        norm.__class__ = _ZERO_CENTERED[type(norm)]
        with torch.no_grad():
            norm.weight.zero_()
        return norm

    __new__.__megatron_auto_zero_centered__ = True
    # Keep the sequence-parallel patch's marker visible on the outermost wrapper.
    __new__.__megatron_auto_patched__ = getattr(inner, "__megatron_auto_patched__", False)
    __new__.__wrapped_original__ = inner
    return __new__


def _current_new():
    new = importlib.import_module(MODULE).WrappedTorchNorm.__dict__["__new__"]
    return getattr(new, "__func__", new)


def check():
    require_version(NAME, TARGET_VERSIONS)
    return require_text(MODULE, MARKER, NAME)


def applies_on_cuda() -> bool:
    """Wherever the local spec's norms may be WrappedTorchNorm (as for the sequence-parallel patch)."""
    return local_spec_builds_torch_norm()


def apply() -> None:
    wrapped = check().WrappedTorchNorm
    if is_applied():
        return
    wrapped.__new__ = staticmethod(_zero_centered_new(_current_new()))


def is_applied() -> bool:
    new = _current_new()
    while new is not None:
        if getattr(new, "__megatron_auto_zero_centered__", False):
            return True
        new = getattr(new, "__wrapped_original__", None)
    return False
