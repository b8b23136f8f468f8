"""Integer arithmetic the search shares: which degrees and batch sizes divide a count."""
from __future__ import annotations

import math


def divisors(n: int) -> list[int]:
    """The divisors of n, ascending, in O(sqrt n) steps (n may be a batch of millions)."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]
