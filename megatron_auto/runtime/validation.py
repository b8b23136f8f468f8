"""Run settings checked before any work: what Megatron-LM's validate_args, its learning-rate scheduler
or torch's optimizer and dropout would otherwise assert on mid-setup, as one line (UserError).

Sources: megatron/training/arguments.py validate_args (min_lr <= lr, max_position_embeddings >=
seq_length, micro batch > 0, selective recompute without a method), megatron-core 0.16.1's
optimizer_param_scheduler.OptimizerParamScheduler (min_lr >= 0, init_lr <= max_lr, decay steps > 0,
warm-up steps < decay steps), torch.optim.Adam (lr, eps, betas, weight decay) and torch.nn.Dropout
(probability in [0, 1]). Values Megatron-LM leaves unchecked but that train nonsense without a word
(a negative --clip-grad flips the gradients) or divide by zero (--log-interval 0) are refused too.
"""
from __future__ import annotations

import math
from typing import Optional

from ..errors import UserError
from .schedule import schedule_steps
from .settings import TrainSettings


def check_settings(settings: TrainSettings, seq_length: int) -> None:
    """UserError for the first setting a run cannot start with."""
    _check_rates(settings)
    _check_optimizer(settings)
    _check_model_numbers(settings, seq_length)
    _check_schedule(settings)
    _check_intervals(settings)


def check_global_batch(settings: TrainSettings, global_batch_size: int) -> None:
    """A sample-based run needs at least one global batch of samples."""
    if settings.train_samples is not None and settings.train_samples < global_batch_size:
        raise UserError(f"--train-samples {settings.train_samples} is less than one global batch "
                        f"({global_batch_size}): no iteration would run")


def _finite(flag: str, value: float, low: float = -math.inf, high: float = math.inf,
            low_open: bool = False, high_open: bool = False) -> None:
    """UserError unless `value` is a finite number in the interval [low, high] (bounds open as asked)."""
    below = value <= low if low_open else value < low
    above = value >= high if high_open else value > high
    if math.isfinite(value) and not below and not above:
        return
    if math.isinf(high):
        wanted = f"{'>' if low_open else '>='} {low:g}"
    else:
        wanted = f"in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
    raise UserError(f"{flag} must be a finite number {wanted}, got {value!r}")


def _check_rates(settings: TrainSettings) -> None:
    _finite("--lr", settings.lr, low=0.0)
    _finite("--min-lr", settings.min_lr, low=0.0)
    if settings.min_lr > settings.lr:  # validate_args: assert args.min_lr <= args.lr
        raise UserError(f"--min-lr {settings.min_lr:g} is above --lr {settings.lr:g}")
    _finite("--lr-warmup-init", settings.lr_warmup_init, low=0.0)
    if settings.lr_warmup_init > settings.lr:  # OptimizerParamScheduler: init_lr <= max_lr
        raise UserError(f"--lr-warmup-init {settings.lr_warmup_init:g} is above --lr {settings.lr:g}")
    decoupled = settings.decoupled_lr if settings.decoupled_lr is not None else settings.lr
    decoupled_min = settings.decoupled_min_lr if settings.decoupled_min_lr is not None else settings.min_lr
    _finite("--decoupled-lr", decoupled, low=0.0)
    _finite("--decoupled-min-lr", decoupled_min, low=0.0)
    if decoupled_min > decoupled:
        raise UserError(f"--decoupled-min-lr {decoupled_min:g} is above --decoupled-lr {decoupled:g}")


def _check_optimizer(settings: TrainSettings) -> None:
    _finite("--weight-decay", settings.weight_decay, low=0.0)
    ends = (("--start-weight-decay", settings.start_weight_decay), ("--end-weight-decay", settings.end_weight_decay))
    for flag, value in ends:  # Megatron-LM's validate_args: both with a moving decay, neither with a constant one
        if settings.weight_decay_incr_style == "constant" and value is not None:
            raise UserError(f"{flag} goes with --weight-decay-incr-style linear or cosine; with constant, "
                            "--weight-decay is used throughout")
        if settings.weight_decay_incr_style != "constant":
            if value is None:
                raise UserError(f"--weight-decay-incr-style {settings.weight_decay_incr_style} needs {flag}")
            _finite(flag, value, low=0.0)
    _finite("--clip-grad", settings.clip_grad, low=0.0)
    _finite("--adam-beta1", settings.adam_beta1, low=0.0, high=1.0, high_open=True)
    _finite("--adam-beta2", settings.adam_beta2, low=0.0, high=1.0, high_open=True)
    _finite("--adam-eps", settings.adam_eps, low=0.0)


def _check_model_numbers(settings: TrainSettings, seq_length: int) -> None:
    _finite("--hidden-dropout", settings.hidden_dropout, low=0.0, high=1.0)
    _finite("--attention-dropout", settings.attention_dropout, low=0.0, high=1.0)
    _finite("--init-method-std", settings.init_method_std, low=0.0)
    _finite("--norm-epsilon", settings.norm_epsilon, low=0.0)
    _finite("--rotary-percent", settings.rotary_percent, low=0.0, high=1.0, low_open=True)
    if settings.seed < 0:
        raise UserError(f"--seed must be non-negative, got {settings.seed}")
    if settings.make_vocab_size_divisible_by < 1:
        raise UserError("--make-vocab-size-divisible-by must be at least 1, "
                        f"got {settings.make_vocab_size_divisible_by}")
    positions = settings.max_position_embeddings
    if positions is not None and positions < seq_length:  # validate_args' assertion, its wording
        raise UserError(f"max_position_embeddings ({positions}) must be greater than or equal to "
                        f"seq_length ({seq_length}): raise --max-position-embeddings or lower --seq-length")


def _check_schedule(settings: TrainSettings) -> None:
    """The scheduler's lengths (schedule.py) at a global batch of one: every length scales with it."""
    counts = (("--train-iters", settings.train_iters if settings.train_samples is None else None),
              ("--train-samples", settings.train_samples), ("--lr-decay-iters", settings.lr_decay_iters),
              ("--lr-decay-samples", settings.lr_decay_samples))
    for flag, value in counts:
        if value is not None and value < 1:
            raise UserError(f"{flag} must be positive, got {value}")
    for flag, value in (("--lr-warmup-iters", settings.lr_warmup_iters),
                        ("--lr-warmup-samples", settings.lr_warmup_samples)):
        if value < 0:
            raise UserError(f"{flag} must be non-negative, got {value}")
    if settings.lr_warmup_fraction is not None:
        _finite("--lr-warmup-fraction", settings.lr_warmup_fraction, low=0.0, high=1.0, high_open=True)
    steps = schedule_steps(settings, 1)
    _check_wsd(settings, steps)
    if steps.warmup >= steps.decay:  # OptimizerParamScheduler: assert lr_warmup_steps < lr_decay_steps
        raise UserError(f"the learning-rate warm-up ({_length(settings, steps.warmup)}) must be shorter than its "
                        f"decay ({_length(settings, steps.decay)}): lower the warm-up, or lengthen the decay "
                        "(--lr-decay-iters/--lr-decay-samples; default the whole run)")


def _check_wsd(settings: TrainSettings, steps) -> None:
    """WSD's final decay: given (OptimizerParamScheduler asserts it), positive, within the decay."""
    if settings.lr_decay_style != "WSD":
        return
    flag = "--lr-wsd-decay-samples" if settings.train_samples is not None else "--lr-wsd-decay-iters"
    if steps.wsd_decay is None:
        raise UserError(f"--lr-decay-style WSD needs {flag}: the length of its final decay")
    if not 1 <= steps.wsd_decay <= steps.decay:
        raise UserError(f"{flag} {steps.wsd_decay:g} must be between 1 and the decay's length "
                        f"({_length(settings, steps.decay)})")


def _length(settings: TrainSettings, steps: float) -> str:
    unit = "samples" if settings.train_samples is not None else "iterations"
    return f"{steps:g} {unit}"


def _check_intervals(settings: TrainSettings) -> None:
    if settings.log_interval < 1:
        raise UserError(f"--log-interval must be at least 1, got {settings.log_interval}")
    non_negative: tuple[tuple[str, Optional[float]], ...] = (
        ("--eval-interval", settings.eval_interval), ("--eval-iters", settings.eval_iters),
        ("--save-interval", settings.save_interval), ("--exit-interval", settings.exit_interval),
        ("--ckpt-step", settings.ckpt_step))
    for flag, value in non_negative:
        if value is not None and value < 0:
            raise UserError(f"{flag} must be non-negative, got {value}")
    _finite("--exit-duration-in-mins", settings.exit_duration_s / 60, low=0.0)
    _finite("--distributed-timeout-minutes", settings.timeout_s / 60, low=0.0, low_open=True)
