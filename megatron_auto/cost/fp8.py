"""FP8 training as Megatron-Core runs it through Transformer Engine: what changes in time and memory.

Under `--fp8-format` the decoder layers' linear layers (QKV, output projection, fc1, fc2) run their
forward, dgrad and wgrad GEMMs in FP8; the attention core, the embedding and the LM head stay in 16 bits
(Transformer Engine's fp8_autocast wraps the transformer block; TE's DotProductAttention runs FP8 only under
its separate fp8_dpa switch, off by default). This module prices the difference to the same layer in BF16:

- GEMMs: FP8 tensor cores run at GpuSpec.fp8_peak_flops (H100 SXM datasheet: 1,979 TFLOP/s dense, twice
  BF16). The shape law of cost/compute.py holds with its half_dim scaled by the peak ratio: each output tile
  pays the same fixed cost (loads, epilogue, wave tail) against half the math, so a dimension must be twice
  as long to amortise it; large GEMMs reach the same `max_fraction` of their own peak.
- Casts (Transformer Engine's quantize kernels): each GEMM input is cast to FP8 with its transpose for
  the backward (read 2 bytes, write 1 + 1), except the QKV and fc1 inputs, which TE's fused
  LayerNormLinear writes in FP8 in place of its 16-bit output (1 + 1 written instead of 2); in the backward
  each GEMM's output gradient is cast the same way. Weights are cast once per iteration, not per
  micro-batch (TE caches the FP8 weight and its transpose from the first micro-batch on).
- Scaling recipes: `delayed` (amax history, scale from the previous step: no extra pass), `tensorwise`
  (current scaling: an amax pass reads each input once more before its cast), `blockwise` (1x128 and
  128x128 scales computed inside the quantize kernel: the delayed cost) and `mxfp8` (Blackwell's
  microscaling: refused where GpuSpec.mxfp8 is False).
- Memory: the linear layers keep their FP8 inputs (1 byte) for the backward in place of the 16-bit ones,
  and TE holds an FP8 copy and transpose of every linear weight (2 bytes a weight); with
  `--fp8-param-gather` the weight itself is FP8 (1 byte, plus its transpose) and the distributed
  optimizer all-gathers 1 byte a weight.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from ..specs.cluster import ClusterSpec, ComputeEfficiency
from ..specs.model import LayerSpec
from ..specs.training import FP8_FORMATS, FP8_RECIPES  # noqa: F401  (the flag choices; re-exported)
from .flops import CORE, Gemm, layer_gemms
from .kernel_rates import elementwise_bandwidth, gemm_compute_time, gemm_efficiency
CAST_BYTES = 4.0
"""Per element of a 16-bit tensor cast to FP8 with its transpose: read 2, write 1 + 1."""
NORM_FUSED_CAST_BYTES = 0.0
"""Per element of a norm output that TE's LayerNormLinear writes in FP8 (1 + 1 bytes) in place of 16 bits
(2 bytes): no extra traffic."""
AMAX_PASS_BYTES = 2.0
"""Current (tensorwise) scaling reads each 16-bit input once more for its amax."""


@dataclass(frozen=True)
class Fp8Delta:
    """Seconds to add to a BF16 layer's forward and backward (negative: FP8 saves them)."""

    forward_s: float
    backward_s: float


def fp8_problem(cluster: ClusterSpec, recipe: str) -> str | None:
    """Why `cluster`'s GPUs cannot run FP8 with `recipe`, or None."""
    gpu = cluster.gpu
    if gpu.fp8_peak_flops <= 0:
        return f"--precision fp8: the {gpu.name} of cluster '{cluster.name}' has no FP8 tensor cores"
    if recipe == "mxfp8" and not gpu.mxfp8:
        return (f"--fp8-recipe mxfp8: the {gpu.name} has no MXFP8 tensor cores (Blackwell and later); "
                "choose delayed, tensorwise or blockwise")
    return None


def fp8_efficiency_model(cluster: ClusterSpec) -> ComputeEfficiency:
    """The GEMM shape law at FP8 rates: half_dim scaled by the FP8/BF16 peak ratio (module docstring)."""
    ratio = cluster.gpu.fp8_peak_flops / cluster.gpu.peak_flops
    return replace(cluster.compute, half_dim=cluster.compute.half_dim * ratio)


def fp8_gemm_time(gemm: Gemm, cluster: ClusterSpec) -> float:
    """GPU seconds of one GEMM on FP8 tensor cores."""
    return gemm.flops / (cluster.gpu.fp8_peak_flops * gemm_efficiency(gemm, fp8_efficiency_model(cluster)))


def linear_gemms(layer: LayerSpec, seq: int, samples: int, tp: int) -> tuple[Gemm, ...]:
    """The layer's GEMMs that FP8 runs: all but the attention core's."""
    return tuple(g for g in layer_gemms(layer, seq, samples, tp) if g.role != CORE)


def cast_bytes(layer: LayerSpec, seq: int, samples: int, tp: int, sp: bool, recipe: str) -> tuple[float, float]:
    """(forward, backward) bytes of the casts to FP8 of one micro-batch on one shard.

    Forward inputs: the QKV and fc1 inputs (norm outputs, h wide, gathered over TP under SP), the
    projection input (a d_v / tp) and the fc2 input (f / tp). Backward: the output gradients of the same
    four GEMMs ((a + 2g) d / tp, h, (2)f / tp, h)."""
    tokens = seq * samples
    h = layer.hidden_size
    norm_inputs = 2 * h if layer.dense_ffn_hidden_size else h
    other_inputs = layer.attention_width / tp + layer.dense_ffn_hidden_size / tp
    qkv_out = (layer.num_attention_heads + 2 * layer.num_query_groups) * layer.kv_channels / tp
    fc1_out = layer.dense_ffn_hidden_size * (2 if layer.swiglu else 1) / tp
    gradients = qkv_out + h + (fc1_out + h if layer.dense_ffn_hidden_size else 0)
    amax = AMAX_PASS_BYTES if recipe == "tensorwise" else 0.0
    forward = norm_inputs * (NORM_FUSED_CAST_BYTES + amax) + other_inputs * (CAST_BYTES + amax)
    backward = gradients * (CAST_BYTES + amax)
    return tokens * forward, tokens * backward


def fp8_layer_delta(layer: LayerSpec, seq: int, samples: int, tp: int, sp: bool, cluster: ClusterSpec,
                    recipe: str) -> Fp8Delta:
    """FP8 minus BF16 seconds of one micro-batch through one layer on one shard: the linear GEMMs at FP8
    rates (backward: dgrad + wgrad, twice the forward, SC21 Sec. 5.1) plus the casts at the element-wise
    bandwidth (cost/kernel_rates.py)."""
    gemms = linear_gemms(layer, seq, samples, tp)
    saved = sum(gemm_compute_time(g, cluster) - fp8_gemm_time(g, cluster) for g in gemms)
    bandwidth = elementwise_bandwidth(cluster)
    forward_bytes, backward_bytes = cast_bytes(layer, seq, samples, tp, sp, recipe)
    return Fp8Delta(forward_s=forward_bytes / bandwidth - saved, backward_s=backward_bytes / bandwidth - 2 * saved)


def weight_cast_seconds(linear_params: float, tp: int, cluster: ClusterSpec) -> float:
    """Once per iteration: each linear weight shard cast to FP8 with its transpose."""
    bandwidth = elementwise_bandwidth(cluster)
    return linear_params / tp * CAST_BYTES / bandwidth


def fp8_weight_copy_bytes(linear_params: float, tp: int, param_gather: bool) -> float:
    """TE's FP8 copy and transpose of the linear weights beside their 16-bit weights (2 bytes a weight); with
    --fp8-param-gather the weight itself is FP8, and it with its transpose (1 + 1) takes the 2 bytes that
    TrainingSpec.param_bytes counts: nothing more."""
    return 0.0 if param_gather else 2.0 * linear_params / tp


def fp8_saved_input_savings(layer: LayerSpec, seq: int, samples: int, tp: int, sp: bool,
                            norms_kept: bool, mlp_inner_kept: bool, core_keeps_output: bool = False) -> float:
    """Bytes of saved activations FP8 removes per micro-batch on one shard: the linear layers keep FP8 (1 byte)
    copies of their inputs in place of 16-bit ones (2 bytes): the two norm outputs (when kept; split over TP
    under SP), the projection input and the fc2 input (when the MLP's inner activations are kept). A flash
    core keeps its 16-bit output for its own backward (FlashAttention-2's rowsum(dO * O)), so there the
    projection's FP8 copy is kept beside it: one byte more, not one less (`core_keeps_output`)."""
    tokens = seq * samples
    norms = (2 * layer.hidden_size / (tp if sp else 1)) if norms_kept else 0.0
    projection = (-1 if core_keeps_output else 1) * layer.attention_width / tp
    fc2 = layer.dense_ffn_hidden_size / tp if mlp_inner_kept else 0.0
    return tokens * (norms + projection + fc2)
