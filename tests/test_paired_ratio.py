"""validation/paired_ratio.py: the alternating order and the median's distribution-free interval."""
import math

import pytest

from validation.paired_ratio import median_interval, pair_order, paired_ratio


def test_pair_order_alternates():
    assert [pair_order(i) for i in range(4)] == [(0, 1), (1, 0), (0, 1), (1, 0)]


def test_interval_of_twelve_is_third_to_tenth_order_statistic():
    values = [float(v) for v in (12, 3, 7, 1, 9, 5, 11, 2, 8, 4, 10, 6)]
    low, high, coverage = median_interval(values)
    assert (low, high) == (3.0, 10.0)
    assert coverage == pytest.approx(1 - 2 * sum(math.comb(12, i) for i in range(3)) / 2 ** 12)
    assert coverage >= 0.95


def test_too_few_values_have_no_interval():
    with pytest.raises(ValueError):
        median_interval([1.0, 2.0, 3.0, 4.0, 5.0])


def test_target_met_only_when_the_whole_interval_is_below():
    tight = paired_ratio([1.00, 1.01, 1.005, 0.995, 1.0, 1.01, 0.99, 1.0])
    assert tight.meets(1.02)
    wide = paired_ratio([0.9, 1.0, 1.1, 0.95, 1.05, 1.0, 1.2, 0.8])
    assert not wide.meets(1.02)
    assert wide.median == pytest.approx(1.0)


PLAN = ("parallel plan ({source}):\nplan (megatron space) for model m on 4 GPUs of cluster {cluster}\n"
        "  micro-batches       1\n\nstages\n  stage 0: 4 layers{busy}\n    layers 0-3: tp1·dp4·z1\n\n")
LINE = " iteration        {it}/      9 | elapsed time per iteration (ms): 90.0 | lm loss: {loss} |\n"


def _log(source: str, cluster: str, busy: str, losses: list[str]) -> str:
    return PLAN.format(source=source, cluster=cluster, busy=busy) + "".join(
        LINE.format(it=i + 1, loss=loss) for i, loss in enumerate(losses))


def test_auto_vs_manual_accepts_the_same_job_and_rejects_another():
    from benchmarks import bench_auto_vs_manual as bench

    auto = _log("auto-parallel", "cpu-gloo", "; busy 0.073 s/iter", ["5.9E+00", "5.1E+00"])
    bench.check_same_job(auto, _log("flags", "manual", "", ["5.9E+00", "5.1E+00"]))
    with pytest.raises(SystemExit):
        bench.check_same_job(auto, _log("flags", "manual", "", ["5.9E+00", "5.2E+00"]))
    with pytest.raises(SystemExit):
        bench.check_same_job(auto, _log("flags", "manual", "", ["5.9E+00", "5.1E+00"]).replace("dp4·z1", "dp4·z0"))


def test_block_ratios_pair_each_blocks_two_steps():
    from benchmarks import ab_steps

    assert ab_steps.block_ratios([1.0, 3.0, 2.0, 2.0], [2.0, 2.0, 1.0, 1.0]) == [1.0, 0.5]
