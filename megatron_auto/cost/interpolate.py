"""Interpolation between measured points (docs/cost_model.md, "Profiled cost model").

Two laws, each chosen for what the measured quantity physically does:

- collectives against message size: **log-log linear** between neighbouring
  points (a power law per segment, exact for both the latency-bound flat part
  and the bandwidth-bound linear part of the alpha-beta model). Below the
  smallest size the time is the smallest size's (the latency floor); above the
  largest it grows in proportion to the bytes (bandwidth-bound).
- layer times against tokens (micro-batch x sequence): **linear** between
  neighbouring points (GEMM FLOPs are linear in tokens at fixed sequence
  length); beyond either end, proportional to tokens from the nearest point.
"""
from __future__ import annotations

import bisect
import math
from typing import Sequence


def _check(xs: Sequence[float], ys: Sequence[float]) -> None:
    if not xs or len(xs) != len(ys):
        raise ValueError("need at least one point and as many ys as xs")


def loglog_interpolate(x: float, xs: Sequence[float], ys: Sequence[float]) -> float:
    """y at x from ascending positive (xs, ys), log-log linear between points."""
    _check(xs, ys)
    if x <= xs[0]:
        return ys[0]
    if x >= xs[-1]:
        return ys[-1] * x / xs[-1]
    i = bisect.bisect_right(xs, x)
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    if y0 <= 0 or y1 <= 0:
        return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    slope = math.log(y1 / y0) / math.log(x1 / x0)
    return y0 * (x / x0) ** slope


def linear_interpolate(x: float, xs: Sequence[float], ys: Sequence[float]) -> float:
    """y at x from ascending (xs, ys), piecewise linear; proportional to x beyond the ends."""
    _check(xs, ys)
    if x <= xs[0]:
        return ys[0] * x / xs[0]
    if x >= xs[-1]:
        return ys[-1] * x / xs[-1]
    i = bisect.bisect_right(xs, x)
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


def monotone_fit(ys: Sequence[float]) -> tuple[float, ...]:
    """The least-squares non-decreasing sequence closest to `ys` (pool-adjacent-violators).

    Measured collective times are noisy; a larger message is never cheaper in truth.
    """
    blocks: list[list[float]] = []  # [mean, count]
    for y in ys:
        blocks.append([float(y), 1.0])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            mean, count = blocks.pop()
            blocks[-1] = [(blocks[-1][0] * blocks[-1][1] + mean * count) / (blocks[-1][1] + count),
                          blocks[-1][1] + count]
    return tuple(mean for mean, count in blocks for _ in range(int(count)))
