"""tools/pretrain_gpt.py's Megatron-LM flag handling, without a launch."""
from __future__ import annotations

import importlib.util
import logging

import pytest

from launcher import REPO
from megatron_auto.specs.presets import MODEL_PRESETS


def _load_pretrain_gpt():
    spec = importlib.util.spec_from_file_location("pretrain_gpt", REPO / "tools" / "pretrain_gpt.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


pretrain_gpt = _load_pretrain_gpt()
BASE = ["--num-layers", "32", "--hidden-size", "4096", "--num-attention-heads", "32", "--seq-length", "8192",
        "--train-iters", "10", "--mock-data"]
LLAMA3 = ["--group-query-attention", "--num-query-groups", "8", "--ffn-hidden-size", "14336", "--swiglu",
          "--normalization", "RMSNorm", "--disable-bias-linear", "--position-embedding-type", "rope",
          "--rotary-base", "500000", "--untie-embeddings-and-output-weights"]


def test_llama3_launch_flags_describe_the_llama3_preset():
    args = pretrain_gpt.parse_args(BASE + LLAMA3)
    model = pretrain_gpt.model_from_args(args, 128256)
    preset = MODEL_PRESETS["llama3-8b"]
    assert model.layers == preset.layers
    assert (model.position_embedding_type, model.rotary_base) == ("rope", 500000)
    assert model.num_parameters == preset.num_parameters


@pytest.mark.parametrize("flags, expected", [
    ([], "learned_absolute"),
    (["--position-embedding-type", "rope"], "rope"),
    (["--use-rotary-position-embeddings", "--no-position-embedding"], "rope"),
    (["--no-position-embedding"], "none"),
])
def test_position_embedding_type_follows_megatron_lm(flags, expected):
    assert pretrain_gpt.position_embedding_type(pretrain_gpt.parse_args(BASE + flags)) == expected


def test_kernel_and_logging_flags_are_accepted_and_named():
    args = pretrain_gpt.parse_args(BASE + ["--use-flash-attn", "--transformer-impl", "local",
                                           "--tensorboard-dir", "/tmp/tb", "--overlap-grad-reduce"])
    assert pretrain_gpt.no_effect_flags(args) == ["--use-flash-attn", "--overlap-grad-reduce",
                                                  "--transformer-impl", "--tensorboard-dir"]
    assert pretrain_gpt.no_effect_flags(pretrain_gpt.parse_args(BASE)) == []


@pytest.mark.parametrize("flags, on_gpu, priced", [
    ([], True, ("flash", "fused")),
    ([], False, ("unfused", "foreach")),
    (["--attention-backend", "fused", "--optimizer-impl", "foreach"], True, ("flash", "foreach")),
    (["--attention-backend", "local", "--optimizer-impl", "fused"], False, ("unfused", "fused")),
])
def test_kernel_flags_reach_the_settings_and_the_searched_training_spec(monkeypatch, flags, on_gpu, priced):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: on_gpu)
    args = pretrain_gpt.parse_args(BASE + flags)
    settings = pretrain_gpt.settings_from_args(args, 512)
    requested = (flags[1], flags[3]) if flags else ("auto", "auto")
    assert (settings.attention_backend, settings.optimizer_impl) == requested
    training = pretrain_gpt.training_for_job(args, settings, world_size=4)
    assert (training.attention_backend, training.optimizer_impl) == priced


@pytest.mark.parametrize("flags, fusions", [
    ([], (True, True)),
    (["--no-bias-gelu-fusion"], (False, True)),
    (["--no-bias-swiglu-fusion"], (True, True)),  # GeLU model: the SwiGLU flag does not apply
    (["--swiglu", "--no-bias-swiglu-fusion", "--no-bias-dropout-fusion"], (False, False)),
])
def test_megatron_fusion_switches_take_effect(flags, fusions):
    args = pretrain_gpt.parse_args(BASE + flags)
    settings = pretrain_gpt.settings_from_args(args, 512)
    assert (settings.bias_activation_fusion, settings.bias_dropout_fusion) == fusions
    assert pretrain_gpt.no_effect_flags(args) == []


def test_unknown_attention_backend_exits_2():
    with pytest.raises(SystemExit) as exit_info:
        pretrain_gpt.parse_args(BASE + ["--attention-backend", "triton"])
    assert exit_info.value.code == 2


def test_warmup_fraction_counts_decay_iterations():
    args = pretrain_gpt.parse_args(BASE + ["--lr-warmup-fraction", "0.2", "--lr-decay-iters", "50"])
    assert args.lr_warmup_iters == 10


def test_unknown_normalization_exits_2(capsys):
    with pytest.raises(SystemExit) as exit_info:
        pretrain_gpt.parse_args(BASE + ["--normalization", "ScaleNorm"])
    assert exit_info.value.code == 2


VALIDATION_JOB = ["--num-layers", "4", "--hidden-size", "256", "--num-attention-heads", "8", "--seq-length", "128",
                  "--max-position-embeddings", "128", "--global-batch-size", "16", "--train-iters", "6",
                  "--mock-data", "--vocab-size", "512", "--auto-parallel", "--auto-parallel-cluster", "cpu-gloo"]
PROFILES = [str(REPO / "docs" / "profiles" / name) for name in ("cpu4_cluster.json", "cpu4_model.json")]


def _choose(flags):
    args = pretrain_gpt.parse_args(flags)
    model = pretrain_gpt.model_from_args(args, 513)
    return model, pretrain_gpt.choose_plan(args, model, 4, pretrain_gpt.settings_from_args(args, 513))


def test_auto_parallel_profile_prices_the_search_from_the_measured_files():
    from dataclasses import replace

    from megatron_auto.search import search_plan
    from megatron_auto.specs.presets import CLUSTER_PRESETS
    from megatron_auto.specs.profiles import measured_costs
    from megatron_auto.specs.training import TrainingSpec

    model, profiled = _choose(VALIDATION_JOB + ["--auto-parallel-profile", *PROFILES])
    _, analytic = _choose(VALIDATION_JOB)
    cluster = replace(CLUSTER_PRESETS["cpu-gloo"], gpus_per_node=4, measured=measured_costs(PROFILES))
    expected = search_plan(model, cluster, TrainingSpec.fp32(16), "megatron").plan
    assert (profiled.chunks, profiled.num_micro_batches) == (expected.chunks, expected.num_micro_batches)
    assert profiled.prediction == expected.prediction
    assert profiled.prediction != analytic.prediction


def test_unreadable_auto_parallel_profile_is_a_user_error(tmp_path):
    from megatron_auto.errors import UserError

    broken = tmp_path / "cluster.json"
    broken.write_text("{not json")
    with pytest.raises(UserError):
        _choose(VALIDATION_JOB + ["--auto-parallel-profile", str(broken)])


@pytest.mark.parametrize("rank, level", [("0", logging.NOTSET), ("3", logging.WARNING)])
def test_only_rank_0_reports_the_search(monkeypatch, rank, level):
    search_logger = logging.getLogger("megatron_auto.search")
    monkeypatch.setattr(search_logger, "level", logging.NOTSET)
    monkeypatch.setenv("RANK", rank)
    monkeypatch.setattr(logging.getLogger("megatron"), "level", logging.getLogger("megatron").level)
    pretrain_gpt.configure_logging()
    assert search_logger.level == level


def test_fp16_loss_scaling_flags_reach_the_settings_and_megatrons_optimizer_config():
    from megatron_auto.runtime.config import optimizer_config
    from megatron_auto.runtime.layout import MegatronLayout

    layout = MegatronLayout(tensor_parallel=1, pipeline_parallel=1, data_parallel=1, micro_batch_size=1,
                            num_micro_batches=1, global_batch_size=1)
    args = pretrain_gpt.parse_args(BASE + ["--fp16", "--initial-loss-scale", "65536", "--min-loss-scale", "2",
                                           "--loss-scale-window", "50", "--hysteresis", "3"])
    settings = pretrain_gpt.settings_from_args(args, 256)
    assert settings.precision == "fp16"
    config = optimizer_config(layout, settings)
    assert (config.fp16, config.bf16, config.loss_scale) == (True, False, None)  # None: dynamic scaling
    assert (config.initial_loss_scale, config.min_loss_scale, config.loss_scale_window, config.hysteresis) == \
        (65536.0, 2.0, 50, 3)
    constant = pretrain_gpt.settings_from_args(pretrain_gpt.parse_args(BASE + ["--fp16", "--loss-scale", "128"]), 256)
    assert optimizer_config(layout, constant).loss_scale == 128.0
    defaults = pretrain_gpt.settings_from_args(pretrain_gpt.parse_args(BASE + ["--fp16"]), 256)
    assert defaults.initial_loss_scale == 2.0**32  # Megatron-LM's default


@pytest.mark.parametrize("flags, message", [
    (["--bf16", "--fp16"], "mutually exclusive"),
    (["--fp16", "--hysteresis", "0"], "--hysteresis must be at least 1"),
    (["--fp16", "--loss-scale", "-1"], "--loss-scale must be positive"),
])
def test_bad_precision_flags_are_user_errors(flags, message):
    from megatron_auto.errors import UserError

    with pytest.raises(UserError, match=message):
        pretrain_gpt.settings_from_args(pretrain_gpt.parse_args(BASE + flags), 256)
