"""Patch: the alltoall dispatcher's split sizes stay tensors when the tokens are on the CPU.

Why: `MoEAlltoAllTokenDispatcher` turns its per-rank split counts into numpy arrays with
`moe_utils.maybe_move_tensor_to_cpu(..., as_numpy=True)`, which converts only CUDA tensors;
on the CPU the counts stay tensors, and `torch.distributed.all_to_all_single` refuses tensor
split sizes (TypeError). It would also call `record_stream` on them (CUDA only). The rewrite
converts CPU tensors too when `as_numpy` asks for it, and records streams of CUDA tensors only;
for CUDA tensors nothing changes.
Targets: megatron-core 0.16.1.
Removable when: maybe_move_tensor_to_cpu converts CPU tensors to numpy as well.
Applied only when CUDA is absent (patches.apply_all).
"""
from __future__ import annotations

import importlib

from ._checks import require_version
from ._source import Replacement, patched_source, rewrite_function

NAME = "moe_split_sizes_cpu"
TARGET_VERSIONS = ("0.16.1",)
FUNCTION = "maybe_move_tensor_to_cpu"
REPLACEMENTS = (
    Replacement("if torch.is_tensor(tensor) and tensor.is_cuda:",
                "if torch.is_tensor(tensor) and (tensor.is_cuda or as_numpy):"),
    Replacement("if record_stream:", "if record_stream and tensor.is_cuda:"),
)


def _modules():
    """(moe_utils, token_dispatcher): the owner and the module that imported it by name."""
    return (importlib.import_module("megatron.core.transformer.moe.moe_utils"),
            importlib.import_module("megatron.core.transformer.moe.token_dispatcher"))


def check() -> None:
    """Raise PatchTargetChanged unless both lines still read as expected."""
    require_version(NAME, TARGET_VERSIONS)
    patched_source(_modules()[0], FUNCTION, REPLACEMENTS)


def apply() -> None:
    check()
    moe_utils, dispatcher = _modules()
    rewrite_function(moe_utils, FUNCTION, REPLACEMENTS, rebind=(dispatcher,))


def is_applied() -> bool:
    moe_utils, dispatcher = _modules()
    return all(getattr(getattr(module, FUNCTION), "__megatron_auto_patched__", False)
               for module in (moe_utils, dispatcher))
