"""Scalars of a run under Megatron-LM's tag names: TensorBoard (--tensorboard-dir) when the
`tensorboard` package imports (torch.utils.tensorboard needs it), Weights & Biases (--wandb-project,
--wandb-exp-name, --wandb-save-dir, --wandb-entity; megatron/training/global_vars.py's
_set_wandb_writer) when `wandb` imports; otherwise the flags are named in the log as without effect
(tools/pretrain_gpt.py)."""
from __future__ import annotations

import dataclasses
import functools
import importlib.util
import os
from typing import Optional

from .step import StepResult


@functools.lru_cache(maxsize=None)
def tensorboard_available() -> bool:
    """Whether torch.utils.tensorboard can write (it needs the tensorboard package)."""
    return importlib.util.find_spec("tensorboard") is not None


@functools.lru_cache(maxsize=None)
def wandb_available() -> bool:
    """Whether the wandb package imports."""
    return importlib.util.find_spec("wandb") is not None


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
        for name, value in result.extra_losses:  # Megatron-LM's track_moe_metrics / track_mtp_metrics names
            self.writer.add_scalar(name, value, iteration)
        if torch.cuda.is_available():
            self.writer.add_scalar("mem-max-allocated-bytes", torch.cuda.max_memory_allocated(), iteration)
        self.writer.flush()

    def validation(self, iteration: int, loss: float) -> None:
        self.writer.add_scalar("lm loss validation", loss, iteration)
        self.writer.flush()


class WandbSink:
    """Writes one run's scalars to a Weights & Biases run, as Megatron-LM's wandb writer does."""

    def __init__(self, settings) -> None:
        import wandb

        directory = settings.wandb_save_dir or os.path.join(settings.save or ".", "wandb")
        os.makedirs(directory, exist_ok=True)
        options = dict(dir=directory, name=settings.wandb_exp_name, project=settings.wandb_project,
                       config=dataclasses.asdict(settings))
        if settings.wandb_entity:
            options["entity"] = settings.wandb_entity
        self.writer = wandb
        wandb.init(**options)

    def iteration(self, iteration: int, result: StepResult, learning_rate: float, tokens_per_s: float) -> None:
        scalars = {"lm loss": result.loss, "learning-rate": learning_rate, "grad-norm": result.grad_norm,
                   "throughput/tokens-per-second": tokens_per_s}
        if result.loss_scale is not None:
            scalars["loss-scale"] = result.loss_scale
        scalars.update(result.extra_losses)
        self.writer.log(scalars, iteration)

    def validation(self, iteration: int, loss: float) -> None:
        self.writer.log({"lm loss validation": loss}, iteration)


class Sinks:
    """Every open sink, written together."""

    def __init__(self, sinks: list) -> None:
        self.sinks = sinks

    def iteration(self, *args) -> None:
        for sink in self.sinks:
            sink.iteration(*args)

    def validation(self, *args) -> None:
        for sink in self.sinks:
            sink.validation(*args)


def open_sink(directory: Optional[str]) -> Optional[ScalarSink]:
    """A sink writing to `directory`, or None without a directory or the tensorboard package."""
    if not directory or not tensorboard_available():
        return None
    return ScalarSink(directory)


def open_sinks(settings) -> Optional[Sinks]:
    """The run's sinks (TrainSettings: TensorBoard and/or wandb, each when asked for and installed), or None."""
    sinks = [sink for sink in (open_sink(settings.tensorboard_dir),) if sink is not None]
    if settings.wandb_project and wandb_available():
        sinks.append(WandbSink(settings))
    return Sinks(sinks) if sinks else None
