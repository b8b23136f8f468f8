"""Compute time of a layer on one shard: GEMMs at a shape-dependent efficiency,
plus memory-bound element-wise kernels at HBM speed.

The GEMM efficiency law and the element-wise bandwidth live in cost/kernel_rates.py
(re-exported here). Clusters whose ComputeEfficiency is `kernel_level` (H100) price
layers kernel by kernel instead (cost/layer_kernels.py).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..specs.cluster import ClusterSpec
from ..specs.model import LayerSpec
from .flops import CORE, MLA_UP, MLP, layer_gemms
from .kernel_rates import (ELEMENTWISE_BANDWIDTH_FRACTION, elementwise_bandwidth, gemm_compute_time,
                           gemm_efficiency, gemm_time)
from .layer_kernels import HOST_OPS_MLP, HOST_OPS_NORMS, kernel_level_times
from .mla import mla_elementwise_widths

__all__ = ["ELEMENTWISE_BANDWIDTH_FRACTION", "ComputeTimes", "elementwise_elements", "gemm_compute_time",
           "gemm_efficiency", "gemm_time", "layer_compute_times", "mla_up_projection_seconds",
           "module_forward_seconds", "module_forward_shares", "recompute_time"]


def elementwise_elements(layer: LayerSpec, seq: int, samples: int, tp: int, sp: bool) -> float:
    """Elements read plus written by the forward pass's non-GEMM kernels on one shard.

    Per token: two LayerNorms (read+write h each: 4h), two bias-dropout-adds
    (read 2h, write h, 1-byte mask ~ h/2: 7h), the MLP activation (read+write f,
    or read 2f write f for SwiGLU) and the fused scale-mask-softmax-dropout over
    a*s scores (read, write, mask: 2.5as). h-wide work is split by TP only with SP. Multi-latent attention
    adds its query/key assembly and latent norms (cost/mla.py).
    """
    hidden_split = tp if sp else 1
    hidden_terms = 11 * layer.hidden_size / hidden_split
    activation = (3 if layer.swiglu else 2) * layer.dense_ffn_hidden_size / tp
    softmax = 2.5 * layer.num_attention_heads * seq / tp
    return samples * seq * (hidden_terms + activation + softmax + mla_elementwise_widths(layer, tp, sp)[0])


@dataclass(frozen=True)
class ComputeTimes:
    """Seconds of one micro-batch through one layer on one shard."""

    forward_s: float
    backward_s: float
    attention_core_forward_s: float


def layer_compute_times(layer: LayerSpec, seq: int, samples: int, tp: int, sp: bool,
                        cluster: ClusterSpec, activation_bytes: int, attention_backend: str = "flash") -> ComputeTimes:
    """Forward, backward (2x the forward GEMMs: dgrad + wgrad, SC21 Sec. 5.1); kernel by kernel
    (cost/layer_kernels.py) on clusters whose ComputeEfficiency is `kernel_level`."""
    if cluster.compute.kernel_level:
        return ComputeTimes(*kernel_level_times(layer, seq, samples, tp, sp, cluster, activation_bytes,
                                                attention_backend))
    gemms = layer_gemms(layer, seq, samples, tp)
    gemm_seconds = [gemm_time(g, cluster) for g in gemms]
    bandwidth = elementwise_bandwidth(cluster)
    elementwise = elementwise_elements(layer, seq, samples, tp, sp) * activation_bytes / bandwidth
    softmax_share = 2.5 * layer.num_attention_heads * seq / tp
    softmax_seconds = samples * seq * softmax_share * activation_bytes / bandwidth
    forward = sum(gemm_seconds) + elementwise
    core = sum(seconds for seconds, g in zip(gemm_seconds, gemms) if g.role == CORE) + softmax_seconds
    return ComputeTimes(forward_s=forward, backward_s=2.0 * forward, attention_core_forward_s=core)


def module_forward_seconds(layer: LayerSpec, seq: int, samples: int, tp: int, sp: bool, cluster: ClusterSpec,
                           activation_bytes: int) -> tuple[float, float]:
    """(MLP, both norms) forward seconds on one shard, analytic: what selective recompute of Megatron-Core's
    `mlp` and `layernorm` modules re-runs. MLP: fc1 and fc2, the fc1 bias add and the activation (the
    element-wise terms of cost/layer_kernels.elementwise_bytes); norms: read and write h per token each
    (split over TP with SP). Kernel by kernel, each at least its ops x kernel_launch_s."""
    gemms = layer_gemms(layer, seq, samples, tp)
    mlp_gemms = sum(gemm_compute_time(g, cluster) for g in gemms if g.role == MLP)
    f = layer.dense_ffn_hidden_size / tp
    fc1_width = f * (2 if layer.swiglu else 1)
    bias = 1.0 if layer.add_bias_linear else 0.0
    tokens, word = seq * samples, activation_bytes
    bandwidth = elementwise_bandwidth(cluster)
    mlp = mlp_gemms + tokens * word * (2 * bias * fc1_width + (5 if layer.swiglu else 2) * f) / bandwidth
    norms = tokens * word * 4 * layer.hidden_size / (tp if sp else 1) / bandwidth
    if cluster.compute.kernel_level:
        launch = cluster.gpu.kernel_launch_s
        mlp, norms = max(HOST_OPS_MLP * launch, mlp), max(HOST_OPS_NORMS * launch, norms)
    return (mlp if f else 0.0), norms


def mla_up_projection_seconds(layer: LayerSpec, seq: int, samples: int, tp: int, cluster: ClusterSpec,
                              word: int) -> float:
    """Forward seconds on one shard of what --recompute-modules mla_up_proj re-runs (0 for other layers):
    MLASelfAttention's qkv_up_proj_and_rope_apply, i.e. the query and key/value up projections (cost/flops.py
    role MLA_UP) and the query/key concatenations and the value copy (2 a d_q + 2 a d_q + 2 a d_v elements
    per token, at the element-wise bandwidth); RoPE over d_r channels is left out."""
    if layer.mla is None:
        return 0.0
    gemms = sum(gemm_compute_time(g, cluster) for g in layer_gemms(layer, seq, samples, tp) if g.role == MLA_UP)
    heads = layer.num_attention_heads / tp
    copies = heads * (4 * layer.query_head_width + 2 * layer.value_head_width)
    bandwidth = elementwise_bandwidth(cluster)
    return gemms + seq * samples * word * copies / bandwidth


def module_forward_shares(layer: LayerSpec, seq: int, samples: int, tp: int, sp: bool, cluster: ClusterSpec,
                          activation_bytes: int, attention_backend: str) -> tuple[float, float, float]:
    """module_forward_seconds and mla_up_projection_seconds as shares of the analytic layer
    forward, to scale a profiled forward by: (MLP, norms, MLA up projections)."""
    forward = layer_compute_times(layer, seq, samples, tp, sp, cluster, activation_bytes, attention_backend).forward_s
    mlp, norms = module_forward_seconds(layer, seq, samples, tp, sp, cluster, activation_bytes)
    up = mla_up_projection_seconds(layer, seq, samples, tp, cluster, activation_bytes)
    return min(1.0, mlp / forward), min(1.0, norms / forward), min(1.0, up / forward)


def recompute_time(times: ComputeTimes, recompute: str, modules: frozenset = frozenset({"core_attn"}),
                   shares: tuple[float, ...] = (0.0, 0.0, 0.0)) -> float:
    """Extra seconds per micro-batch: a second forward (full), or under selective a second forward of each
    recomputed module (Korthikanti et al. 2022, Sec. 4-5; `modules`: TrainingSpec.selective_modules, `shares`: the
    MLP's, the norms' and MLA's up projections' share of the forward, module_forward_shares)."""
    if recompute == "full":
        return times.forward_s
    if recompute != "selective":
        return 0.0
    seconds = times.attention_core_forward_s if "core_attn" in modules else 0.0
    if "mlp" in modules:
        seconds += shares[0] * times.forward_s
    if "layernorm" in modules:
        seconds += shares[1] * times.forward_s
    if "mla_up_proj" in modules:
        seconds += shares[2] * times.forward_s
    return seconds
