"""Small tokenizer files, generated from the shipped corpus (nothing is downloaded).

- a SentencePiece BPE model trained by sentencepiece's trainer;
- GPT-2 vocab.json + merges.txt trained by the `tokenizers` byte-level BPE trainer, and the
  same tokenizer saved as a HuggingFace directory (tokenizer.json + tokenizer_config.json);
- a tiktoken vocabulary in Megatron's JSON format: the 256 bytes, then every prefix of the
  corpus's most frequent words (each prefix extends a shorter one, so BPE can reach it).
"""
from __future__ import annotations

import base64
import collections
import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CORPUS = REPO / "data" / "tiny_corpus.jsonl"


def corpus_texts() -> list[str]:
    return [json.loads(line)["text"] for line in CORPUS.read_text(encoding="utf-8").splitlines() if line.strip()]


def sentencepiece_model(directory: Path, vocab_size: int = 300) -> Path:
    import sentencepiece

    prefix = directory / "sp"
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(corpus_texts()), model_prefix=str(prefix), vocab_size=vocab_size,
        model_type="bpe", hard_vocab_limit=False, minloglevel=2, bos_id=1, eos_id=2, unk_id=0, pad_id=-1)
    return prefix.with_suffix(".model")


def _byte_level_bpe(vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(corpus_texts(), trainer=trainer)
    return tokenizer


def gpt2_files(directory: Path, vocab_size: int = 400) -> tuple[Path, Path]:
    """(vocab.json, merges.txt) of a byte-level BPE trained on the corpus."""
    directory.mkdir(parents=True, exist_ok=True)
    _byte_level_bpe(vocab_size).model.save(str(directory))
    return directory / "vocab.json", directory / "merges.txt"


def hugging_face_dir(directory: Path, vocab_size: int = 400) -> Path:
    """A local HuggingFace tokenizer directory whose eos_token is <|endoftext|>."""
    directory.mkdir(parents=True, exist_ok=True)
    _byte_level_bpe(vocab_size).save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|endoftext|>"}))
    return directory


def tiktoken_vocab(path: Path, words: int = 60) -> tuple[Path, int]:
    """Megatron's tiktoken JSON vocabulary; returns (path, entries)."""
    counts = collections.Counter(" " + w for text in corpus_texts() for w in text.split())
    tokens = [bytes([i]) for i in range(256)]
    seen = set(tokens)
    for word, _ in counts.most_common(words):
        data = word.encode("utf-8")
        for end in range(2, len(data) + 1):
            if data[:end] not in seen:
                seen.add(data[:end])
                tokens.append(data[:end])
    entries = [{"rank": i, "token_bytes": base64.b64encode(t).decode("ascii"),
                "token_str": t.decode("utf-8", errors="replace")} for i, t in enumerate(tokens)]
    path.write_text(json.dumps(entries))
    return path, len(entries)
