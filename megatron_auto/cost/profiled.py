"""Compute and communication models that read measured profiles.

Lookups (docs/cost_model.md, "Profiled cost model"):

- a collective uses the curve of the same op, tier (intra/inter node) and group
  size, the nearest stride first; with no curve of that group size, the nearest
  group size's curve scaled by the ring volume factor ((n-1)/n) / ((n0-1)/n0)
  (hardware.md's ring volumes); with no curve of that op and tier, the
  analytic ring formula. Times between sizes: `loglog_interpolate` over the
  curve's least-squares non-decreasing fit (`monotone_fit`: timing noise must not
  make a larger message cheaper than a smaller one).
- a layer uses the points of the same shape, TP degree and sequence length,
  linear in micro-batch tokens (`linear_interpolate`). A (TP, sequence) pair
  that was not measured takes the nearest measured pair, scaled by the analytic
  model's ratio between the two; an unprofiled layer shape is analytic.
- the LM head's GEMM runs at the FLOP rate the layer reached at the same tokens.
"""
from __future__ import annotations

import math
from functools import lru_cache

from ..specs.cluster import ClusterSpec
from ..specs.model import LayerSpec
from ..specs.profiles import ClusterProfile, CollectiveCurve, LayerProfile, LayerTiming, ModelProfile
from .compute import ComputeTimes, layer_compute_times
from .flops import Gemm, layer_gemms
from .interpolate import linear_interpolate, loglog_interpolate, monotone_fit
from .analytic import ANALYTIC_COMM, ANALYTIC_COMPUTE


def _ring_fraction(group_size: int) -> float:
    """Bytes through each rank's link per byte of buffer, up to a constant per op: (n-1)/n."""
    return (group_size - 1) / group_size


class ProfiledComm:
    """Collective times from a ClusterProfile's curves."""

    def __init__(self, profile: ClusterProfile, runtime_overlap: float = 1.0) -> None:
        self.profile = profile
        # What the hardware can hide (measured) times whether the runtime overlaps at all
        # (ClusterSpec.grad_overlap: 0 on cpu-gloo, where DDP reduces after the backward).
        self.grad_overlap = profile.grad_overlap_fraction * runtime_overlap

    def curve(self, op: str, group_size: int, stride: int, inter_node: bool) -> tuple[CollectiveCurve, float] | None:
        """The best-matching curve and the factor to scale it by, or None."""
        candidates = [c for c in self.profile.curves if c.op == op and c.inter_node == inter_node]
        if not candidates:
            return None
        best = min(candidates, key=lambda c: (abs(math.log(c.group_size / group_size)),
                                              abs(math.log(c.stride / stride))))
        scale = 1.0 if best.group_size == group_size else _ring_fraction(group_size) / _ring_fraction(best.group_size)
        return best, scale

    def collective_time(self, op: str, bytes_: float, group_size: int, stride: int, cluster: ClusterSpec) -> float:
        if group_size <= 1 or bytes_ <= 0:
            return 0.0
        span = (group_size - 1) * stride + 1
        found = self.curve(op, group_size, stride, span > cluster.gpus_per_node)
        if found is None:
            return ANALYTIC_COMM.collective_time(op, bytes_, group_size, stride, cluster)
        curve, scale = found
        return scale * loglog_interpolate(bytes_, curve.message_bytes, monotone_fit(curve.seconds))

    def p2p_time(self, bytes_: float, inter_node: bool, cluster: ClusterSpec) -> float:
        if bytes_ <= 0:
            return 0.0
        found = self.curve("p2p", 2, 1, inter_node)
        if found is None:
            return ANALYTIC_COMM.p2p_time(bytes_, inter_node, cluster)
        curve, _ = found
        return loglog_interpolate(bytes_, curve.message_bytes, monotone_fit(curve.seconds))


def _series(points: list[LayerTiming], field: str, samples: int, seq: int) -> float:
    """`field` at `samples` x `seq` tokens, linear in tokens over points of one (tp, seq)."""
    points = sorted(points, key=lambda p: p.tokens)
    return linear_interpolate(samples * seq, [p.tokens for p in points], [getattr(p, field) for p in points])


def _nearest_key(keys: set[tuple[int, int]], tp: int, seq: int) -> tuple[int, int]:
    return min(keys, key=lambda k: (abs(math.log(k[0] / tp)) + abs(math.log(k[1] / seq)), k))


class ProfiledCompute:
    """Layer times from a ModelProfile; analytic for shapes it does not hold."""

    def __init__(self, profile: ModelProfile) -> None:
        self.profile = profile

    def measured_times(self, entry: LayerProfile, seq: int, samples: int, tp: int) -> tuple[ComputeTimes, int, int]:
        """Interpolated times at the nearest measured (tp, seq), and that (tp, seq)."""
        keys = {(p.tp, p.seq_length) for p in entry.timings}
        tp0, seq0 = (tp, seq) if (tp, seq) in keys else _nearest_key(keys, tp, seq)
        points = [p for p in entry.timings if (p.tp, p.seq_length) == (tp0, seq0)]
        times = ComputeTimes(*(_series(points, f, samples, seq0)
                               for f in ("forward_s", "backward_s", "attention_core_forward_s")))
        return times, tp0, seq0

    def layer_times(self, layer: LayerSpec, seq: int, samples: int, tp: int, sp: bool,
                    cluster: ClusterSpec, activation_bytes: int, attention_backend: str = "flash") -> ComputeTimes:
        entry = self.profile.for_layer(layer)
        if entry is None:
            return ANALYTIC_COMPUTE.layer_times(layer, seq, samples, tp, sp, cluster, activation_bytes,
                                                attention_backend)
        times, tp0, seq0 = self.measured_times(entry, seq, samples, tp)
        if (tp0, seq0) == (tp, seq):
            return times
        # Unmeasured (tp, seq): the analytic model's ratio carries the nearest measured point over.
        want = layer_compute_times(layer, seq, samples, tp, sp, cluster, activation_bytes, attention_backend)
        have = layer_compute_times(layer, seq0, samples, tp0, sp, cluster, activation_bytes, attention_backend)
        return ComputeTimes(times.forward_s * want.forward_s / have.forward_s,
                            times.backward_s * want.backward_s / have.backward_s,
                            times.attention_core_forward_s * want.attention_core_forward_s
                            / have.attention_core_forward_s)

    def flop_rate(self, tokens: int) -> float | None:
        """FLOP/s the first profiled layer reached in its forward pass at `tokens`, lowest TP."""
        if not self.profile.layers:
            return None
        entry = self.profile.layers[0]
        tp = min(p.tp for p in entry.timings)
        points = sorted((p for p in entry.timings if p.tp == tp), key=lambda p: p.tokens)
        rates = [sum(g.flops for g in layer_gemms(entry.layer, p.seq_length, p.micro_batch, p.tp)) / p.forward_s
                 for p in points]
        tokens_axis = [p.tokens for p in points]
        if tokens <= tokens_axis[0]:
            return rates[0]
        if tokens >= tokens_axis[-1]:
            return rates[-1]
        return linear_interpolate(tokens, tokens_axis, rates)

    def gemm_time(self, gemm: Gemm, cluster: ClusterSpec) -> float:
        rate = self.flop_rate(gemm.m * gemm.batch)
        return gemm.flops / rate if rate else ANALYTIC_COMPUTE.gemm_time(gemm, cluster)

    def optimizer_time(self, state_bytes: float, cluster: ClusterSpec, impl: str = "fused") -> float:
        if self.profile.optimizer_s_per_state_byte > 0:
            return state_bytes * self.profile.optimizer_s_per_state_byte
        return ANALYTIC_COMPUTE.optimizer_time(state_bytes, cluster, impl)


@lru_cache(maxsize=64)
def profiled_compute(profile: ModelProfile) -> ProfiledCompute:
    """One ProfiledCompute per profile (profiles are hashable)."""
    return ProfiledCompute(profile)


@lru_cache(maxsize=64)
def profiled_comm(profile: ClusterProfile, runtime_overlap: float = 1.0) -> ProfiledComm:
    """One ProfiledComm per (profile, ClusterSpec.grad_overlap)."""
    return ProfiledComm(profile, runtime_overlap)
