"""--rampup-batch-size and --step-batch-size-schedule: the global batch of every iteration, the
iterations of a sample-based run, and the samples each iteration reads, as Megatron-LM has them."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from megatron_auto.errors import UserError
from megatron_auto.runtime import session as sessions
from megatron_auto.runtime.batch_schedule import BatchRamp, BatchSizer, check_divisible, parse_step_schedule
from megatron_auto.runtime.data import BatchSlicer
from megatron_auto.parallel_dims import ParallelDims
from megatron_auto.runtime.layout import MegatronLayout
from megatron_auto.runtime.settings import TrainSettings


def _megatron_lm_batches(rampup: list[int], global_batch: int, micro_batch: int, dp: int, iterations: int):
    """The batches Megatron-LM's training loop takes: its global calculator updated with the consumed samples."""
    from megatron.core import num_microbatches_calculator as calculator

    calculator.init_num_microbatches_calculator(0, rampup, global_batch, micro_batch, dp, False)
    try:
        batches, consumed = [], 0
        for _ in range(iterations):
            calculator.update_num_microbatches(consumed, consistency_check=True)
            batches.append(calculator.get_current_global_batch_size())
            consumed += batches[-1]
        return batches
    finally:
        calculator.destroy_num_microbatches_calculator()


def _run_batches(sizer: BatchSizer, iterations: int) -> list[int]:
    batches, consumed = [], 0
    for _ in range(iterations):
        batches.append(sizer.batch(consumed))
        consumed += batches[-1]
    return batches


def test_rampup_grows_the_batch_as_megatrons_calculator_says():
    # 64 -> 512 by 64 over 3000 samples: 7 increments of ~428.6 samples (mbs 2 x dp 4 divides every batch).
    sizer = BatchSizer(BatchRamp(rampup=(64, 64, 3000)), 512)
    assert _run_batches(sizer, 40) == _megatron_lm_batches([64, 64, 3000], 512, 2, 4, 40)
    assert _run_batches(sizer, 40)[:3] == [64, 64, 64] and _run_batches(sizer, 40)[-1] == 512


def test_sample_based_iterations_follow_megatron_lms_update_train_iters():
    # start 4, +4 over 16 samples to 12 (8 samples per increment): batches 4, 4, 8, 12 while consumed <= 16,
    # then (64 - 28) // 12 = 3 more.
    assert BatchSizer(BatchRamp(rampup=(4, 4, 16)), 12).iterations_for_samples(64) == 7
    assert _run_batches(BatchSizer(BatchRamp(rampup=(4, 4, 16)), 12), 7) == [4, 4, 8, 12, 12, 12, 12]
    # Step schedule in tokens, seq 64: thresholds 0, 1000 // 64 = 15 and 2000 // 64 = 31 samples;
    # iterations until 64 samples: 4 x 4, 2 x 8, 2 x 16.
    steps = BatchSizer(BatchRamp(steps=parse_step_schedule("0:4 1K:8 2K:16", 64)), 16)
    assert _run_batches(steps, 8) == [4, 4, 4, 4, 8, 8, 16, 16]
    assert steps.iterations_for_samples(64) == 8
    assert BatchSizer(None, 8).iterations_for_samples(70) == 8


def test_step_schedule_reads_suffixes_and_sorts():
    assert parse_step_schedule("2.4B:320 0:16, 4.8B:624", 2048) == ((0, 16), (1171875, 320), (2343750, 624))
    with pytest.raises(UserError, match="increase strictly"):
        parse_step_schedule("0:4 10:8", 64)  # both thresholds are sample 0


def test_every_batch_of_the_ramp_must_split_into_micro_batches():
    check_divisible(BatchRamp(rampup=(8, 8, 100)), 32, 2, 4)
    with pytest.raises(UserError, match="global batch 4 is not divisible by micro-batch size 2 x data-parallel"):
        check_divisible(BatchRamp(rampup=(4, 4, 100)), 32, 2, 4)


def test_iterations_read_consecutive_samples_and_step_the_schedule_by_their_batch(monkeypatch):
    layout = MegatronLayout(ParallelDims(dp=2), 2, num_micro_batches=3, global_batch_size=12)
    settings = TrainSettings(train_iters=7, batch_ramp=BatchRamp(rampup=(4, 4, 16)))
    session = SimpleNamespace(settings=settings, layout=layout, slicer=BatchSlicer(layout, 1), source=None,
                              iteration=0, consumed_samples=0, current_batch=0, history=[], model=[],
                              optimizer=None, scheduler=None, model_spec=SimpleNamespace(seq_length=8),
                              device="cpu", hybrid=None, sizer=BatchSizer(settings.batch_ramp, 12))
    read, increments = [], []

    def iterators_for_chunks(source, slicer, iteration, device, split="train", first_sample=None):
        for micro_batch in range(slicer.layout.num_micro_batches):
            for rank in (0, 1):
                read.extend(BatchSlicer(slicer.layout, rank).sample_indices(iteration, micro_batch, first_sample))

    monkeypatch.setattr(sessions.data, "iterators_for_chunks", iterators_for_chunks)
    monkeypatch.setattr(sessions, "train_step", lambda model, opt, sched, it, layout, *a, **k:
                        increments.append(layout.global_batch_size))
    for _ in range(7):
        sessions.run_iteration(session)
    # The learning-rate schedule steps by each iteration's batch (train_step's increment).
    assert increments == [4, 4, 8, 12, 12, 12, 12]
    assert sorted(read) == list(range(64)) and session.consumed_samples == 64
