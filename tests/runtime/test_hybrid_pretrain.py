"""tools/pretrain_gpt.py --auto-parallel --auto-parallel-space hybrid trains end to end on 4 gloo ranks."""
from __future__ import annotations

import re

from launcher import launch

TINY = ["--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
        "--max-position-embeddings", "32", "--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", "256"]


def test_hybrid_auto_parallel_trains_on_four_ranks(tmp_path):
    argv = ["tools/pretrain_gpt.py", *TINY, "--micro-batch-size", "2", "--global-batch-size", "8",
            "--train-iters", "6", "--lr", "3e-3", "--log-interval", "1", "--auto-parallel",
            "--auto-parallel-space", "hybrid", "--auto-parallel-cluster", "cpu-gloo"]
    result = launch(4, argv, timeout_s=180, log_dir=tmp_path)
    assert result.ok, result.output[-4000:]
    losses = [float(x) for x in re.findall(r"iteration +\d+/ +6 \|.*\| lm loss: (\S+) \|", result.output)]
    assert len(losses) == 6 and all(0 < x < 10 for x in losses)
    assert losses[-1] < losses[0], f"loss did not go down: {losses}"
    # The hybrid space contains the megatron one: on cpu-gloo, where nothing hides
    # communication, the uniform ZeRO-1 plan wins; the table names the winner's space.
    assert re.search(r"plan \((hybrid|megatron) space\)", result.output), result.output[-4000:]
