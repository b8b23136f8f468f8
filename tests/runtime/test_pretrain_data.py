"""preprocess_data -> pretrain_gpt on 2 CPU ranks with real tokenizers (GPT-2 BPE, SentencePiece),
Megatron-LM's data flags: a weighted blend, --split, --no-mmap-bin-files, --data-cache-path, and datasets of
each split's own (--train-data-path, --valid-data-path)."""
from __future__ import annotations

import re

import pytest

import tokenizer_files
from validation.launcher import launch, rank_env, run_script

TINY = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "2", "--seq-length", "32",
        "--max-position-embeddings", "32", "--micro-batch-size", "2", "--global-batch-size", "8",
        "--train-iters", "8", "--lr", "3e-3", "--log-interval", "1", "--eval-interval", "4", "--eval-iters", "1"]


def _preprocess(prefix, tokenizer_flags: list[str]) -> str:
    done = run_script(["tools/preprocess_data.py", "--input", "data/tiny_corpus.jsonl", "--output-prefix", str(prefix),
                       "--append-eod", *tokenizer_flags], rank_env(0, 1, 0), timeout_s=300)
    assert done.returncode == 0, done.stderr
    return f"{prefix}_text_document"


def _losses(output: str) -> list[float]:
    return [float(x) for x in re.findall(r"iteration +\d+/ +8 \|.*\| lm loss: (\S+) \|", output)]


def _train(tmp_path, argv: list[str]) -> str:
    result = launch(2, ["tools/pretrain_gpt.py", *TINY, *argv], timeout_s=300, log_dir=tmp_path)
    assert result.ok, result.output[-4000:]
    losses = _losses(result.output)
    assert len(losses) == 8
    # Learnable text from a fresh model: the loss falls within eight steps (it starts near ln(vocabulary)).
    assert sum(losses[-2:]) / 2 < losses[0] - 0.1
    # Every --eval-interval 4 of the 8 iterations, and once more at the end, as Megatron-LM does.
    assert result.output.count("validation loss at iteration") == 3
    assert result.output.count("(end of training)") == 1
    return result.output


def test_gpt2_bpe_data_trains_with_split(tmp_path):
    vocab, merges = tokenizer_files.gpt2_files(tmp_path / "gpt2")
    files = ["--vocab-file", str(vocab), "--merge-file", str(merges)]
    prefix = _preprocess(tmp_path / "gpt2", ["--tokenizer-type", "GPT2BPETokenizer", *files])
    # Megatron-LM's examples/gpt3 data flags, no --tokenizer-type: pretrain_gpt's default is GPT-2 BPE.
    output = _train(tmp_path, [*files, "--data-path", prefix, "--split", "949,50,1",
                               "--tensor-model-parallel-size", "2"])
    assert "tokenizer: GPT2BPETokenizer, vocabulary 400, end of document 0" in output
    # Megatron-LM's sizes: 8 iterations x 8 samples; (8 // 4 + 1) evaluations x 1 x 8; 1 x 8.
    assert f"data: {prefix}, split 949,50,1; samples needed 64/24/8 (train/eval/test)" in output


def test_sentencepiece_blend_trains_without_mmap_and_with_a_cache_dir(tmp_path):
    model = tokenizer_files.sentencepiece_model(tmp_path)
    flags = ["--tokenizer-type", "SentencePieceTokenizer", "--tokenizer-model", str(model)]
    first = _preprocess(tmp_path / "a", flags)
    second = _preprocess(tmp_path / "b", flags)
    cache = tmp_path / "cache"
    output = _train(tmp_path, [*flags, "--data-path", "0.3", first, "0.7", second, "--split", "90,10,0",
                               "--no-mmap-bin-files", "--data-cache-path", str(cache),
                               "--no-create-attention-mask-in-dataloader"])
    assert "tokenizer: SentencePieceTokenizer, vocabulary 300" in output
    assert "--no-create-attention-mask-in-dataloader: without effect here" in output
    assert any(cache.rglob("*.npy"))  # megatron-core cached its indices where it was told


def test_each_split_trains_and_validates_on_its_own_datasets(tmp_path):
    """--train-data-path and --valid-data-path as Megatron-LM's blend_per_split: the training split blends its
    two datasets whole, validation reads its own, and no test split is built."""
    vocab, merges = tokenizer_files.gpt2_files(tmp_path / "gpt2")
    files = ["--vocab-file", str(vocab), "--merge-file", str(merges)]
    first, second, held_out = (_preprocess(tmp_path / name, ["--tokenizer-type", "GPT2BPETokenizer", *files])
                               for name in ("a", "b", "held_out"))
    output = _train(tmp_path, [*files, "--train-data-path", "0.5", first, "0.5", second,
                               "--valid-data-path", held_out])
    line = re.search(r"^data: .*$", output, re.M).group(0)
    # A split of one dataset is built whole (megatron-core builds a blend's parts to the requested size).
    assert re.fullmatch(f"data: train 0.5 {first} 0.5 {second}; eval {held_out}; test \\(none\\); samples needed "
                        r"64/24/8 \(train/eval/test\), built train 64, eval \d+, test 0", line), line


@pytest.mark.parametrize("flags, message", [
    (["--train-data-path", "p", "--data-path", "q"], "give --train-data-path or --data-path, not both"),
    (["--valid-data-path", "p"], "--valid-data-path needs --train-data-path"),
    (["--train-data-path", "p", "--split", "90,10,0"], "--split divides --data-path's datasets"),
])
def test_per_split_data_flags_that_do_not_go_together_are_one_line(flags, message):
    from megatron_auto import train

    with pytest.raises(SystemExit) as stopped:
        train.parse_args(TINY + flags)
    assert stopped.value.code == 2
