"""The analytic compute and communication models: what cost/models.py hands out without profiles,
and what the profiled models of cost/profiled.py fall back to for anything their profiles miss.
"""
from __future__ import annotations

from ..specs.cluster import ClusterSpec
from . import collectives
from .compute import ComputeTimes, gemm_time, layer_compute_times
from .flops import Gemm
from .kernel_rates import elementwise_bandwidth
from .layer_kernels import optimizer_step_bytes


class AnalyticCompute:
    """GEMM-efficiency law plus element-wise kernels at memory bandwidth (cost/compute.py)."""

    def layer_times(self, layer, seq, samples, tp, sp, cluster, activation_bytes,
                    attention_backend: str = "flash") -> ComputeTimes:
        return layer_compute_times(layer, seq, samples, tp, sp, cluster, activation_bytes, attention_backend)

    def gemm_time(self, gemm: Gemm, cluster: ClusterSpec) -> float:
        return gemm_time(gemm, cluster)

    def optimizer_time(self, state_bytes: float, cluster: ClusterSpec, impl: str = "fused") -> float:
        """Adam is memory-bound: it reads and writes every byte of model state once (x2); kernel by
        kernel (H100), the passes of the implementation that runs (cost/layer_kernels.py)."""
        if cluster.compute.kernel_level:
            return optimizer_step_bytes(state_bytes, impl) / elementwise_bandwidth(cluster)
        return 2.0 * state_bytes / cluster.gpu.memory_bandwidth_bytes_per_s


_RING = {"all_reduce": collectives.all_reduce_time, "all_gather": collectives.all_gather_time,
         "reduce_scatter": collectives.reduce_scatter_time}


class AnalyticComm:
    """Ring formulas over the slowest link tier the group crosses (cost/collectives.py)."""

    def __init__(self, grad_overlap: float = 1.0) -> None:
        self.grad_overlap = grad_overlap
        """From ClusterSpec.grad_overlap: what the runtime's DDP hides behind the backward."""

    def collective_time(self, op, bytes_, group_size, stride, cluster) -> float:
        return _RING[op](bytes_, group_size, cluster.ring_link_for_group(group_size, stride))

    def p2p_time(self, bytes_, inter_node, cluster) -> float:
        link = cluster.inter_node if inter_node else cluster.intra_node
        return collectives.p2p_time(bytes_, link)


ANALYTIC_COMPUTE = AnalyticCompute()
ANALYTIC_COMM = AnalyticComm()
