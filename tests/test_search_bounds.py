"""The lower bounds the search prunes with never exceed what they bound."""
import itertools

import numpy as np
import pytest

from megatron_auto.cost.estimate import estimate_plan
from megatron_auto.errors import UserError
from megatron_auto.plan import LayerStrategy
from megatron_auto.search.hybrid import _span_times
from megatron_auto.search.partition import best_partition, partition_lower_bound
from megatron_auto.search.relaxation import hull_slopes, relaxed_spans
from megatron_auto.search.tables import LayerTables, StageFixed
from megatron_auto.search.uniform import UniformConfig, build_uniform_plan, pipeline_lower_bound
from megatron_auto.specs import load_cluster, load_model, TrainingSpec


def test_hull_slopes_follow_the_lower_convex_hull():
    memory = np.array([1.0, 2.0, 3.0, 4.0, 2.5])
    time = np.array([10.0, 6.0, 5.0, 1.0, 9.0])
    # (3, 5) lies above the chord from (2, 6) to (4, 1); (2.5, 9) above everything.
    assert hull_slopes(memory, time) == pytest.approx([4.0, 2.5])


def _random_tables(rng, layers, strategies):
    groups = rng.integers(0, 2, strategies)
    groups[0], groups[-1] = 0, 1 if strategies > 1 else 0
    groups = np.unique(groups, return_inverse=True)[1]
    layout = rng.random((groups.max() + 1, groups.max() + 1)) * 0.3
    np.fill_diagonal(layout, 0.0)
    shape = (layers, strategies)
    return LayerTables(strategies=tuple(LayerStrategy(tp=1) for _ in range(strategies)),
                       time=rng.random(shape) + 0.1, first_extra=rng.random(shape) * 0.2,
                       state=rng.random(shape) * 4, activation=rng.random(shape) * 2,
                       transient=rng.random(shape) * rng.integers(0, 2), transition=layout[np.ix_(groups, groups)],
                       groups=groups)


def _random_fixed(rng, strategies, stage):
    return StageFixed(time=float(rng.random()), memory=float(rng.random() * 3), in_flight=float(rng.integers(1, 4)),
                      first_layer_is_first_unit=stage > 0, entry_transition=rng.random(strategies) * 0.2,
                      exit_transition=rng.random(strategies) * 0.2)


def test_relaxed_spans_never_exceed_the_layer_dp():
    rng = np.random.default_rng(11)
    checked = 0
    for _ in range(40):
        layers, strategies, stages = int(rng.integers(2, 7)), int(rng.integers(1, 5)), int(rng.integers(1, 3))
        tables = _random_tables(rng, layers, strategies)
        fixed = [_random_fixed(rng, strategies, s) for s in range(stages)]
        budget, max_len = float(rng.uniform(4, 40)), layers
        exact, _ = _span_times(tables, fixed, budget, max_len, budget / 64, False, layers)
        relaxed = relaxed_spans(tables, fixed, budget, max_len, layers, False)
        for e, r in zip(exact, relaxed):
            finite = np.isfinite(e)
            assert (r[finite] <= e[finite] + 1e-12).all()
            checked += int(finite.sum())
    assert checked > 100


def test_partition_lower_bound_never_exceeds_the_best_partition():
    rng = np.random.default_rng(5)
    for _ in range(60):
        layers, stages, m = int(rng.integers(2, 8)), int(rng.integers(1, 4)), int(rng.integers(1, 9))
        tables = [rng.random((layers, layers + 1)) + 0.1 for _ in range(stages)]
        for table in tables:
            table[:, 0] = np.inf
            table[rng.random(table.shape) < 0.2] = np.inf
        best = best_partition(tables, layers, m)
        bound = partition_lower_bound(tables, layers, m)
        if best is None:
            assert bound == np.inf
        else:
            assert bound <= best.objective + 1e-12
            if stages == 1:
                assert bound == pytest.approx(best.objective)


def test_pipeline_lower_bound_never_exceeds_a_plan_of_the_flags():
    model, cluster, training = load_model("gpt3-1.7b"), load_cluster("dgx-a100-80gb", 2), TrainingSpec(64)
    compared = 0
    for tp, pp, recompute, sp in itertools.product((1, 2, 4), (1, 2, 4), ("none", "selective", "full"), (False, True)):
        for mbs, v in itertools.product((1, 2, 4), (1, 2)):
            config = UniformConfig(tp=tp, pp=pp, micro_batch_size=mbs, vp=v, sequence_parallel=sp,
                                   recompute=recompute)
            try:
                plan = build_uniform_plan(model, cluster, training, config)
            except UserError:
                continue
            time = estimate_plan(plan, model, cluster, training).iteration_time_s
            assert pipeline_lower_bound(model, cluster, training, config, mbs, max(v, 1)) <= time
            compared += 1
    assert compared > 100


def test_uniform_relaxed_spans_equal_the_general_ones_on_like_layers():
    rng = np.random.default_rng(2)
    for _ in range(20):
        layers, strategies = int(rng.integers(2, 9)), int(rng.integers(1, 5))
        tables = _random_tables(rng, 1, strategies)
        like = LayerTables(**{**tables.__dict__, **{name: np.repeat(getattr(tables, name), layers, axis=0)
                                                   for name in ("time", "first_extra", "state", "activation",
                                                                "transient")}})
        fixed = [_random_fixed(rng, strategies, s) for s in range(2)]
        budget, max_len = float(rng.uniform(4, 40)), int(rng.integers(1, layers + 1))
        for uniform, general in zip(relaxed_spans(like, fixed, budget, max_len, layers, True),
                                    relaxed_spans(like, fixed, budget, max_len, layers, False)):
            np.testing.assert_allclose(uniform, general, rtol=1e-12)
