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
    """The fc1 of a gated MLP: the dense one, a shared expert's or a routed expert's."""
    return (gated_linear_unit and ".mlp." in key and ".linear_fc1." in key
            and getattr(param, "partition_dim", None) == 0)


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


def _segment_params(block, tp_group, first: int):
    """(TP group to cut by, single-process key, param) of a segment's parameters. A MoE layer's routed
    experts are this EP rank's (local expert j is the model's expert local_expert_indices[j]) and are
    cut by their expert-TP group."""
    experts = {}
    for name, module in block.named_modules():
        if hasattr(module, "local_expert_indices") and hasattr(module, "experts"):
            experts[f"{name}.experts.local_experts."] = (module.local_expert_indices, module.experts.tp_group)
    for name, param in block.named_parameters():
        prefix = next((p for p in experts if name.startswith(p)), None)
        if prefix is None:
            yield tp_group, _segment_key(name, first), param
            continue
        indices, expert_tp_group = experts[prefix]
        local, rest = name[len(prefix):].split(".", 1)
        yield expert_tp_group, _segment_key(f"{prefix}{indices[int(local)]}.{rest}", first), param


@torch.no_grad()
def load_full_state(chunks, state: dict[str, torch.Tensor], segment_firsts: list[list[int]]) -> int:
    """Copy `state` (GPTModel names, unsharded) into every part; returns the tensors copied."""
    copied = 0
    for chunk, firsts in zip(chunks, segment_firsts):
        named = []
        if chunk.shell is not None:
            named += [(chunk.shell_tp_group, _shell_key(n, state), p) for n, p in chunk.shell.named_parameters()]
        for block, tp_group, first in zip(chunk.segments, chunk.block_tp_groups, firsts):
            named += list(_segment_params(block, tp_group, first))
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
