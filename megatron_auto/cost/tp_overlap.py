"""Transformer Engine's TP communication overlap (Megatron-LM's --tp-comm-overlap, userbuffers).

With sequence parallelism each column-parallel GEMM waits on an all-gather of its input and each
row-parallel GEMM's output is reduce-scattered. TE splits each such pair into tp chunks and runs them as
a ring: while one chunk's GEMM runs, the next chunk moves over NVLink on the copy engines (Wang et al.,
"Overlap Communication with Dependent Computation via Decomposition in Large Deep Learning Models",
ASPLOS 2023; TE's userbuffers). What stays exposed per layer is the first chunk's transfer, 1/tp of the
traffic, and whatever traffic the GEMMs are too short to cover. The backward overlaps its dgrad GEMMs
with the gathers and reduce-scatters the same way and its wgrad GEMMs with the bulk ones.
"""
from __future__ import annotations

from ..plan import LayerStrategy
from ..specs.cluster import ClusterSpec
from ..specs.model import LayerSpec
from ..specs.training import TrainingSpec
from .fp8 import fp8_gemm_time, linear_gemms
from .kernel_rates import gemm_compute_time


def tp_overlap_applies(strategy: LayerStrategy, training: TrainingSpec) -> bool:
    """--tp-comm-overlap acts on layers with tp > 1 under sequence parallelism (Megatron-LM requires SP)."""
    return training.tp_comm_overlap and strategy.tp > 1 and strategy.sp


def linear_gemm_seconds(layer: LayerSpec, seq: int, samples: int, tp: int, cluster: ClusterSpec,
                        training: TrainingSpec) -> float:
    """Forward plus backward (dgrad + wgrad: 2x, SC21 Sec. 5.1) seconds of the layer's linear GEMMs on one
    shard, in the precision they run in (cost/fp8.py under fp8)."""
    gemm_time = fp8_gemm_time if training.fp8 else gemm_compute_time
    return 3.0 * sum(gemm_time(g, cluster) for g in linear_gemms(layer, seq, samples, tp))


def exposed_tp_seconds(tp_comm_s: float, linear_gemm_s: float, tp: int) -> float:
    """TP traffic left exposed under the overlap: the first of tp chunks, or what the GEMMs cannot cover."""
    return max(tp_comm_s / tp, tp_comm_s - linear_gemm_s)
