"""The seam between the cost terms and where their numbers come from.

`layer_cost`, `embedding_cost` and `communication` ask `compute_model(cluster)`
and `comm_model(cluster)` for times. Without profiles these are the analytic
models of cost/analytic.py (GEMM-efficiency law, ring formulas); with
`ClusterSpec.measured` set (`--profile FILE`) they are the profiled models of
cost/profiled.py, which fall back to the analytic ones for anything the profiles
do not cover.
"""
from __future__ import annotations

from typing import Protocol

from ..specs.cluster import ClusterSpec
from ..specs.model import LayerSpec
from .analytic import ANALYTIC_COMM, ANALYTIC_COMPUTE, AnalyticComm, AnalyticCompute
from .compute import ComputeTimes
from .flops import Gemm
from .profiled import profiled_comm, profiled_compute

__all__ = ["ANALYTIC_COMM", "ANALYTIC_COMPUTE", "AnalyticComm", "AnalyticCompute", "CommModel", "ComputeModel",
           "comm_model", "compute_model", "core_share", "profiled_cpu_cores", "runtime_overhead"]


class ComputeModel(Protocol):
    """Seconds of computation on one shard."""

    def layer_times(self, layer: LayerSpec, seq: int, samples: int, tp: int, sp: bool,
                    cluster: ClusterSpec, activation_bytes: int, attention_backend: str = "flash") -> ComputeTimes:
        """Forward, backward and attention-core forward of one micro-batch through one layer."""

    def gemm_time(self, gemm: Gemm, cluster: ClusterSpec) -> float:
        """One forward GEMM outside the layers (the LM head)."""

    def optimizer_time(self, state_bytes: float, cluster: ClusterSpec, impl: str = "fused") -> float:
        """One optimizer step over `state_bytes` of model state (`impl`: TrainingSpec.optimizer_impl)."""


class CommModel(Protocol):
    """Seconds of communication for one rank."""

    grad_overlap: float
    """Share of gradient traffic hidden behind the backward that runs beside it (cost.pipeline)."""

    def collective_time(self, op: str, bytes_: float, group_size: int, stride: int,
                        cluster: ClusterSpec) -> float:
        """`op` in all_reduce / all_gather / reduce_scatter over `group_size` ranks `stride` apart;
        `bytes_` is the full (unreduced or gathered) buffer."""

    def p2p_time(self, bytes_: float, inter_node: bool, cluster: ClusterSpec) -> float:
        """One send of `bytes_` from one rank to another."""


def compute_model(cluster: ClusterSpec) -> ComputeModel:
    """The profiled compute model when a model profile is attached, else the analytic one."""
    measured = cluster.measured
    if measured is None or measured.model is None:
        return ANALYTIC_COMPUTE
    return profiled_compute(measured.model)


def comm_model(cluster: ClusterSpec) -> CommModel:
    """The profiled communication model when a cluster profile is attached, else the analytic one."""
    measured = cluster.measured
    if measured is None or measured.cluster is None:
        return ANALYTIC_COMM if cluster.grad_overlap == 1.0 else AnalyticComm(cluster.grad_overlap)
    return profiled_comm(measured.cluster, cluster.grad_overlap)


def core_share(cluster: ClusterSpec) -> float:
    """The share of a core each process had while the layer profile timed it: cores / processes
    when more processes than cores ran at once on a CPU, else 1 (no oversubscription)."""
    cores = profiled_cpu_cores(cluster)
    return 1.0 if cores == 0 else cores / cluster.measured.model.concurrent_processes


def profiled_cpu_cores(cluster: ClusterSpec) -> int:
    """The CPU cores the layer profile's processes shared, when there were fewer cores than
    processes (0 otherwise: no time-slicing to model)."""
    measured = cluster.measured
    profile = None if measured is None else measured.model
    if profile is None or profile.cpu_cores <= 0 or profile.concurrent_processes <= profile.cpu_cores:
        return 0
    return profile.cpu_cores


def runtime_overhead(cluster: ClusterSpec) -> tuple[float, float]:
    """(seconds per iteration, seconds per micro-batch per chunk) of the training runtime's own
    work beyond layers, collectives and optimizer: measured (ClusterProfile) or none."""
    measured = cluster.measured
    if measured is None or measured.cluster is None:
        return 0.0, 0.0
    return measured.cluster.step_overhead_s, measured.cluster.micro_batch_overhead_s
