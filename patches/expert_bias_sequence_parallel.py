"""Patch: an expert's fc2 bias is not summed over the tensor-parallel group.

Why: `RowParallelLinear.__init__` marks its bias `sequence_parallel` whenever the config has sequence
parallelism, experts included. With expert tensor parallel 1 (which Megatron-Core requires for biased
experts) under TP > 1 with sequence parallelism, finalize_model_grads then all-reduces the expert fc2
bias's gradient over the dense TP group, although each TP rank's experts are expert-data-parallel
replicas whose gradients DDP already averages over the expert-DP group (which holds those TP ranks):
that gradient comes out TP times too large. Measured here: the gradient norm of a 4-layer MoE model with
biases at TP2 + SP, ETP1 was 1.35% above one process's (tests/runtime/test_moe_equivalence.py). The
rewrite marks expert biases as not sequence-parallel; dense layers are unchanged.
Targets: megatron-core 0.16.1.
Removable when: RowParallelLinear leaves expert biases out of the sequence-parallel gradient sum.
Applied on every host (its row in patches/registry.py): the gradient is wrong on GPUs too.
"""
from __future__ import annotations

import importlib

from ._checks import require_version
from ._source import Replacement, patched_source, rewrite_function

NAME = "expert_bias_sequence_parallel"
TARGET_VERSIONS = ("0.16.1",)
REPLACEMENTS = (Replacement('setattr(self.bias, "sequence_parallel", self.sequence_parallel)',
                            'setattr(self.bias, "sequence_parallel", self.sequence_parallel and not self.is_expert)'),)


def _row_parallel_linear():
    return importlib.import_module("megatron.core.tensor_parallel.layers").RowParallelLinear


def check() -> None:
    """Raise PatchTargetChanged unless the bias is still marked as expected."""
    require_version(NAME, TARGET_VERSIONS)
    patched_source(_row_parallel_linear(), "__init__", REPLACEMENTS)


def apply() -> None:
    check()
    rewrite_function(_row_parallel_linear(), "__init__", REPLACEMENTS)


def is_applied() -> bool:
    return getattr(_row_parallel_linear().__dict__["__init__"], "__megatron_auto_patched__", False)
