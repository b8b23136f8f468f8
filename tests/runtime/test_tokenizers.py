"""Megatron-LM's tokenizer types from generated local files, and tools/preprocess_data.py with them."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

import tokenizer_files
from validation.launcher import REPO, rank_env, run_script
from megatron_auto.errors import UserError
from megatron_auto.runtime.tokenizers import TokenizerFiles, make_tokenizer

SPECIALS = 16  # --tiktoken-num-special-tokens of the tiktoken cases


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("tokenizer_files")
    vocab, merges = tokenizer_files.gpt2_files(root / "gpt2")
    tiktoken_path, entries = tokenizer_files.tiktoken_vocab(root / "tiktoken.json")
    return {"sp": tokenizer_files.sentencepiece_model(root), "vocab": vocab, "merges": merges,
            "hf": tokenizer_files.hugging_face_dir(root / "hf"), "tiktoken": tiktoken_path, "entries": entries}


def _tokenizer(kind: str, files: dict):
    if kind == "GPT2BPETokenizer":
        return make_tokenizer(kind, files=TokenizerFiles(vocab_file=str(files["vocab"]), merge_file=str(files["merges"])))
    if kind == "HuggingFaceTokenizer":
        return make_tokenizer(kind, files=TokenizerFiles(tokenizer_model=str(files["hf"])))
    if kind == "TikTokenizer":
        return make_tokenizer(kind, files["entries"] + SPECIALS,
                              TokenizerFiles(tokenizer_model=str(files["tiktoken"]), tiktoken_num_special_tokens=SPECIALS))
    return make_tokenizer(kind, files=TokenizerFiles(tokenizer_model=str(files["sp"])))


KINDS = ("GPT2BPETokenizer", "SentencePieceTokenizer", "GPTSentencePieceTokenizer", "Llama2Tokenizer",
         "HuggingFaceTokenizer", "TikTokenizer")


@pytest.mark.parametrize("kind", KINDS)
def test_round_trip_on_the_corpus(files, kind):
    tokenizer = _tokenizer(kind, files)
    texts = tokenizer_files.corpus_texts()[:50]
    for text in texts:
        ids = tokenizer.tokenize(text)
        assert ids and all(0 <= i < tokenizer.vocab_size for i in ids)
        assert tokenizer.eod not in ids  # a document's text never holds its end-of-document id
        assert tokenizer.detokenize(ids) == text
    # A learned vocabulary compresses the text: fewer tokens than bytes.
    assert sum(len(tokenizer.tokenize(t)) for t in texts) < 0.6 * sum(len(t.encode()) for t in texts)


def test_end_of_document_ids_follow_megatron(files):
    import sentencepiece

    vocab = json.loads(files["vocab"].read_text())
    gpt2 = _tokenizer("GPT2BPETokenizer", files)
    assert (gpt2.eod, gpt2.vocab_size) == (vocab["<|endoftext|>"], len(vocab))
    model = sentencepiece.SentencePieceProcessor(model_file=str(files["sp"]))
    for kind in ("SentencePieceTokenizer", "Llama2Tokenizer"):
        sp = _tokenizer(kind, files)
        assert (sp.eod, sp.vocab_size) == (model.eos_id(), model.get_piece_size())
    tik = _tokenizer("TikTokenizer", files)
    # megatron-core: ids below --tiktoken-num-special-tokens are special, "</s>" (index 2) ends a document.
    assert (tik.eod, tik.vocab_size) == (2, files["entries"] + SPECIALS)
    assert min(tik.tokenize("The cat")) >= SPECIALS


def test_gpt2_files_and_the_same_hugging_face_tokenizer_agree(files):
    gpt2, hf = _tokenizer("GPT2BPETokenizer", files), _tokenizer("HuggingFaceTokenizer", files)
    for text in tokenizer_files.corpus_texts()[:50]:
        assert gpt2.tokenize(text) == hf.tokenize(text)
    assert gpt2.eod == hf.eod and gpt2.vocab_size == hf.vocab_size


@pytest.mark.parametrize("kind, files_kwargs, vocab, message", [
    ("GPT2BPETokenizer", {"merge_file": "m.txt"}, None, "needs --vocab-file"),
    ("GPT2BPETokenizer", {"vocab_file": "/nonexistent/vocab.json", "merge_file": "m"}, None, "no such file"),
    ("SentencePieceTokenizer", {"tokenizer_model": "/nonexistent.model"}, None, "no such file"),
    ("HuggingFaceTokenizer", {"tokenizer_model": "/nonexistent-dir"}, None, "nothing is downloaded"),
    ("TikTokenizer", {"tokenizer_model": "/nonexistent.json"}, None, "no such file"),
])
def test_missing_files_are_one_line_user_errors(kind, files_kwargs, vocab, message):
    with pytest.raises(UserError, match=message):
        make_tokenizer(kind, vocab, TokenizerFiles(**files_kwargs))


def test_malformed_files_are_user_errors(files, tmp_path):
    garbage = tmp_path / "garbage.model"
    garbage.write_bytes(b"not a sentencepiece model")
    with pytest.raises(UserError, match="cannot load its files"):
        make_tokenizer("SentencePieceTokenizer", files=TokenizerFiles(tokenizer_model=str(garbage)))
    # Megatron's default tiktoken vocabulary (2**17) is larger than the tiny file holds.
    with pytest.raises(UserError, match=f"holds {files['entries']} tokens"):
        make_tokenizer("TikTokenizer", files=TokenizerFiles(tokenizer_model=str(files["tiktoken"])))


def _preprocess(args: list[str], fresh: bool = False) -> subprocess.CompletedProcess:
    """tools/preprocess_data.py, forked from the launcher's fork server (torch and megatron-core imported once), or
    a `fresh` interpreter where a test reads everything it prints."""
    return run_script(["tools/preprocess_data.py", "--input", "data/tiny_corpus.jsonl", *args], rank_env(0, 1, 0),
                      timeout_s=300, fresh=fresh)


@pytest.mark.parametrize("append_eod", [True, False])
def test_preprocess_writes_each_document_with_eod_as_megatron(files, tmp_path, append_eod):
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    flags = ["--tokenizer-type", "SentencePieceTokenizer", "--tokenizer-model", str(files["sp"]), "--workers", "2"]
    done = _preprocess(["--output-prefix", str(tmp_path / "sp"), *flags] + (["--append-eod"] if append_eod else []))
    assert done.returncode == 0, done.stderr
    dataset = IndexedDataset(str(tmp_path / "sp_text_document"))
    tokenizer = _tokenizer("SentencePieceTokenizer", files)
    texts = tokenizer_files.corpus_texts()
    assert len(dataset) == len(texts)
    for index in (0, 1, len(texts) - 1):
        expected = tokenizer.tokenize(texts[index]) + ([tokenizer.eod] if append_eod else [])
        np.testing.assert_array_equal(dataset[index], expected)


def test_preprocess_refuses_a_missing_model_with_one_line(tmp_path):
    done = _preprocess(["--output-prefix", str(tmp_path / "x"), "--tokenizer-type", "Llama2Tokenizer",
                        "--tokenizer-model", str(tmp_path / "absent.model")], fresh=True)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [f"error: --tokenizer-model {tmp_path / 'absent.model'}: no such file "
                                                "(tokenizer files must be local)"]


def test_hugging_face_directory_without_tokenizer_json_reads_vocab_and_merges(files, tmp_path):
    import shutil

    for name in ("vocab", "merges"):
        shutil.copy(files[name], tmp_path / files[name].name)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": {"content": "<|endoftext|>"}}))
    hf = make_tokenizer("HuggingFaceTokenizer", files=TokenizerFiles(tokenizer_model=str(tmp_path)))
    gpt2 = _tokenizer("GPT2BPETokenizer", files)
    text = tokenizer_files.corpus_texts()[3]
    assert hf.tokenize(text) == gpt2.tokenize(text) and hf.eod == gpt2.eod


def test_no_tokenizer_type_is_gpt2_with_vocab_and_merge_files_as_megatron(files):
    gpt2 = make_tokenizer(None, files=TokenizerFiles(vocab_file=str(files["vocab"]), merge_file=str(files["merges"])))
    assert gpt2.kind == "GPT2BPETokenizer"
    assert make_tokenizer(None, 256).kind == "NullTokenizer"  # mock data runs: ids below --vocab-size


def test_pretrain_refuses_a_malformed_tokenizer_file_with_one_line(tmp_path):
    bad = tmp_path / "vocab.json"
    bad.write_text("{not json")
    (tmp_path / "merges.txt").write_text("#version: 0.2\n")
    done = subprocess.run([sys.executable, "tools/pretrain_gpt.py", "--num-layers", "2", "--hidden-size", "32",
                           "--num-attention-heads", "2", "--seq-length", "32", "--train-iters", "1", "--mock-data",
                           "--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", str(bad),
                           "--merge-file", str(tmp_path / "merges.txt")],
                          cwd=REPO, capture_output=True, text=True, timeout=300, env=rank_env(0, 1, 29997))
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --tokenizer-type GPT2BPETokenizer: cannot load its files")
