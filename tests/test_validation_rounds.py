"""tools/validate_cost_model.py's repeated measurement: order of the runs and the median per plan."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import validate_cost_model  # noqa: E402


def test_rounds_alternate_order_and_take_the_median(monkeypatch):
    calls: list[str] = []
    times = {"a": iter([3.0, 1.0, 2.0]), "b": iter([5.0, 9.0, 4.0])}
    peaks = {"a": iter([10.0, 30.0, 20.0]), "b": iter([1.0, 1.0, 1.0])}

    def fake_run(plan, job, workdir):
        calls.append(plan)
        return next(times[plan]), next(peaks[plan])

    monkeypatch.setattr(validate_cost_model, "run_plan", fake_run)
    out = validate_cost_model.measure_rounds(validate_cost_model.TINY_JOB, {"a": "a", "b": "b"}, rounds=3)
    assert calls == ["a", "b", "b", "a", "a", "b"]
    assert out["a"] == (2.0, 30.0, [3.0, 1.0, 2.0])
    assert out["b"] == (5.0, 1.0, [5.0, 9.0, 4.0])
