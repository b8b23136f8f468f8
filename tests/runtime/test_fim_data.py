"""`--fim-data` and the `--fim-*` flags (runtime/fim.py): Megatron-LM's fill-in-the-middle samples over a
dataset written here with a HuggingFace tokenizer that holds the FIM sentinel tokens, the flags reaching the
data, bad combinations as one line and exit status 2, and a short 2-rank run whose loss falls."""
from __future__ import annotations

import re
from collections import Counter

import numpy as np
import pytest

import tokenizer_files
from validation.launcher import launch, rank_env, run_script
from megatron_auto.runtime.fim import token_ids, tokenizer_for
from megatron_auto.runtime.gpt_data import GPTDatasets
from megatron_auto.runtime.settings import DataSettings, FimSettings
from megatron_auto.runtime.tokenizers import make_tokenizer
from megatron_auto.runtime.file_tokenizers import TokenizerFiles

SENTINELS = ["<fim_prefix>", "<fim_middle>", "<fim_suffix>", "<fim_pad>"]
SEQ = 32
TINY = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "2", "--seq-length", str(SEQ),
        "--max-position-embeddings", str(SEQ), "--micro-batch-size", "2", "--global-batch-size", "8",
        "--train-iters", "8", "--lr", "3e-3", "--log-interval", "1", "--eval-iters", "0"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> tuple[str, list[str]]:
    """(dataset prefix, tokenizer flags): the corpus tokenized by a byte-level BPE holding FIM's sentinels."""
    from tokenizers import Tokenizer

    root = tmp_path_factory.mktemp("fim")
    directory = tokenizer_files.hugging_face_dir(root / "hf")
    model = Tokenizer.from_file(str(directory / "tokenizer.json"))
    model.add_special_tokens(SENTINELS)
    model.save(str(directory / "tokenizer.json"))
    flags = ["--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", str(directory)]
    done = run_script(["tools/preprocess_data.py", "--input", "data/tiny_corpus.jsonl", "--output-prefix",
                       str(root / "c"), "--append-eod", *flags], rank_env(0, 1, 0), timeout_s=300)
    assert done.returncode == 0, done.stderr
    return str(root / "c_text_document"), flags


def _data(prefix: str, flags: list[str], **fim) -> DataSettings:
    tokenizer = make_tokenizer("HuggingFaceTokenizer", None, TokenizerFiles(tokenizer_model=flags[-1]))
    settings = FimSettings(**fim, tokenizer_type="HuggingFaceTokenizer",
                           tokenizer_files=TokenizerFiles(tokenizer_model=flags[-1])) if fim else None
    return DataSettings(blend=(prefix,), vocab_size=tokenizer.vocab_size, eod=tokenizer.eod, split="1,0,0",
                        fim=settings)


def _tokens(data: DataSettings, count: int = 8) -> list[np.ndarray]:
    source = GPTDatasets(data, SEQ, 1234, [count, 0, 0], evaluates=False)
    return [np.concatenate([s["tokens"].numpy(), s["labels"].numpy()[-1:]])
            for s in (source.sample(i) for i in range(count))]


def test_fim_samples_from_an_indexed_dataset(corpus):
    prefix, flags = corpus
    plain = _tokens(_data(prefix, flags))
    assert all(np.array_equal(a, b) for a, b in zip(plain, _tokens(_data(prefix, flags, rate=0.0))))
    fim = _data(prefix, flags, rate=1.0, spm_rate=0.0)
    ids = token_ids(fim.fim, tokenizer_for(fim.fim))
    psm, again = _tokens(fim), _tokens(fim)
    assert all(np.array_equal(a, b) for a, b in zip(psm, again))  # the seed fixes every sample
    for before, after in zip(plain, psm):
        assert after.shape == before.shape == (SEQ + 1,)
        tokens = after.tolist()
        assert tokens[0] == ids.prefix
        first = tokens[:tokens.index(ids.eod)] if ids.eod in tokens else tokens  # may be cut at the end
        order = [t for t in first if t in (ids.prefix, ids.suffix, ids.middle)]
        assert order == [ids.prefix, ids.suffix, ids.middle][:len(order)]
    assert sum(ids.middle in s.tolist() for s in psm) >= len(psm) // 2
    spm = _tokens(_data(prefix, flags, rate=1.0, spm_rate=1.0))
    assert all(s.tolist()[:2] == [ids.prefix, ids.suffix] for s in spm)
    # Re-tokenizing the three parts changes BPE merges at the cuts, but the text is the same text.
    codec = tokenizer_for(fim.fim)
    specials = {ids.prefix, ids.middle, ids.suffix, ids.pad}
    for before, after in zip(plain, psm):
        text = Counter(codec.detokenize([t for t in after.tolist() if t not in specials]))
        assert sum((text - Counter(codec.detokenize(before.tolist()))).values()) <= 6


def test_the_flags_reach_the_data(corpus):
    from megatron_auto.train import parse_args
    from megatron_auto.train.settings import data_from_args

    prefix, flags = corpus
    args = parse_args([*TINY, *flags, "--data-path", prefix, "--fim-data", "--fim-rate", "0.25",
                       "--fim-spm-rate", "0.75", "--fim-split-sample", "<fim_pad>", "--fim-fragment-rate", "0.5",
                       "--fim-no-prefix", "#"])
    fim = data_from_args(args, 404).fim
    assert (fim.rate, fim.spm_rate, fim.split_sample, fim.fragment_rate, fim.no_prefix) == (
        0.25, 0.75, "<fim_pad>", 0.5, "#")
    assert (fim.prefix_token, fim.eod_token) == ("<fim_prefix>", "<|endoftext|>")  # Megatron-LM's defaults
    assert data_from_args(parse_args([*TINY, *flags, "--data-path", prefix, "--fim-rate", "0.3"]), 404).fim is None


@pytest.mark.parametrize("extra, message", [
    (["--mock-data", "--fim-data"], "--fim-data: fill-in-the-middle samples are built from --data-path"),
    (["DATA", "--fim-data", "--fim-rate", "1.5"], "--fim-rate 1.5: a probability"),
    (["DATA", "--fim-data", "--fim-split-sample", "<fim_pad>"], "--fim-split-sample needs --fim-fragment-rate"),
    (["DATA", "--fim-data", "--fim-middle-token", "<no_such>"], "--fim-middle-token '<no_such>'"),
])
def test_bad_fim_flags_are_one_line_and_exit_2(corpus, capsys, extra, message):
    from megatron_auto.train import main

    prefix, flags = corpus
    extra = ["--data-path", prefix, *extra[1:]] if extra[0] == "DATA" else extra
    assert main([*TINY, *flags, *extra, "--auto-parallel-dry-run"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


def test_two_ranks_train_on_fim_samples_and_the_loss_falls(corpus, tmp_path):
    prefix, flags = corpus
    result = launch(2, ["tools/pretrain_gpt.py", *TINY, *flags, "--data-path", prefix, "--split", "1,0,0",
                        "--fim-data", "--fim-rate", "0.5", "--fim-spm-rate", "0.5",
                        "--data-cache-path", str(tmp_path / "cache")], timeout_s=300, log_dir=tmp_path)
    assert result.ok, result.output[-4000:]
    assert "fill-in-the-middle: rate 0.5, SPM rate 0.5" in result.output
    losses = [float(x) for x in re.findall(r"iteration +\d+/ +8 \|.*\| lm loss: (\S+) \|", result.output)]
    assert len(losses) == 8 and sum(losses[-2:]) / 2 < losses[0] - 0.1, losses
