"""Why a run stops early, as Megatron-LM decides it: a NaN in the loss or gradients, the
--exit-duration-in-mins budget, or the signal of --exit-signal-handler. Each is agreed on by every
rank (a MAX all-reduce of a flag), so all ranks stop at the same iteration."""
from __future__ import annotations

import contextlib
import math
import signal
import time
from typing import Iterator, Optional

import torch

from .step import StepResult


class TrainingDiverged(Exception):
    """The loss or the gradient norm became NaN/Inf (the command line: one line, exit status 1)."""


def _any_rank(flag: bool, device: torch.device) -> bool:
    """True when `flag` is set on any rank of the job."""
    value = torch.tensor([int(flag)], dtype=torch.int32, device=device)
    torch.distributed.all_reduce(value, op=torch.distributed.ReduceOp.MAX)
    return bool(value.item())


def local_nan(result: StepResult) -> bool:
    """Megatron-LM's checks: a NaN or Inf reported loss (on ranks holding the loss), a NaN gradient norm
    (fp16's skipped overflow iterations are the loss scaler's business, not an error)."""
    bad_loss = result.has_loss and not math.isfinite(result.loss)
    bad_grad = result.has_grad_norm and math.isnan(result.grad_norm)
    return bad_loss or bad_grad


def check_for_nan(result: StepResult, iteration: int, device: torch.device) -> None:
    """Raise TrainingDiverged on every rank when any rank saw a NaN in iteration `iteration`."""
    if _any_rank(local_nan(result), device):
        raise TrainingDiverged(f"NaN or Inf in the loss or gradients at iteration {iteration} "
                               f"(loss {result.loss:g}, grad norm {result.grad_norm:g}); stopping "
                               f"(--no-check-for-nan-in-loss-and-grad turns the check off)")


def duration_exceeded(started_at: float, limit_s: float, device: torch.device) -> bool:
    """Whether any rank has trained for more than `limit_s` seconds (0: no limit)."""
    if not limit_s:
        return False
    return _any_rank(time.time() - started_at > limit_s, device)


class ExitSignal:
    """--exit-signal-handler: notes that the signal arrived; the training loop then saves and stops
    at the end of the iteration every rank is in (a scheduler's warning before it kills the job)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.received = False

    def note(self, signum, frame) -> None:
        self.received = True

    def agreed(self, device: torch.device) -> bool:
        """Whether the signal reached any rank (every rank must call it, once per iteration)."""
        return _any_rank(self.received, device)


@contextlib.contextmanager
def exit_signal(name: Optional[str]) -> Iterator[Optional[ExitSignal]]:
    """An ExitSignal catching signal `name` for the length of the block (None: the signal keeps its
    default action, which ends the process)."""
    if name is None:
        yield None
        return
    caught = ExitSignal(name)
    signum = getattr(signal, name)
    previous = signal.signal(signum, caught.note)
    try:
        yield caught
    finally:
        signal.signal(signum, previous)
