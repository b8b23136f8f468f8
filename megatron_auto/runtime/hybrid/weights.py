"""Load a single-process GPTModel's state dict (full tensors) into a hybrid model's parts.

Used to start a hybrid run from the same weights as a stock Megatron run (the
equivalence tests) or from a converted single-GPU model. Tensor-parallel
weights are cut along their partition dimension by the part's own TP rank.
"""
from __future__ import annotations

import torch

from .sharded import copy_into_shard


def _slice_for_rank(full: torch.Tensor, param: torch.nn.Parameter, tp_group) -> torch.Tensor:
    if not getattr(param, "tensor_model_parallel", False):
        return full
    size, rank = torch.distributed.get_world_size(tp_group), torch.distributed.get_rank(tp_group)
    return full.chunk(size, dim=param.partition_dim)[rank]


def _shell_key(name: str) -> str:
    return "embedding.word_embeddings.weight" if name == "output_layer.weight" else name


def _segment_key(name: str, first: int) -> str:
    if name.startswith("layers."):
        _, index, rest = name.split(".", 2)
        return f"decoder.layers.{first + int(index)}.{rest}"
    return f"decoder.{name}"


@torch.no_grad()
def load_full_state(chunks, state: dict[str, torch.Tensor], segment_firsts: list[list[int]]) -> int:
    """Copy `state` (GPTModel names, unsharded) into every part; returns the tensors copied."""
    copied = 0
    for chunk, firsts in zip(chunks, segment_firsts):
        named = []
        if chunk.shell is not None:
            named += [(chunk.shell_tp_group, _shell_key(n), p) for n, p in chunk.shell.named_parameters()]
        for block, tp_group, first in zip(chunk.segments, chunk.block_tp_groups, firsts):
            named += [(tp_group, _segment_key(n, first), p) for n, p in block.named_parameters()]
        for tp_group, key, param in named:
            if key not in state:
                raise KeyError(f"no '{key}' in the state dict")
            full = _slice_for_rank(state[key], param, tp_group)
            if getattr(param, "__fsdp_param__", False):
                copy_into_shard(param, full)
            else:
                param.copy_(full.to(param.device, param.dtype))
            copied += 1
    return copied
