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


def _recording_sink(monkeypatch, tmp_path):
    """The TensorBoard sink over a recording stand-in: torch.utils.tensorboard needs the tensorboard package,
    absent here."""
    module = types.ModuleType("torch.utils.tensorboard")
    module.SummaryWriter = _Writer
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", module)
    monkeypatch.setattr(tensorboard_log, "tensorboard_available", lambda: True)
    sink = tensorboard_log.open_sink(str(tmp_path))
    return sink


def test_sink_writes_loss_learning_rate_throughput_and_validation(monkeypatch, tmp_path):
    sink = _recording_sink(monkeypatch, tmp_path)
    sink.iteration(3, StepResult(loss=2.5, grad_norm=0.5), learning_rate=1e-3, tokens_per_s=100.0)
    sink.validation(3, 2.25)
    assert sink.writer.log_dir == str(tmp_path)
    assert ("lm loss", 2.5, 3) in sink.writer.scalars and ("learning-rate", 1e-3, 3) in sink.writer.scalars
    assert ("throughput/tokens-per-second", 100.0, 3) in sink.writer.scalars
    assert ("lm loss validation", 2.25, 3) in sink.writer.scalars


def test_sink_writes_moe_and_mtp_losses_under_megatron_lms_names(monkeypatch, tmp_path):
    """track_moe_metrics' and MTPLossLoggingHelper.track_mtp_metrics' tags: the loss names of the log line."""
    sink = _recording_sink(monkeypatch, tmp_path)
    result = StepResult(loss=2.5, grad_norm=0.5, moe_losses=(("load_balancing_loss", 1.25),),
                        mtp_losses=(("mtp_1 loss", 2.75), ("mtp_2 loss", 3.0)))
    sink.iteration(4, result, learning_rate=1e-3, tokens_per_s=100.0)
    for tag, value in (("load_balancing_loss", 1.25), ("mtp_1 loss", 2.75), ("mtp_2 loss", 3.0)):
        assert (tag, value, 4) in sink.writer.scalars


def test_no_sink_without_a_directory_or_the_package(monkeypatch, tmp_path):
    assert tensorboard_log.open_sink(None) is None
    monkeypatch.setattr(tensorboard_log, "tensorboard_available", lambda: False)
    assert tensorboard_log.open_sink(str(tmp_path)) is None


def test_wandb_sink_starts_a_run_as_megatron_lm_does_and_logs_the_same_scalars(monkeypatch, tmp_path):
    # wandb is not installed here: a recording stand-in for the module.
    from megatron_auto.runtime.settings import TrainSettings

    calls = []
    module = types.ModuleType("wandb")
    module.init = lambda **options: calls.append(("init", options))
    module.log = lambda scalars, step: calls.append(("log", scalars, step))
    monkeypatch.setitem(sys.modules, "wandb", module)
    monkeypatch.setattr(tensorboard_log, "wandb_available", lambda: True)
    monkeypatch.setattr(tensorboard_log, "tensorboard_available", lambda: False)
    settings = TrainSettings(wandb_project="proj", wandb_exp_name="run", save=str(tmp_path / "ckpt"), lr=3e-4)
    sinks = tensorboard_log.open_sinks(settings)
    sinks.iteration(3, StepResult(loss=2.5, grad_norm=0.5), 1e-3, 100.0)
    sinks.validation(3, 2.25)
    init = calls[0][1]
    # Megatron-LM's _set_wandb_writer: dir defaults to SAVE/wandb, the run's arguments as its config.
    assert (init["dir"], init["name"], init["project"]) == (str(tmp_path / "ckpt" / "wandb"), "run", "proj")
    assert init["config"]["lr"] == 3e-4 and "entity" not in init and (tmp_path / "ckpt" / "wandb").is_dir()
    assert calls[1][0] == "log" and calls[1][1]["lm loss"] == 2.5 and calls[1][1]["learning-rate"] == 1e-3
    assert calls[1][2] == 3 and calls[2] == ("log", {"lm loss validation": 2.25}, 3)


def test_no_sinks_without_the_flags_or_the_packages(monkeypatch, tmp_path):
    from megatron_auto.runtime.settings import TrainSettings

    assert tensorboard_log.open_sinks(TrainSettings()) is None
    monkeypatch.setattr(tensorboard_log, "wandb_available", lambda: False)
    monkeypatch.setattr(tensorboard_log, "tensorboard_available", lambda: False)
    assert tensorboard_log.open_sinks(TrainSettings(wandb_project="p", wandb_exp_name="e",
                                                    tensorboard_dir=str(tmp_path))) is None
