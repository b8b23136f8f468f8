"""A global batch that grows with the samples consumed: Megatron-LM's `--rampup-batch-size` and
`--step-batch-size-schedule`.

- `--rampup-batch-size START INCREMENT SAMPLES` (Megatron-LM up to its step schedules, and
  megatron-core 0.16.1): megatron-core's RampupBatchsizeNumMicroBatchesCalculator gives the batch
  of every iteration from the samples consumed so far; Megatron-LM allows it with --train-samples only.
- `--step-batch-size-schedule "THRESHOLD:BATCH ..."` (Megatron-LM's newer form; megatron-core
  0.16.1 has no class for it, so it is parsed here as megatron/core/num_microbatches_calculator.py's
  StepBatchsizeNumMicroBatchesCalculator reads it): thresholds with K/M/B/T suffixes count tokens
  (divided by the sequence length into samples), the first is 0, they increase strictly; an
  iteration takes the batch of the last threshold its consumed samples reached. The last batch is
  the global batch.

Iterations of a sample-based run (Megatron-LM's training.update_train_iters): with a ramp-up, the
iterations while consumed <= ramp-up samples, then (train_samples - consumed) // global batch; with a
step schedule, iterations until train_samples are consumed. The learning-rate schedule is stepped
by each iteration's batch (Megatron-LM's opt_param_scheduler.step(increment=current batch)).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ..errors import UserError

SUFFIXES = {"K": 10**3, "M": 10**6, "B": 10**9, "T": 10**12}


@dataclass(frozen=True)
class BatchRamp:
    """One of Megatron-LM's growing-batch flags, resolved to samples."""

    rampup: Optional[tuple[int, int, int]] = None
    """--rampup-batch-size: (start batch, increment, ramp-up samples)."""
    steps: tuple[tuple[int, int], ...] = ()
    """--step-batch-size-schedule: (threshold in samples, batch) pairs, thresholds increasing from 0."""

    def final_batch(self, global_batch_size: int) -> int:
        """The batch after the ramp: the step schedule's last, else --global-batch-size."""
        return self.steps[-1][1] if self.steps else global_batch_size

    def batch_sizes(self, global_batch_size: int) -> list[int]:
        """Every batch size the run can take, smallest first."""
        if self.steps:
            return sorted({batch for _, batch in self.steps})
        start, increment, _ = self.rampup
        return list(range(start, global_batch_size + 1, increment))


def _number(text: str, flag: str) -> int:
    word = text.strip().upper()
    scale = SUFFIXES.get(word[-1:], 1)
    try:
        return int(float(word[:-1] if scale > 1 else word) * scale)
    except ValueError:
        raise UserError(f"{flag}: {text!r} is not a number (suffixes K, M, B, T)") from None


def parse_step_schedule(text: str, seq_length: int) -> tuple[tuple[int, int], ...]:
    """--step-batch-size-schedule as (threshold samples, batch) pairs; UserError when malformed."""
    flag = "--step-batch-size-schedule"
    steps = []
    for entry in text.replace(",", " ").split():
        if ":" not in entry:
            raise UserError(f"{flag}: entry {entry!r} is not THRESHOLD:BATCH_SIZE")
        threshold, batch = entry.split(":", 1)
        steps.append((_number(threshold, flag) // seq_length, _number(batch, flag)))
    steps.sort()
    if not steps or steps[0][0] != 0:
        raise UserError(f"{flag} {text!r}: the first threshold must be 0")
    thresholds = [threshold for threshold, _ in steps]
    if len(set(thresholds)) != len(thresholds) or any(batch <= 0 for _, batch in steps):
        raise UserError(f"{flag} {text!r}: thresholds (in tokens / --seq-length) must increase strictly "
                        "and batch sizes be positive")
    return tuple(steps)


def rampup_calculator(ramp: BatchRamp, global_batch_size: int):
    """megatron-core's ramp-up calculator for `ramp.rampup` (UserError for values it refuses)."""
    from megatron.core.num_microbatches_calculator import RampupBatchsizeNumMicroBatchesCalculator

    start, increment, samples = ramp.rampup
    if start >= global_batch_size:
        raise UserError(f"--rampup-batch-size {start} {increment} {samples}: the start batch must be below "
                        f"--global-batch-size {global_batch_size}")
    try:
        # micro-batch and DP sizes of 1 and rank 1: only the batch is read here (divisibility is
        # check_divisible's, logging the run's).
        return RampupBatchsizeNumMicroBatchesCalculator(global_batch_size, 1, 1, False, 1, start, increment, samples)
    except (AssertionError, ZeroDivisionError) as error:
        raise UserError(f"--rampup-batch-size {start} {increment} {samples}: {error or 'no ramp-up samples'}") from None


class BatchSizer:
    """The global batch of each iteration, from the samples consumed before it."""

    def __init__(self, ramp: Optional[BatchRamp], global_batch_size: int) -> None:
        self.ramp, self.global_batch_size = ramp, global_batch_size
        self.calculator = None
        if ramp is not None and ramp.rampup is not None:
            self.calculator = rampup_calculator(ramp, global_batch_size)

    def batch(self, consumed_samples: int) -> int:
        if self.ramp is None:
            return self.global_batch_size
        if self.calculator is not None:
            self.calculator.update(consumed_samples, consistency_check=False)
            return self.calculator.get_current_global_batch_size()
        batch = self.ramp.steps[0][1]
        for threshold, size in self.ramp.steps:
            if consumed_samples >= threshold:
                batch = size
        return batch

    def iterations_for_samples(self, train_samples: int) -> int:
        """Megatron-LM's update_train_iters: the iterations a sample-based run takes."""
        if self.ramp is None:
            return train_samples // self.global_batch_size
        iterations, consumed = 0, 0
        if self.calculator is not None:
            while consumed <= self.ramp.rampup[2] and consumed <= train_samples:
                consumed += self.batch(consumed)
                iterations += 1
            return iterations + max(0, train_samples - consumed) // self.global_batch_size
        while consumed < train_samples:
            consumed += self.batch(consumed)
            iterations += 1
        return iterations


def check_divisible(ramp: Optional[BatchRamp], global_batch_size: int, micro_batch_size: int,
                    data_parallel: int) -> None:
    """UserError unless every batch the ramp takes splits into whole micro-batches on every replica
    (Megatron-LM asserts it at the iteration that takes the batch; here it is checked before any work)."""
    if ramp is None:
        return
    unit = micro_batch_size * data_parallel
    bad = [batch for batch in ramp.batch_sizes(global_batch_size) if batch % unit]
    if bad:
        raise UserError(f"batch size ramp: global batch {bad[0]} is not divisible by micro-batch size "
                        f"{micro_batch_size} x data-parallel size {data_parallel}")
