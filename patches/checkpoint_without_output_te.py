"""Patch: CheckpointWithoutOutput takes its fp8 path without Transformer Engine.

Why: `CheckpointWithoutOutput.__init__` sets `self.fp8 = fp8 is not None`, which is True for its
default `fp8=False`, so every forward of the checkpointed function calls Transformer Engine's
`FP8GlobalStateManager`. Without Transformer Engine that name is undefined (tensor_parallel/random.py
imports it only when TE imports), and selective recompute of `layernorm` (transformer_layer.py runs
both norms through CheckpointWithoutOutput) fails with a NameError at the first forward. The rewrite
keeps the flag as it was where TE imports (its fp8 query then answers whether fp8 is on) and clears it
where TE is absent, where no fp8 can run.
Targets: megatron-core 0.16.1.
Removable when: CheckpointWithoutOutput only enters its fp8 path with Transformer Engine present.
Applied on CPU, and on GPU hosts where Transformer Engine does not import (applies_on_cuda).
"""
from __future__ import annotations

import importlib

from ._source import Replacement, source_rewrite_patch

NAME = "checkpoint_without_output_te"
TARGET_VERSIONS = ("0.16.1",)
MODULE = "megatron.core.tensor_parallel.random"
REPLACEMENTS = (Replacement("self.fp8 = fp8 is not None", "self.fp8 = HAVE_TE and fp8 is not None"),)


def applies_on_cuda() -> bool:
    return not importlib.import_module(MODULE).HAVE_TE


check, apply, is_applied = source_rewrite_patch(NAME, TARGET_VERSIONS, MODULE, "CheckpointWithoutOutput",
                                                 (("__init__", REPLACEMENTS),))
