"""Megatron-LM's learning-rate schedule lengths, in samples, for iteration- or sample-based runs.

Megatron-LM's training.get_optimizer_param_scheduler steps the scheduler by the global
batch each iteration, so every length is in samples:
- iteration-based (--train-iters): decay = lr_decay_iters (default train_iters) x global
  batch, weight-decay increment = train_iters x global batch, warm-up = lr_warmup_iters x
  global batch;
- sample-based (--train-samples): decay = lr_decay_samples (default train_samples), weight-decay
  increment = train_samples, warm-up = lr_warmup_samples, and train_iters = train_samples //
  global batch (Megatron-LM's update_train_iters; with a growing batch, batch_schedule.BatchSizer's count);
- --lr-warmup-fraction in both: warm-up = fraction x decay steps;
- WSD's final decay: lr_wsd_decay_iters x global batch, or lr_wsd_decay_samples.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional

from .settings import TrainSettings


@dataclass(frozen=True)
class ScheduleSteps:
    """The lengths OptimizerParamScheduler takes, in samples."""

    warmup: float
    """Samples of linear warm-up."""
    decay: int
    """Samples over which the rate decays."""
    weight_decay_increment: int
    """Samples over which the weight decay moves from its start to its end value."""
    wsd_decay: Optional[int] = None
    """With --lr-decay-style WSD: samples of the final decay (None: not WSD, or not given)."""


def resolve_samples(settings: TrainSettings, global_batch_size: int) -> TrainSettings:
    """`settings` with train_iters set from train_samples for this global batch (unchanged when
    iteration-based)."""
    from .batch_schedule import BatchSizer

    if settings.train_samples is None:
        return settings
    sizer = BatchSizer(settings.batch_ramp, global_batch_size)
    return dataclasses.replace(settings, train_iters=sizer.iterations_for_samples(settings.train_samples))


def schedule_steps(settings: TrainSettings, global_batch_size: int) -> ScheduleSteps:
    """Warm-up, decay and weight-decay lengths of `settings`' schedule, in samples."""
    wsd = None
    if settings.train_samples is not None:
        decay = settings.lr_decay_samples or settings.train_samples
        increment = settings.train_samples
        warmup = settings.lr_warmup_samples
        wsd = settings.lr_wsd_decay_samples
    else:
        decay = (settings.lr_decay_iters or settings.train_iters) * global_batch_size
        increment = settings.train_iters * global_batch_size
        warmup = settings.lr_warmup_iters * global_batch_size
        if settings.lr_wsd_decay_iters is not None:
            wsd = settings.lr_wsd_decay_iters * global_batch_size
    if settings.lr_warmup_fraction is not None:
        warmup = settings.lr_warmup_fraction * decay
    return ScheduleSteps(warmup=warmup, decay=decay, weight_decay_increment=increment,
                         wsd_decay=wsd if settings.lr_decay_style == "WSD" else None)
