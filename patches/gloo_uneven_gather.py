"""Patch: all-gather and reduce-scatter of uneven pieces over gloo.

Why: with expert and tensor parallelism together (the alltoall dispatcher's TP stage, and the
allgather dispatcher), `tensor_parallel.mappings._gather_along_first_dim` and
`_reduce_scatter_along_first_dim` exchange pieces of different lengths with the list forms of
`torch.distributed.all_gather` / `reduce_scatter`; NCCL takes them, gloo refuses unequal sizes
("invalid tensor size"). Over a gloo group the patch pads every piece to the longest, runs the
equal-size `all_gather_into_tensor` / `reduce_scatter_tensor` megatron-core uses elsewhere, and
drops the padding: the same values in the same order. Equal splits and NCCL groups take the
upstream code unchanged.
Targets: megatron-core 0.16.1.
Removable when: torch's gloo backend accepts uneven all_gather / reduce_scatter lists.
Applied only when CUDA is absent (patches.apply_all).
"""
from __future__ import annotations

import importlib

import torch

from ._checks import require_text, require_version

NAME = "gloo_uneven_gather"
TARGET_VERSIONS = ("0.16.1",)
MODULE = "megatron.core.tensor_parallel.mappings"
MARKERS = ("torch.distributed.all_gather(output_tensor_list, input_, group=group)",
           "torch.distributed.reduce_scatter(output, input_tensor_list, group=group)")
_ORIGINALS: dict = {}


def _on_gloo(group) -> bool:
    return torch.distributed.get_backend(group) == "gloo"


def gather_uneven(input_, group, output_split_sizes=None, use_global_buffer=False):
    """_gather_along_first_dim, with uneven `output_split_sizes` padded to equal pieces over gloo."""
    upstream = _ORIGINALS["_gather_along_first_dim"]
    if output_split_sizes is None or group.size() == 1 or not _on_gloo(group):
        return upstream(input_, group, output_split_sizes, use_global_buffer)
    width, rest = max(output_split_sizes), tuple(input_.shape[1:])
    padded = input_.new_zeros((width,) + rest)
    padded[: input_.shape[0]] = input_
    gathered = input_.new_empty((width * group.size(),) + rest)
    torch.distributed.all_gather_into_tensor(gathered, padded, group=group)
    return torch.cat([gathered[i * width: i * width + size] for i, size in enumerate(output_split_sizes)])


def reduce_scatter_uneven(input_, group, input_split_sizes=None, use_global_buffer=False):
    """_reduce_scatter_along_first_dim, with uneven `input_split_sizes` padded to equal pieces over gloo."""
    upstream = _ORIGINALS["_reduce_scatter_along_first_dim"]
    if input_split_sizes is None or group.size() == 1 or not _on_gloo(group):
        return upstream(input_, group, input_split_sizes, use_global_buffer)
    width, rest = max(input_split_sizes), tuple(input_.shape[1:])
    padded = input_.new_zeros((width * group.size(),) + rest)
    for index, piece in enumerate(torch.split(input_, list(input_split_sizes), dim=0)):
        padded[index * width: index * width + piece.shape[0]] = piece
    output = input_.new_empty((width,) + rest)
    torch.distributed.reduce_scatter_tensor(output, padded.contiguous(), group=group)
    return output[: input_split_sizes[group.rank()]].clone()


_REPLACEMENTS = {"_gather_along_first_dim": gather_uneven, "_reduce_scatter_along_first_dim": reduce_scatter_uneven}


def check() -> None:
    """Raise PatchTargetChanged unless both uneven collectives still read as expected."""
    require_version(NAME, TARGET_VERSIONS)
    for marker in MARKERS:
        require_text(MODULE, marker, NAME)


def apply() -> None:
    check()
    module = importlib.import_module(MODULE)
    for name, replacement in _REPLACEMENTS.items():
        if getattr(module, name) is not replacement:
            _ORIGINALS[name] = getattr(module, name)
            setattr(module, name, replacement)


def is_applied() -> bool:
    module = importlib.import_module(MODULE)
    return all(getattr(module, name) is replacement for name, replacement in _REPLACEMENTS.items())
