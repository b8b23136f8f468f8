"""--tensorboard-dir: scalars under Megatron-LM's tags when tensorboard imports, nothing otherwise."""
from __future__ import annotations

import sys
import types

from megatron_auto.runtime import tensorboard_log
from megatron_auto.runtime.step import StepResult


class _Writer:
    def __init__(self, log_dir: str) -> None:
        self.log_dir, self.scalars = log_dir, []

    def add_scalar(self, tag, value, step) -> None:
        self.scalars.append((tag, value, step))

    def flush(self) -> None:
        pass


def test_sink_writes_loss_learning_rate_throughput_and_validation(monkeypatch, tmp_path):
    # torch.utils.tensorboard needs the tensorboard package (absent here): a recording stand-in.
    module = types.ModuleType("torch.utils.tensorboard")
    module.SummaryWriter = _Writer
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", module)
    monkeypatch.setattr(tensorboard_log, "tensorboard_available", lambda: True)
    sink = tensorboard_log.open_sink(str(tmp_path))
    sink.iteration(3, StepResult(loss=2.5, grad_norm=0.5), learning_rate=1e-3, tokens_per_s=100.0)
    sink.validation(3, 2.25)
    assert sink.writer.log_dir == str(tmp_path)
    assert ("lm loss", 2.5, 3) in sink.writer.scalars and ("learning-rate", 1e-3, 3) in sink.writer.scalars
    assert ("throughput/tokens-per-second", 100.0, 3) in sink.writer.scalars
    assert ("lm loss validation", 2.25, 3) in sink.writer.scalars


def test_no_sink_without_a_directory_or_the_package(monkeypatch, tmp_path):
    assert tensorboard_log.open_sink(None) is None
    monkeypatch.setattr(tensorboard_log, "tensorboard_available", lambda: False)
    assert tensorboard_log.open_sink(str(tmp_path)) is None
