"""Patch: an expert MLP's bias added out of place.

Why: `MLP.forward`, run as an expert with biases (SequentialMLP, --moe-router-topk probabilities
as `per_token_scale`), adds its fc2 bias with `output += ...`. With expert tensor parallel 1 the
fc2 output is the input that `_ReduceFromModelParallelRegion` returned unchanged, and autograd
refuses an in-place change of a custom Function's view (RuntimeError in every forward of a MoE
model without --disable-bias-linear). The rewrite adds the same product out of place; the values
are identical.
Targets: megatron-core 0.16.1.
Removable when: MLP.forward adds the expert bias out of place.
Applied on every host (its row in patches/registry.py): the error is autograd's, not the device's.
"""
from __future__ import annotations

import importlib

from ._checks import require_version
from ._source import Replacement, has_replacements, patched_source, rewrite_function

NAME = "expert_bias_inplace"
TARGET_VERSIONS = ("0.16.1",)
REPLACEMENTS = (Replacement("output += output_bias.unsqueeze(0) * per_token_scale.unsqueeze(-1)",
                            "output = output + output_bias.unsqueeze(0) * per_token_scale.unsqueeze(-1)"),)


def _mlp():
    return importlib.import_module("megatron.core.transformer.mlp").MLP


def check() -> None:
    """Raise PatchTargetChanged unless the in-place add still reads as expected."""
    require_version(NAME, TARGET_VERSIONS)
    patched_source(_mlp(), "forward", REPLACEMENTS)


def apply() -> None:
    check()
    rewrite_function(_mlp(), "forward", REPLACEMENTS)


def is_applied() -> bool:
    return has_replacements(_mlp(), "forward", REPLACEMENTS)
