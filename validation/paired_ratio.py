"""Paired A/B ratios for the step-time benchmarks: alternating order, per-pair ratio, median and its 95% interval.

On this shared 2-core machine a run's step time drifts by 10-20% over minutes as other jobs come and go, so
two medians taken minutes apart do not resolve a 2% difference. The benchmarks therefore run A and B in short
alternating pairs (A B, B A, A B, ...: `pair_order`), take one ratio B/A per pair (both halves saw nearly the
same machine), and report the median of those ratios with a distribution-free 95% interval (`median_interval`:
order statistics of the sample, exact binomial coverage, no normality assumed). A target "ratio at most R" is
met when the interval's upper end is at most R.
"""
from __future__ import annotations

import math
import os
import statistics
from dataclasses import dataclass


def pair_order(index: int) -> tuple[int, int]:
    """(first, second) of pair `index`: (0, 1), (1, 0), (0, 1), ... so a linear drift cancels over two pairs."""
    return (0, 1) if index % 2 == 0 else (1, 0)


def median_interval(values: list[float], level: float = 0.95) -> tuple[float, float, float]:
    """(low, high, coverage): the narrowest symmetric order-statistic interval for the median with coverage
    >= `level` (binomial, p = 1/2). Needs at least 6 values for 95%."""
    ordered = sorted(values)
    n = len(ordered)
    cdf = [sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n for k in range(n + 1)]
    best = None
    for k in range(n // 2):  # interval [x_(k+1), x_(n-k)] (1-indexed) misses the median with prob 2 P(X <= k)
        coverage = 1 - 2 * cdf[k]
        if coverage >= level:
            best = (ordered[k], ordered[n - 1 - k], coverage)
    if best is None:
        raise ValueError(f"{n} values give no {level:.0%} interval for the median; take more pairs")
    return best


@dataclass(frozen=True)
class PairedRatio:
    """Summary of per-pair ratios B/A."""

    ratios: tuple[float, ...]
    median: float
    low: float
    high: float
    coverage: float

    def describe(self) -> str:
        return (f"**{self.median:.3f}** (95% interval {self.low:.3f}-{self.high:.3f}, "
                f"{self.coverage:.1%} coverage, {len(self.ratios)} pairs)")

    def meets(self, limit: float) -> bool:
        """The whole interval lies at or below `limit`."""
        return self.high <= limit


def paired_ratio(ratios: list[float]) -> PairedRatio:
    low, high, coverage = median_interval(ratios)
    return PairedRatio(tuple(ratios), statistics.median(ratios), low, high, coverage)


def load_average() -> float:
    """The 1-minute load average (uptime's first figure)."""
    return os.getloadavg()[0]
