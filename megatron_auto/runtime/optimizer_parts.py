"""The optimizers a Megatron optimizer steps: which kind they are, and which steps the experts (MoE under
expert parallelism)."""
from __future__ import annotations

from .saved_layout import DISTRIBUTED, FP32, MIXED_PRECISION


def inner_optimizers(optimizer) -> list:
    """The optimizers a (possibly chained) Megatron optimizer steps."""
    return list(getattr(optimizer, "chained_optimizers", [optimizer]))


def steps_experts(inner_optimizer) -> bool:
    """Whether one of get_megatron_optimizer's optimizers is its experts' one: all its params are expert
    parameters (`allreduce` False, Megatron's expert-parallel marker: set only at expert parallel > 1)."""
    params = [p for group in inner_optimizer.param_groups for p in group["params"]]
    return bool(params) and all(not getattr(p, "allreduce", True) for p in params)


def is_distributed(inner) -> bool:
    """Whether one of the optimizers a Megatron optimizer steps is its distributed optimizer (ZeRO-1)."""
    return hasattr(inner, "load_parameter_state_from_fully_reshardable")


def optimizer_kind(optimizer) -> str:
    """Which of Megatron's optimizers steps this run, as saved_layout names them by the state they write."""
    inner = inner_optimizers(optimizer)[0]
    if is_distributed(inner):
        return DISTRIBUTED
    return MIXED_PRECISION if hasattr(inner, "float16_groups") else FP32


def has_expert_optimizer(optimizer) -> bool:
    """Whether the experts have an optimizer of their own (expert parallel > 1 somewhere on this rank)."""
    return any(steps_experts(inner) for inner in inner_optimizers(optimizer))
