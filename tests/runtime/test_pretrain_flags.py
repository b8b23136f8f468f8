"""tools/pretrain_gpt.py's Megatron-LM flag handling, without a launch."""
from __future__ import annotations

import importlib.util

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


def test_warmup_fraction_counts_decay_iterations():
    args = pretrain_gpt.parse_args(BASE + ["--lr-warmup-fraction", "0.2", "--lr-decay-iters", "50"])
    assert args.lr_warmup_iters == 10


def test_unknown_normalization_exits_2(capsys):
    with pytest.raises(SystemExit) as exit_info:
        pretrain_gpt.parse_args(BASE + ["--normalization", "ScaleNorm"])
    assert exit_info.value.code == 2
