"""TensorBoard scalars of a run (--tensorboard-dir), under Megatron-LM's tag names, when the
`tensorboard` package imports (torch.utils.tensorboard needs it); otherwise the flag is named in
the log as without effect (tools/pretrain_gpt.py)."""
from __future__ import annotations

import functools
import importlib.util
from typing import Optional

from .step import StepResult


@functools.lru_cache(maxsize=None)
def tensorboard_available() -> bool:
    """Whether torch.utils.tensorboard can write (it needs the tensorboard package)."""
    return importlib.util.find_spec("tensorboard") is not None


class ScalarSink:
    """Writes one run's scalars: loss, learning rate, throughput, memory, validation loss."""

    def __init__(self, directory: str) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=directory)

    def iteration(self, iteration: int, result: StepResult, learning_rate: float, tokens_per_s: float) -> None:
        import torch

        self.writer.add_scalar("lm loss", result.loss, iteration)
        self.writer.add_scalar("learning-rate", learning_rate, iteration)
        self.writer.add_scalar("grad-norm", result.grad_norm, iteration)
        self.writer.add_scalar("throughput/tokens-per-second", tokens_per_s, iteration)
        if result.loss_scale is not None:
            self.writer.add_scalar("loss-scale", result.loss_scale, iteration)
        if torch.cuda.is_available():
            self.writer.add_scalar("mem-max-allocated-bytes", torch.cuda.max_memory_allocated(), iteration)
        self.writer.flush()

    def validation(self, iteration: int, loss: float) -> None:
        self.writer.add_scalar("lm loss validation", loss, iteration)
        self.writer.flush()


def open_sink(directory: Optional[str]) -> Optional[ScalarSink]:
    """A sink writing to `directory`, or None without a directory or the tensorboard package."""
    if not directory or not tensorboard_available():
        return None
    return ScalarSink(directory)
