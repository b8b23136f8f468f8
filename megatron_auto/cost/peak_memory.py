"""One GPU's memory peak over an iteration, and what the device must hold beyond it.

The allocated peak is the largest of three moments, not the sum of every term
(docs/cost_model.md, "Memory"):

- backward: states, the activations of every micro-batch in flight, one layer's
  transient (its recomputed activations and the attention's backward working set)
  and, with tied weights on one stage, the output layer's weight gradient waiting
  for the embedding's;
- loss: states, the activations in flight and the cross entropy's logits;
- optimizer step: states and the optimizer's temporaries (activations are freed).

Each moment also holds the persistent workspaces and the framework's tensors. On
top of the allocated peak the device holds the caching allocator's reserve, the CUDA
context with the cuBLAS workspace, and one buffer set per NCCL communicator
(measured: data/reference/h100/README.md).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from ..plan import LayerStrategy, MemoryBreakdown
from ..specs.cluster import ClusterSpec
from ..specs.training import GIB, TrainingSpec


@dataclass(frozen=True)
class StageMemory:
    """The allocated bytes of one pipeline stage's GPU, by term."""

    states: float
    """Weights, gradients and optimizer states."""
    activations: float
    """Activations of every micro-batch in flight at the stage's first backward."""
    layer_transient: float
    """The largest one layer adds while it runs its backward (recompute, attention's working set, ZeRO-3)."""
    workspace: float
    """Buffers kept for the whole run (the unfused attention's scores buffer)."""
    logits: float
    """While the loss runs (last stage): the kept fp32 softmax and the logits beside it."""
    waiting_grad: float
    """Backward: a tied output-layer weight gradient waiting for the embedding's."""
    optimizer_temporaries: float
    """The optimizer step's temporaries (torch's foreach Adam)."""
    framework: float
    """ClusterSpec.framework_overhead_bytes."""

    def moments(self) -> dict[str, float]:
        """Allocated bytes at each candidate peak."""
        resident = self.states + self.workspace + self.framework
        return {"backward": resident + self.activations + self.layer_transient + self.waiting_grad,
                "loss": resident + self.activations + self.logits,
                "optimizer step": resident + self.optimizer_temporaries}

    @property
    def peak_bytes(self) -> float:
        return max(self.moments().values())

    @property
    def peak_moment(self) -> str:
        moments = self.moments()
        return max(moments, key=moments.__getitem__)


def communicator_count(strategies: Iterable[LayerStrategy], pipeline_parallel: int, tied_embedding: bool) -> int:
    """NCCL communicators one rank creates: the data-parallel one every run has (the measured
    one-rank run), one per distinct TP degree and per distinct (TP, DP) layout with more than one
    rank, the pipeline's and, with tied weights over stages, the embedding group's."""
    strategies = set(strategies)
    tp_groups = {s.tp for s in strategies if s.tp > 1}
    dp_groups = {(s.tp, s.dp) for s in strategies if s.dp > 1}
    pipeline = (1 + int(tied_embedding)) if pipeline_parallel > 1 else 0
    return max(1, len(dp_groups)) + len(tp_groups) + pipeline


def device_overhead_bytes(cluster: ClusterSpec, communicators: int) -> float:
    """Device memory outside the caching allocator: CUDA context, cuBLAS workspace, NCCL."""
    return cluster.cuda_context_bytes + communicators * cluster.nccl_communicator_bytes


def reserved_bytes(allocated: float, cluster: ClusterSpec) -> float:
    """What the caching allocator reserves for an allocated peak (torch.cuda.max_memory_reserved)."""
    return allocated * (1.0 + cluster.allocator_reserve_fraction)


def device_bytes(allocated: float, cluster: ClusterSpec, communicators: int) -> float:
    """Device memory a run needs at its allocated peak: that peak plus everything outside the allocator.

    The allocator's reserve above the peak (reserved_bytes) is not needed: when a cudaMalloc fails, PyTorch's
    caching allocator frees its cached blocks and tries again before it raises out-of-memory
    (c10/cuda/CUDACachingAllocator.cpp, release_cached_blocks on the malloc retry path), so a run near the
    capacity trains with a smaller reserve than one with room to spare; what fragmentation it cannot
    return is the margin's to cover (docs/cost_model.md, "Memory margin")."""
    return allocated + device_overhead_bytes(cluster, communicators)


def device_budget_bytes(cluster: ClusterSpec, training: TrainingSpec) -> float:
    """The device memory a plan may use: the budget (default: the usable capacity) less the margin."""
    margin = training.margin_for(cluster.memory_margin)
    return training.budget_for(cluster.gpu.capacity_bytes) * (1.0 - margin)


def allocated_limit_bytes(cluster: ClusterSpec, training: TrainingSpec, communicators: int) -> float:
    """The largest allocated peak that fits: device_bytes(x) <= device_budget_bytes, solved for x."""
    return device_budget_bytes(cluster, training) - device_overhead_bytes(cluster, communicators)


def memory_breakdown(terms: StageMemory, cluster: ClusterSpec, communicators: int) -> MemoryBreakdown:
    """The peak stage's memory by term, in GiB, with the moment that sets its peak (each term
    counts at its own moment only: cost.peak_memory.StageMemory.moments)."""
    allocated = terms.peak_bytes
    return MemoryBreakdown(
        peak_moment=terms.peak_moment, states_gib=terms.states / GIB,
        activations_gib=terms.activations / GIB,
        layer_transient_gib=(terms.layer_transient + terms.waiting_grad) / GIB,
        logits_gib=terms.logits / GIB,
        optimizer_temporaries_gib=terms.optimizer_temporaries / GIB,
        workspace_gib=terms.workspace / GIB, framework_gib=terms.framework / GIB,
        allocator_reserve_gib=(reserved_bytes(allocated, cluster) - allocated) / GIB,
        cuda_context_gib=cluster.cuda_context_bytes / GIB,
        nccl_gib=(device_overhead_bytes(cluster, communicators) - cluster.cuda_context_bytes) / GIB,
        nccl_communicators=communicators,
    )
