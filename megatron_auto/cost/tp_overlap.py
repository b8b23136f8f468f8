"""Transformer Engine's TP communication overlap (Megatron-LM's --tp-comm-overlap, userbuffers).

With sequence parallelism each column-parallel GEMM waits on an all-gather of its input and each
row-parallel GEMM's output is reduce-scattered. TE splits each such pair into tp chunks and runs them as
a ring: while one chunk's GEMM runs, the next chunk moves over NVLink on the copy engines (Wang et al.,
"Overlap Communication with Dependent Computation via Decomposition in Large Deep Learning Models",
ASPLOS 2023; TE's userbuffers). What stays exposed per layer is the first chunk's transfer, 1/tp of the
traffic, and whatever traffic the GEMMs are too short to cover. The backward overlaps its dgrad GEMMs
with the gathers and reduce-scatters the same way and its wgrad GEMMs with the bulk ones.

What the overlap does to the GEMMs beside it (overlap_gemm_seconds), from TE's default userbuffer
configuration (transformer_engine/pytorch/module/base.py, initialize_ub: get_default_config):
- the SMs the communication takes: the reduce-scatters beside the output projection's and fc2's forward
  ("pipeline") and the bulk transfers beside the QKV's and fc1's dgrad and wgrad ("bulk") run on 16 SMs
  each, reserved from the GEMM (set_sm_margin), while the ring exchanges take 1 SM and no margin. Those
  six GEMMs run on S - 16 of the GPU's S SMs;
- the pieces the GEMMs run in: a ring exchange (the QKV's and fc1's forward, the projection's and fc2's
  dgrad) multiplies each arriving sequence shard as it comes, tp GEMMs of 1/tp of the rows (num_splits =
  tp_size), and a pipeline reduce-scatter four GEMMs of a quarter of the rows (num_splits 4), each piece
  priced under the GEMM law at its own shape; bulk overlaps run the GEMM whole.
"""
from __future__ import annotations

from dataclasses import replace

from ..plan import LayerStrategy
from ..specs.cluster import ClusterSpec
from ..specs.model import LayerSpec
from ..specs.training import TrainingSpec
from .flops import MLP, input_projection_gemms
from .fp8 import fp8_gemm_time, linear_gemms
from .kernel_rates import gemm_compute_time

USERBUFFER_SMS = 16
"""SMs of a pipeline or bulk userbuffer overlap in TE's default configuration (num_sm, set_sm_margin)."""
PIPELINE_SPLITS = 4
"""Pieces of a pipeline reduce-scatter overlap's GEMM in TE's default configuration (num_splits)."""


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


def overlap_gemm_seconds(layer: LayerSpec, seq: int, samples: int, tp: int, cluster: ClusterSpec,
                         training: TrainingSpec) -> tuple[float, float]:
    """(forward, backward) seconds the overlap adds to one shard's linear GEMMs (module docstring): the row-parallel
    GEMMs' forward (output reduce-scattered, n = h) in PIPELINE_SPLITS pieces on S - 16 SMs, the h-wide input
    GEMMs' forward (QKV and fc1, input gathered) in tp pieces, their dgrad and wgrad whole on S - 16 SMs, and the
    row-parallel GEMMs' dgrad (output gradient gathered) in tp pieces. The SM margin is left out where the GPU's
    SM count is not known."""
    gemm_time = fp8_gemm_time if training.fp8 else gemm_compute_time
    gemms = linear_gemms(layer, seq, samples, tp)
    mlp = [g for g in gemms if g.role == MLP]  # fc1, fc2 (layer_gemms' order), or none
    projection = [g for g in gemms if g.role != MLP][-1]  # the attention's output projection comes last
    inputs = [g for g in input_projection_gemms(layer, samples * seq, tp) if g.k == layer.hidden_size] + mlp[:1]
    row_parallel = [projection] + mlp[1:]
    sms = cluster.gpu.sm_count
    stretch = sms / (sms - USERBUFFER_SMS) if sms > USERBUFFER_SMS else 1.0

    def whole(gemm) -> float:
        return gemm_time(gemm, cluster)

    def split(gemm, count: int) -> float:
        """Seconds of `gemm` run as `count` GEMMs of 1/count of its rows."""
        return count * whole(replace(gemm, m=max(1, gemm.m // count)))

    forward = (sum(stretch * split(g, PIPELINE_SPLITS) - whole(g) for g in row_parallel)
               + sum(split(g, tp) - whole(g) for g in inputs))
    backward = (sum(2 * (stretch - 1.0) * whole(g) for g in inputs)
                + sum(split(g, tp) - whole(g) for g in row_parallel))
    return forward, backward
