"""`--auto-parallel` and the flags it prints build the same job (benchmarks/bench_auto_vs_manual.py times the two)."""
from __future__ import annotations

import dataclasses

from megatron_auto import train
from megatron_auto.megatron_flags import megatron_flags
from megatron_auto.runtime.layout import layout_from_plan
from megatron_auto.runtime.tokenizers import tokenizer_from_flags

README_JOB = ["--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "64",
              "--max-position-embeddings", "64", "--global-batch-size", "16", "--train-iters", "45",
              "--lr", "3e-3", "--mock-data", "--tokenizer-type", "ByteTokenizer"]


def _plan(argv: list[str]):
    args = train.parse_args(argv)
    vocab = tokenizer_from_flags(args).vocab_size
    settings = train.settings_from_args(args, vocab)
    return train.choose_plan(args, train.model_from_args(args, vocab), 4, settings)


def test_printed_flags_rebuild_the_auto_plan():
    auto = _plan([*README_JOB, "--micro-batch-size", "2", "--auto-parallel"])
    manual = _plan([*README_JOB, *megatron_flags(auto)])
    assert layout_from_plan(auto) == layout_from_plan(manual)
    # Only the labels differ: where the plan came from and what the planner predicted for it.
    assert dataclasses.replace(auto, cluster="", prediction=None, model=None) == \
        dataclasses.replace(manual, cluster="", prediction=None, model=None)
