"""Load a single-process GPTModel's state dict (full tensors) into a hybrid model's parts.

Used to start a hybrid run from the same weights as a stock Megatron run (the
equivalence tests) or from a converted single-GPU model. Tensor-parallel
weights are cut along their partition dimension by the part's own TP rank.
"""
from __future__ import annotations

import torch

from .sharded import copy_into_shard


def _slice_for_rank(full: torch.Tensor, param: torch.nn.Parameter, tp_group, gated: bool) -> torch.Tensor:
    """This TP rank's cut. A gated (SwiGLU) fc1 stacks [gate; up]; each TP rank holds
    [gate shard; up shard] (Megatron-Core's swiglu sharded state dict), so both halves are cut."""
    if not getattr(param, "tensor_model_parallel", False):
        return full
    size, rank = torch.distributed.get_world_size(tp_group), torch.distributed.get_rank(tp_group)
    if gated:
        return torch.cat([half.chunk(size, dim=0)[rank] for half in full.chunk(2, dim=0)], dim=0)
    return full.chunk(size, dim=param.partition_dim)[rank]


def _is_gated_fc1(key: str, param: torch.nn.Parameter, gated_linear_unit: bool) -> bool:
    return gated_linear_unit and ".mlp.linear_fc1." in key and getattr(param, "partition_dim", None) == 0


def _shell_key(name: str, state: dict) -> str:
    """A tied LM head's weight is the word embedding's; an untied head has its own entry."""
    if name == "output_layer.weight" and name not in state:
        return "embedding.word_embeddings.weight"
    return name


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
            named += [(chunk.shell_tp_group, _shell_key(n, state), p) for n, p in chunk.shell.named_parameters()]
        for block, tp_group, first in zip(chunk.segments, chunk.block_tp_groups, firsts):
            named += [(tp_group, _segment_key(n, first), p) for n, p in block.named_parameters()]
        for tp_group, key, param in named:
            if key not in state:
                raise KeyError(f"no '{key}' in the state dict")
            gated = _is_gated_fc1(key, param, chunk.config.gated_linear_unit)
            full = _slice_for_rank(state[key], param, tp_group, gated)
            if getattr(param, "__fsdp_param__", False):
                copy_into_shard(param, full)
            else:
                param.copy_(full.to(param.device, param.dtype))
            copied += 1
    return copied
