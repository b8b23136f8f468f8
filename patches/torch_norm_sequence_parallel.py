"""Patch: let `WrappedTorchNorm` (the norm of the local layer spec) run with sequence parallelism.

Why: without apex the local spec builds its LayerNorm through `WrappedTorchNorm`, and its RMSNorm always
(with apex too: LocalSpecProvider.layer_norm); `WrappedTorchNorm` asserts `not config.sequence_parallel`.
Sequence parallelism only needs the norm's weight and bias gradients to be summed over the tensor-parallel
group, which `finalize_model_grads` already does for parameters marked `sequence_parallel = True` (exactly
what apex's FusedLayerNorm wrapper and Transformer Engine's norms mark). The patch builds the same torch
norm, then marks its parameters.
Targets: megatron-core 0.16.1.
Removable when: megatron-core's WrappedTorchNorm marks its parameters for sequence parallelism itself.
Applied on CPU, and on GPU hosts where Transformer Engine does not import (applies_on_cuda): the runtime
then builds the local spec, whose norms are WrappedTorchNorm (all of them without apex, RMSNorm with it),
and TP > 1 with --sequence-parallel stops at the first norm's assertion without the patch. Nothing in it is
CPU-only.
"""
from __future__ import annotations

import importlib

from ._checks import require_text, require_version

NAME = "torch_norm_sequence_parallel"
TARGET_VERSIONS = ("0.16.1",)
MODULE = "megatron.core.transformer.torch_norm"
MARKER = "assert not config.sequence_parallel"


def _sequence_parallel_new(original_new):
    def __new__(cls, config, hidden_size, eps=1e-5, persist_layer_norm=False,
                zero_centered_gamma=False, normalization="LayerNorm"):
        sequence_parallel = config.sequence_parallel
        config.sequence_parallel = False  # only for the upstream assertion; restored below
        try:
            norm = original_new(cls, config, hidden_size, eps, persist_layer_norm, zero_centered_gamma, normalization)
        finally:
            config.sequence_parallel = sequence_parallel
        for param in norm.parameters():
            param.sequence_parallel = sequence_parallel
        return norm

    __new__.__megatron_auto_patched__ = True
    __new__.__wrapped_original__ = original_new
    return __new__


def local_spec_builds_torch_norm() -> bool:
    """On a GPU host: whether the runtime's layer spec may build WrappedTorchNorm, i.e. whether it runs
    Megatron-Core's local spec (Transformer Engine absent: megatron_auto/runtime/kernels.py), whose RMSNorm is
    always WrappedTorchNorm and whose LayerNorm is where apex is absent."""
    from megatron.core.models.gpt import gpt_layer_specs

    return not gpt_layer_specs.HAVE_TE


def applies_on_cuda() -> bool:
    """Wherever the local spec's norms may be WrappedTorchNorm (local_spec_builds_torch_norm)."""
    return local_spec_builds_torch_norm()


def check():
    require_version(NAME, TARGET_VERSIONS)
    return require_text(MODULE, MARKER, NAME)


def apply() -> None:
    wrapped = check().WrappedTorchNorm
    current = wrapped.__dict__["__new__"]
    current = getattr(current, "__func__", current)
    if getattr(current, "__megatron_auto_patched__", False):
        return
    wrapped.__new__ = staticmethod(_sequence_parallel_new(current))


def is_applied() -> bool:
    new = importlib.import_module(MODULE).WrappedTorchNorm.__dict__["__new__"]
    return getattr(getattr(new, "__func__", new), "__megatron_auto_patched__", False)
