"""What keeps a destroyed layout's process groups alive, and its forgetting.

A gloo group ends its threads (two workers and a transport loop) only when the group object is freed, not
when torch.distributed.destroy_process_group drops it. Destroying the groups is not enough: megatron-core and
torch keep module-level references and caches that hold a group, or a module or DeviceMesh that holds one,
until the process ends (measured with megatron-core 0.16.1 and torch 2.13 on gloo, a 4-rank process running
22 hybrid plans in turn: 3 threads per group so held, 28 threads after the last plan where 4 remain with
everything below forgotten). `forget_group_references` drops them; destroy_parallel_groups calls it.

A closed model can also outlive its session through its last step's autograd graph: `forget_autograd_graphs`.
"""
from __future__ import annotations

import logging
import sys

import torch

logger = logging.getLogger(__name__)


def forget_group_references() -> None:
    """Drop every reference to the last layout's groups that outlives parallel_state.destroy_model_parallel."""
    _forget_parallel_state_leftovers()
    _forget_rotary_caches()
    _forget_dtensor_caches()


def forget_autograd_graphs(chunks) -> None:
    """Drop the autograd graphs that a closed model's modules, and the helper objects they hold, keep of its last
    step, so that the model and its process groups are freed when the session drops it.

    MoE token dispatchers (plain objects, not modules) keep the last forward's routing probabilities
    (`MoEAlltoAllTokenDispatcher.probs`, megatron-core 0.16.1), whose graph reaches every parameter's gradient
    accumulator, which holds DDP's backward hook, which holds DDP and so the model: a reference cycle through
    C++ objects that the garbage collector cannot see. Each closed MoE layout kept its model and its gloo groups'
    threads (48 per layout per rank, 689 threads per rank after the 14 layouts of a 4-rank test; measured with
    torch 2.13 on gloo). Nothing here is read again: the model is being dropped."""
    for chunk in chunks or ():
        for module in chunk.modules():
            for owner in (module, *(value for value in vars(module).values() if _is_helper(value))):
                for name, value in list(vars(owner).items()):
                    if isinstance(value, torch.Tensor) and value.grad_fn is not None:
                        setattr(owner, name, None)


def _is_helper(value) -> bool:
    """A plain object with attributes (a token dispatcher), not a module, tensor, class or module object."""
    return (hasattr(value, "__dict__") and not isinstance(value, (torch.nn.Module, torch.Tensor, type))
            and type(value).__module__.startswith("megatron."))


def _forget_parallel_state_leftovers() -> None:
    """Groups destroy_model_parallel leaves in parallel_state (megatron-core 0.16.1 never resets e.g.
    `_INTRA_PARTIAL_DATA_PARALLEL_GROUP_WITH_CP`, nor the hybrid-CP groups' dict)."""
    from megatron.core import parallel_state

    world = torch.distributed.group.WORLD if torch.distributed.is_initialized() else None
    for name, value in list(vars(parallel_state).items()):
        if isinstance(value, torch.distributed.ProcessGroup) and value is not world:
            setattr(parallel_state, name, None)
        elif isinstance(value, dict) and any(isinstance(v, torch.distributed.ProcessGroup) for v in value.values()):
            value.clear()


def _forget_rotary_caches() -> None:
    """RoPE's forward is lru_cache'd on `self` (megatron-core's rotary_pos_embedding.py and its YaRN variant):
    the cache keeps up to 32 embedding modules of past models alive, each with its context-parallel group."""
    for module_name, class_name in (("megatron.core.models.common.embeddings.rotary_pos_embedding", "RotaryEmbedding"),
                                    ("megatron.core.models.common.embeddings.yarn_rotary_pos_embedding",
                                     "YarnRotaryEmbedding")):
        owner = getattr(sys.modules.get(module_name), class_name, None)
        _cache_clear(getattr(owner, "forward", None))


def _forget_dtensor_caches() -> None:
    """DTensor's caches keyed on DeviceMeshes (ZeRO-3 layers are DTensors over their DP group's mesh): the
    sharding propagation caches (whose keys compare meshes by rank layout, so a ZeRO-3 layer of the next
    layout over the same ranks got the last layout's destroyed mesh: "Could not resolve the process group
    registered under the name ...", torch 2.13), the mesh topology and redistribution plans, each holding
    a mesh and so its group. Nothing to do unless torch.distributed.tensor was imported."""
    if "torch.distributed.tensor" not in sys.modules:
        return
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.debug import _clear_sharding_prop_cache

    _clear_sharding_prop_cache()  # the Python cache and the C++ dispatch fast path's
    propagator = DTensor._op_dispatcher.sharding_propagator
    _cache_clear(getattr(propagator, "_propagate_tensor_meta_cached", None))
    collective_utils = sys.modules.get("torch.distributed.tensor._collective_utils")
    _cache_clear(getattr(getattr(collective_utils, "MeshTopoInfo", None), "build_from_mesh", None))
    redistribute = sys.modules.get("torch.distributed.tensor._redistribute")
    _cache_clear(getattr(redistribute, "_gen_transform_infos", None))
    clear_planners = getattr(redistribute, "clear_redistribute_planner_cache", None)
    if clear_planners is not None:
        clear_planners()


def _cache_clear(cached) -> None:
    """functools cache's cache_clear, where `cached` is such a cache (torch or megatron-core may change that)."""
    clear = getattr(cached, "cache_clear", None)
    if clear is None:
        logger.debug("no cache to clear on %r", cached)
        return
    clear()
