"""Issue 40: --mtp-num-layers with --pipeline-model-parallel-layout. The layout's MTP layers (m) after the last
chunk's decoder layers put them where Megatron-Core puts them without a layout (the last stage's last chunk): the
run is the run of the same split given by --decoder-first-pipeline-num-layers, to the bit. A layout whose count of
m differs from --mtp-num-layers, or that gives MTP a stage of its own, is refused with one line."""
from __future__ import annotations

import re

import pytest

from validation.launcher import launch, rank_env, run_script

ARGV = ["tools/pretrain_gpt.py", "--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4",
        "--seq-length", "64", "--max-position-embeddings", "64", "--micro-batch-size", "2", "--global-batch-size",
        "8", "--train-iters", "6", "--lr", "3e-3", "--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size",
        "512", "--log-interval", "1", "--eval-iters", "0", "--position-embedding-type", "rope", "--mtp-num-layers",
        "1", "--pipeline-model-parallel-size", "2"]


def _logged(output: str) -> list[tuple[str, str, str]]:
    return re.findall(r"lm loss: (\S+) \| mtp_1 loss: (\S+) \| grad norm: (\S+) \|", output)


def test_a_layout_with_the_mtp_layer_runs_as_the_same_split_without_it(tmp_path):
    runs = [launch(2, [*ARGV, *split], timeout_s=300, log_dir=tmp_path / name) for name, split in (
        ("layout", ["--pipeline-model-parallel-layout", "Et*3|tmL"]),
        ("first", ["--decoder-first-pipeline-num-layers", "3"]))]
    assert all(run.ok for run in runs), runs[0].output[-3000:] + runs[1].output[-3000:]
    layout, first = (_logged(run.output) for run in runs)
    assert len(layout) == 6 and layout == first


@pytest.mark.parametrize("layout, words", [("Et*3|tL", "places 0 multi-token-prediction layers"),
                                           ("Et*3m|tL", "go in one chunk, after every decoder layer"),
                                           ("Et*2|t*2|m|L", "a stage of their own (Megatron-Core's standalone MTP)")])
def test_a_misplaced_mtp_layer_is_one_line_and_exit_2(layout, words):
    done = run_script([*ARGV, "--pipeline-model-parallel-layout", layout, "--auto-parallel-dry-run"],
                      rank_env(0, 2, 29999), 120, fresh=True)
    assert done.returncode == 2 and words in done.stderr and done.stderr.count("\n") == 1, done.stderr
