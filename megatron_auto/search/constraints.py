"""What the user pins down before the search fills in the rest.

The command line's explicit Megatron flags (`--tensor-model-parallel-size` and
friends given beside `--auto-parallel`) become these constraints.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from ..plan import Plan


@dataclass(frozen=True)
class SearchConstraints:
    """Each field left at None is the search's to choose."""

    tp: Optional[int] = None
    """Tensor-parallel degree of every layer."""
    pp: Optional[int] = None
    """Pipeline-parallel degree."""
    dp: Optional[int] = None
    """Data-parallel degree of every layer."""
    micro_batch_size: Optional[int] = None
    """Samples per micro-batch per data-parallel replica."""
    vp: Optional[int] = None
    """Chunks per pipeline stage."""
    sequence_parallel: Optional[bool] = None
    """Force Megatron sequence parallelism on or off."""
    distributed_optimizer: Optional[bool] = None
    """Force Megatron's distributed optimizer (ZeRO-1) on or off."""
    recompute: Optional[str] = None
    """Force one recomputation kind on every layer: none, selective or full."""
    ep: Optional[int] = None
    """Expert-parallel degree of every MoE layer (--expert-model-parallel-size)."""
    etp: Optional[int] = None
    """Expert tensor-parallel degree of every MoE layer (--expert-tensor-parallel-size)."""
    cp: Optional[int] = None
    """Context-parallel degree (--context-parallel-size): each sequence split over this many ranks."""
    fsdp_sharding: Optional[int] = None
    """Megatron-FSDP on every layer at this ZeRO stage, 2 or 3 (--use-megatron-fsdp with
    --data-parallel-sharding-strategy optim_grads or optim_grads_params); None: Megatron's DDP."""


@dataclass(frozen=True)
class SearchResult:
    """The best plan and how the search got there."""

    plan: Plan
    """The fastest plan that fits, with its prediction filled in."""
    search_time_s: float
    """Wall-clock seconds the search took."""
    candidates_evaluated: int
    """Configurations scored by the cost model."""
    pruning: tuple[tuple[str, int], ...] = field(default=())
    """(decision-tree rule, candidates it removed), in the order the rules ran."""
    timings: tuple[tuple[str, float], ...] = field(default=())
    """(phase, wall-clock seconds) of the search; phases may nest (e.g. `megatron space` holds
    `megatron space: recompute full`)."""
