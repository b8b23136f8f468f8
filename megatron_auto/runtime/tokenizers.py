"""Megatron-LM's `--tokenizer-type` choices, offline, with Megatron's end-of-document convention.

ByteTokenizer and NullTokenizer need no files. The others read local files
(runtime/file_tokenizers.py, which also holds the TokenizerFiles flags re-exported here):
GPT2BPETokenizer (`--vocab-file`, `--merge-file`), SentencePieceTokenizer / GPTSentencePieceTokenizer /
Llama2Tokenizer (`--tokenizer-model`, a SentencePiece model), HuggingFaceTokenizer (`--tokenizer-model`,
a local directory holding tokenizer.json) and TikTokenizer (`--tokenizer-model`, Megatron's tiktoken JSON vocabulary).
Nothing is downloaded. A missing or malformed file is a UserError (one line, exit 2).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Protocol

from ..errors import UserError
from .file_tokenizers import TokenizerFiles, load_file_tokenizer

FILE_TOKENIZER_TYPES = ("GPT2BPETokenizer", "SentencePieceTokenizer", "GPTSentencePieceTokenizer",
                        "Llama2Tokenizer", "HuggingFaceTokenizer", "TikTokenizer")
TOKENIZER_TYPES = ("ByteTokenizer", "NullTokenizer") + FILE_TOKENIZER_TYPES


class TextTokenizer(Protocol):
    """What preprocessing and training need of a tokenizer."""

    kind: str

    @property
    def eod(self) -> int: ...

    @property
    def vocab_size(self) -> int: ...

    def tokenize(self, text: str) -> list[int]: ...

    def detokenize(self, ids: list[int]) -> str: ...

    def token_id(self, token: str) -> Optional[int]: ...


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

    def detokenize(self, ids: list[int]) -> str:
        if self.kind == "ByteTokenizer":
            return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")
        return " ".join(str(i) for i in ids)

    def token_id(self, token: str) -> Optional[int]:
        """None: these tokenizers name no tokens (FIM's sentinel tokens need a file tokenizer)."""
        return None


def make_tokenizer(kind: Optional[str], vocab_size: Optional[int] = None,
                   files: TokenizerFiles = TokenizerFiles()) -> TextTokenizer:
    """The tokenizer Megatron's `--tokenizer-type`, `--vocab-size` and file flags name.

    No type: GPT2BPETokenizer when a vocabulary or merge file is given (Megatron-LM's
    pretrain_gpt.py default), else NullTokenizer (Megatron-LM has no default there)."""
    if kind is None:
        kind = "GPT2BPETokenizer" if files.vocab_file or files.merge_file else "NullTokenizer"
    if kind == "ByteTokenizer":
        return Tokenizer(kind, 256)
    if kind == "NullTokenizer":
        if not vocab_size or vocab_size < 1:
            raise UserError("--tokenizer-type NullTokenizer needs --vocab-size")
        return Tokenizer(kind, vocab_size)
    if kind in FILE_TOKENIZER_TYPES:
        return load_file_tokenizer(kind, vocab_size, files)
    raise UserError(f"unknown --tokenizer-type {kind!r}; choose one of {', '.join(TOKENIZER_TYPES)}")


def add_tokenizer_flags(group, default_type: Optional[str]) -> None:
    """Megatron-LM's tokenizer flags (tools/pretrain_gpt.py and tools/preprocess_data.py share them);
    a `default_type` of None resolves as make_tokenizer says."""
    group.add_argument("--tokenizer-type", default=default_type, choices=TOKENIZER_TYPES,
                       help=f"default: {default_type}" if default_type else
                       "default: GPT2BPETokenizer with --vocab-file/--merge-file (as Megatron-LM), else NullTokenizer")
    group.add_argument("--vocab-size", type=int,
                       help="NullTokenizer: ids below it (eod = it); TikTokenizer: the vocabulary size "
                            "(default 2**17), special tokens included")
    group.add_argument("--vocab-file", help="GPT2BPETokenizer: vocab.json")
    group.add_argument("--merge-file", help="GPT2BPETokenizer: merges.txt")
    group.add_argument("--tokenizer-model",
                       help="SentencePiece model file, TikTokenizer JSON vocabulary, or a local "
                            "HuggingFace tokenizer directory (never downloaded)")
    group.add_argument("--tiktoken-pattern", choices=("v1", "v2"), help="TikTokenizer split pattern (default v2)")
    group.add_argument("--tiktoken-num-special-tokens", type=int, default=1000)
    group.add_argument("--tokenizer-hf-include-special-tokens", action="store_true",
                       help="HuggingFaceTokenizer: encoding adds the tokenizer's special tokens (e.g. BOS)")
    group.add_argument("--tokenizer-hf-no-include-special-tokens", action="store_false",
                       dest="tokenizer_hf_include_special_tokens",
                       help="newer Megatron-LM's spelling of the default here (megatron-core 0.16.1's): "
                            "no special tokens")


def tokenizer_files_from_flags(args) -> TokenizerFiles:
    """The file flags of `add_tokenizer_flags`' parsed flags."""
    return TokenizerFiles(vocab_file=args.vocab_file, merge_file=args.merge_file,
                          tokenizer_model=args.tokenizer_model, tiktoken_pattern=args.tiktoken_pattern,
                          tiktoken_num_special_tokens=args.tiktoken_num_special_tokens,
                          hf_include_special_tokens=args.tokenizer_hf_include_special_tokens)


def tokenizer_from_flags(args) -> TextTokenizer:
    """The tokenizer that `add_tokenizer_flags`' parsed flags name."""
    return make_tokenizer(args.tokenizer_type, args.vocab_size, tokenizer_files_from_flags(args))
