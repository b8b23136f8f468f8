"""validation/validate_cost_model.py's repeated measurement: order of the runs and the median per plan."""
from __future__ import annotations

from validation import validate_cost_model


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


def test_reuse_matches_fixed_plans_by_name_and_the_pick_by_digest():
    from megatron_auto.search.uniform import UniformConfig, build_uniform_plan
    from megatron_auto.specs.training import TrainingSpec

    job, training = validate_cost_model.TINY_JOB, TrainingSpec.fp32(validate_cost_model.TINY_JOB.global_batch)
    cluster = validate_cost_model.cpu_cluster(job, [])
    build = lambda mbs: build_uniform_plan(job.model(), cluster, training, UniformConfig(tp=1, pp=1, micro_batch_size=mbs))  # noqa: E731
    fixed, pick = build(1), build(2)
    assert validate_cost_model.plan_digest(fixed) != validate_cost_model.plan_digest(pick)
    stored = [{"name": "dp2 mbs1 (planner pick)", "measured_s": 1.0, "measured_bytes": 5.0},
              {"name": "planner pick", "measured_s": 2.0, "measured_bytes": 6.0}]  # an older pick, no digest
    reuse = validate_cost_model.reusable_measurements(stored, {"dp2 mbs1": fixed, "planner pick": pick})
    assert reuse == {"dp2 mbs1": (1.0, 5.0, [1.0])}
    stored[1]["plan_digest"] = validate_cost_model.plan_digest(pick)
    reuse = validate_cost_model.reusable_measurements(stored, {"dp2 mbs1": fixed, "planner pick": pick})
    assert reuse["planner pick"] == (2.0, 6.0, [2.0])
