"""How well predictions agree with measurements: the mean absolute percentage error and Spearman's rank
correlation (validate_cost_model and cost_validation_gpu both report them)."""
from __future__ import annotations

import statistics


def spearman(xs: list[float], ys: list[float]) -> float:
    """Spearman's rank correlation (average ranks for ties)."""
    def ranks(values):
        order = sorted(range(len(values)), key=lambda i: values[i])
        out = [0.0] * len(values)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
                j += 1
            for k in range(i, j + 1):
                out[order[k]] = (i + j) / 2
            i = j + 1
        return out
    rx, ry = ranks(xs), ranks(ys)
    mx, my = statistics.mean(rx), statistics.mean(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    var = (sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry)) ** 0.5
    return cov / var if var else 0.0


def mape(predicted: list[float], measured: list[float]) -> float:
    """Mean absolute percentage error, in percent."""
    return 100.0 * statistics.mean(abs(p - m) / m for p, m in zip(predicted, measured))
