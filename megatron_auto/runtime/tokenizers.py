"""Offline tokenizers with Megatron's end-of-document convention (no torch, no downloads)."""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import UserError

TOKENIZER_TYPES = ("ByteTokenizer", "NullTokenizer")


@dataclass(frozen=True)
class Tokenizer:
    """ByteTokenizer: UTF-8 bytes 0..255, end-of-document 256. NullTokenizer: the text is
    space-separated integer ids below `--vocab-size`, end-of-document `vocab_size` (Megatron's rule)."""

    kind: str
    base_vocab: int

    @property
    def eod(self) -> int:
        return self.base_vocab

    @property
    def vocab_size(self) -> int:
        """Ids the model must embed, the end-of-document id included."""
        return self.base_vocab + 1

    def tokenize(self, text: str) -> list[int]:
        if self.kind == "ByteTokenizer":
            return list(text.encode("utf-8"))
        try:
            ids = [int(token) for token in text.split()]
        except ValueError:
            raise UserError("NullTokenizer input must be space-separated integer ids") from None
        if any(i < 0 or i >= self.base_vocab for i in ids):
            raise UserError(f"NullTokenizer ids must lie in [0, {self.base_vocab})")
        return ids


def make_tokenizer(kind: str, vocab_size: int | None = None) -> Tokenizer:
    """The tokenizer Megatron's `--tokenizer-type` / `--vocab-size` name."""
    if kind == "ByteTokenizer":
        return Tokenizer(kind, 256)
    if kind == "NullTokenizer":
        if not vocab_size or vocab_size < 1:
            raise UserError("--tokenizer-type NullTokenizer needs --vocab-size")
        return Tokenizer(kind, vocab_size)
    raise UserError(f"unknown --tokenizer-type {kind!r}; choose one of {', '.join(TOKENIZER_TYPES)}")
