"""pretrain_gpt.py --auto-parallel-memory-margin reaches the search's TrainingSpec (same default as plan)."""
from __future__ import annotations

import pytest

from megatron_auto import train

FLAGS = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
         "--max-position-embeddings", "32", "--micro-batch-size", "1", "--global-batch-size", "4",
         "--train-iters", "1", "--lr", "1e-4", "--mock-data", "--tokenizer-type", "NullTokenizer",
         "--vocab-size", "128", "--auto-parallel"]


@pytest.mark.parametrize("extra, expected", [([], None), (["--auto-parallel-memory-margin", "0.1"], 0.1)])
def test_margin_flag_reaches_the_search(monkeypatch, extra, expected):
    from megatron_auto.runtime import planning

    seen = {}
    monkeypatch.setattr(planning, "search_for_job",
                        lambda model, world, cluster, training, *rest, **options: seen.update(training=training,
                                                                                              **options))
    args = train.parse_args(FLAGS + extra)
    model = train.model_from_args(args, 128)
    train.choose_plan(args, model, 1, train.settings_from_args(args, 128))
    # None: the cluster's default margin, the one `megatron-auto plan` uses without --memory-margin.
    assert seen["training"].memory_margin == expected
    assert seen["choose_recompute_modules"]  # no --recompute-modules: the planner chooses the set


def test_margin_flag_rejects_a_fraction_out_of_range():
    with pytest.raises(SystemExit) as exit_info:
        train.parse_args(FLAGS + ["--auto-parallel-memory-margin", "1.5"])
    assert exit_info.value.code == 2
