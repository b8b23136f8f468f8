"""How fast one GPU runs a kernel: the GEMM efficiency law and the element-wise bandwidth.

The GEMM efficiency law is ours (docs/cost_model.md): each of the three GEMM
dimensions d contributes a factor d / (d + half_dim), so large tiles saturate at
`max_fraction` of peak and sharding a dimension by TP costs efficiency. Its
constants are fitted once per GPU type (validation/calibrate_compute.py).
Memory-bound (element-wise) kernels move their bytes at a fixed share of HBM
bandwidth. Both the analytic layer model (cost/compute.py) and the kernel-level
one (cost/layer_kernels.py) price their kernels with these rates.
"""
from __future__ import annotations

from ..specs.cluster import ClusterSpec, ComputeEfficiency
from .flops import Gemm

ELEMENTWISE_BANDWIDTH_FRACTION = 0.7
"""Share of HBM bandwidth element-wise kernels reach (typical of fused Megatron kernels; STREAM-like
copies reach 80-90%; not refitted on H100)."""


def elementwise_bandwidth(cluster: ClusterSpec) -> float:
    """Bytes/s that memory-bound kernels move on one GPU of `cluster`."""
    return cluster.gpu.memory_bandwidth_bytes_per_s * ELEMENTWISE_BANDWIDTH_FRACTION


def gemm_efficiency(gemm: Gemm, model: ComputeEfficiency) -> float:
    """Fraction of peak FLOP/s a GEMM of this shape reaches."""
    fraction = model.max_fraction
    for dim in (gemm.m, gemm.k, gemm.n):
        fraction *= dim / (dim + model.half_dim)
    return fraction


def gemm_compute_time(gemm: Gemm, cluster: ClusterSpec) -> float:
    """GPU seconds of one GEMM under the efficiency law (inside a layer: no lone-GEMM floor)."""
    return gemm.flops / (cluster.gpu.peak_flops * gemm_efficiency(gemm, cluster.compute))


def gemm_time(gemm: Gemm, cluster: ClusterSpec) -> float:
    """Seconds for one forward GEMM issued on its own (at least ComputeEfficiency.latency_s)."""
    return max(cluster.compute.latency_s, gemm_compute_time(gemm, cluster))
