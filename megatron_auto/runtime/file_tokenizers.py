"""Tokenizers read from local files, with megatron-core 0.16.1's semantics (what Megatron-LM's
`build_tokenizer` in megatron/core/tokenizers/text/utils/build_tokenizer.py builds).

SentencePiece (SentencePieceTokenizer, GPTSentencePieceTokenizer, Llama2Tokenizer) and TikTokenizer
are megatron-core's own classes (megatron.core.tokenizers.text.libraries): end-of-document is the
model's eos id, no BOS is added, `--vocab-size` sizes the tiktoken vocabulary (default 2**17, ids
below `--tiktoken-num-special-tokens` are special). megatron-core's GPT-2 and HuggingFace classes
wrap `transformers.AutoTokenizer`, which fetches "gpt2" from the Hub; here the `tokenizers` package
(the same Rust code as transformers' fast tokenizers) reads the local files instead, with the same
results: GPT-2 byte-level BPE from vocab.json + merges.txt, end-of-document `<|endoftext|>`, and a
HuggingFace directory's tokenizer.json with its eos_token (tokenizer_config.json) as end-of-document.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, Optional

from ..errors import UserError

SENTENCEPIECE_TYPES = ("SentencePieceTokenizer", "GPTSentencePieceTokenizer", "Llama2Tokenizer")


@dataclass(frozen=True)
class TokenizerFiles:
    """The file flags of Megatron-LM's tokenizer group."""

    vocab_file: Optional[str] = None
    """--vocab-file: GPT-2 vocab.json (GPT2BPETokenizer)."""
    merge_file: Optional[str] = None
    """--merge-file: GPT-2 merges.txt (GPT2BPETokenizer)."""
    tokenizer_model: Optional[str] = None
    """--tokenizer-model: SentencePiece model, tiktoken JSON vocabulary or HuggingFace directory."""
    tiktoken_pattern: Optional[str] = None
    """--tiktoken-pattern: v1 or v2 (TikTokenizer; megatron-core's default v2)."""
    tiktoken_num_special_tokens: int = 1000
    """--tiktoken-num-special-tokens: ids 0..N-1 are special tokens, the vocabulary follows."""
    hf_include_special_tokens: bool = False
    """--tokenizer-hf-include-special-tokens: HuggingFace encoding adds its special tokens (BOS...)."""


def _require(module: str, kind: str):
    try:
        return __import__(module)
    except ImportError:
        raise UserError(f"--tokenizer-type {kind} needs the Python package '{module}' "
                        f"(pip install '{module}', or the runtime extra of megatron-auto)") from None


def _existing_file(path: Optional[str], flag: str, kind: str) -> str:
    if not path:
        raise UserError(f"--tokenizer-type {kind} needs {flag}")
    if not os.path.isfile(path):
        raise UserError(f"{flag} {path}: no such file (tokenizer files must be local)")
    return path


@dataclass(frozen=True)
class CoreTokenizer:
    """A megatron-core tokenizer library object (SentencePiece, tiktoken) behind our interface."""

    kind: str
    library: Any

    @property
    def eod(self) -> int:
        return int(self.library.eod)

    @property
    def vocab_size(self) -> int:
        return int(self.library.vocab_size)

    def tokenize(self, text: str) -> list[int]:
        return list(self.library.text_to_ids(text))

    def detokenize(self, ids: list[int]) -> str:
        return self.library.ids_to_text(list(ids))

    def token_id(self, token: str) -> Optional[int]:
        """The id of one vocabulary entry (a special token such as FIM's sentinels), or None."""
        try:
            found = self.library.tokens_to_ids([token])
            unknown = getattr(self.library, "unk_id", None)
            if found and found[0] is not None and found[0] == unknown:
                # SentencePiece maps a piece it lacks to its unknown id
                return found[0] if self.library.ids_to_tokens([unknown])[0] == token else None
        except (KeyError, ValueError, TypeError, AttributeError, IndexError):
            return None
        return int(found[0]) if found and found[0] is not None else None


@dataclass(frozen=True)
class RustTokenizer:
    """A `tokenizers.Tokenizer` (GPT-2 BPE or a HuggingFace tokenizer.json) with its end-of-document id."""

    kind: str
    model: Any
    eod_id: int
    add_special_tokens: bool = False

    @property
    def eod(self) -> int:
        return self.eod_id

    @property
    def vocab_size(self) -> int:
        return int(self.model.get_vocab_size(with_added_tokens=True))

    def tokenize(self, text: str) -> list[int]:
        return list(self.model.encode(text, add_special_tokens=self.add_special_tokens).ids)

    def detokenize(self, ids: list[int]) -> str:
        return self.model.decode(list(ids), skip_special_tokens=False)

    def token_id(self, token: str) -> Optional[int]:
        """The id of one vocabulary entry (a special token such as FIM's sentinels), or None."""
        found = self.model.token_to_id(token)
        return None if found is None else int(found)


def load_file_tokenizer(kind: str, vocab_size: Optional[int], files: TokenizerFiles):
    """The tokenizer of `kind` from its local files (UserError when they are missing or malformed)."""
    loaders = {"GPT2BPETokenizer": lambda: gpt2_bpe(files), "HuggingFaceTokenizer": lambda: hugging_face(files),
               "TikTokenizer": lambda: tiktoken_vocab(files, vocab_size)}
    loader = loaders.get(kind, lambda: sentencepiece_model(kind, files))
    try:
        return loader()
    except UserError:
        raise
    except Exception as error:  # the libraries raise many types for a malformed file
        first_line = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise UserError(f"--tokenizer-type {kind}: cannot load its files: {first_line}") from None


def gpt2_bpe(files: TokenizerFiles) -> RustTokenizer:
    """GPT-2's byte-level BPE (Megatron-LM's GPT2BPETokenizer): vocab.json + merges.txt."""
    kind = "GPT2BPETokenizer"
    tokenizers = _require("tokenizers", kind)
    vocab = _existing_file(files.vocab_file, "--vocab-file", kind)
    merges = _existing_file(files.merge_file, "--merge-file", kind)
    model = tokenizers.Tokenizer(tokenizers.models.BPE.from_file(vocab, merges))
    # GPT-2's pre-tokenizer regex and byte-to-unicode map (gpt2_tokenization.py in Megatron-LM).
    model.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    model.decoder = tokenizers.decoders.ByteLevel()
    eod = model.token_to_id("<|endoftext|>")
    if eod is None:
        raise UserError(f"--vocab-file {vocab}: no '<|endoftext|>' token (GPT-2's end of document)")
    return RustTokenizer(kind, model, eod)


def _eos_token(directory: str) -> Optional[str]:
    """The eos_token a HuggingFace directory names (tokenizer_config.json, then special_tokens_map.json)."""
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        path = os.path.join(directory, name)
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as stream:
                token = json.load(stream).get("eos_token")
            if isinstance(token, dict):
                token = token.get("content")
            if token:
                return token
    return None


def hugging_face(files: TokenizerFiles) -> RustTokenizer:
    """A local HuggingFace tokenizer directory (tokenizer.json), never fetched from the Hub."""
    kind = "HuggingFaceTokenizer"
    tokenizers = _require("tokenizers", kind)
    path = files.tokenizer_model
    if not path:
        raise UserError(f"--tokenizer-type {kind} needs --tokenizer-model DIR (a local tokenizer directory)")
    directory = path if os.path.isdir(path) else os.path.dirname(path)
    tokenizer_json = os.path.join(path, "tokenizer.json") if os.path.isdir(path) else path
    if os.path.isfile(tokenizer_json):
        model = tokenizers.Tokenizer.from_file(tokenizer_json)
    elif all(os.path.isfile(os.path.join(directory, f)) for f in ("vocab.json", "merges.txt")):
        # An older GPT-2-style directory: transformers builds the same byte-level BPE from these.
        model = gpt2_bpe(TokenizerFiles(vocab_file=os.path.join(directory, "vocab.json"),
                                        merge_file=os.path.join(directory, "merges.txt"))).model
    else:
        raise UserError(f"--tokenizer-model {path}: no tokenizer.json (nor vocab.json + merges.txt) there "
                        "(a local directory is needed: nothing is downloaded)")
    eos = _eos_token(directory)
    eod = model.token_to_id(eos) if eos else None
    if eod is None:
        raise UserError(f"--tokenizer-model {path}: no eos_token in tokenizer_config.json that the "
                        "vocabulary holds (it is the end-of-document id)")
    return RustTokenizer(kind, model, eod, add_special_tokens=files.hf_include_special_tokens)


def sentencepiece_model(kind: str, files: TokenizerFiles) -> CoreTokenizer:
    """megatron-core's SentencePieceTokenizer (all three SentencePiece types map to it)."""
    _require("sentencepiece", kind)
    model = _existing_file(files.tokenizer_model, "--tokenizer-model", kind)  # before megatron-core's import (~4 s)
    import patches  # noqa: F401  (megatron-core with torch.compile deferred: patches/deferred_compile.py)
    from megatron.core.tokenizers.text.libraries import SentencePieceTokenizer

    return CoreTokenizer(kind, SentencePieceTokenizer(model))


def tiktoken_vocab(files: TokenizerFiles, vocab_size: Optional[int]) -> CoreTokenizer:
    """megatron-core's TikTokenTokenizer over Megatron's tiktoken JSON vocabulary."""
    kind = "TikTokenizer"
    _require("tiktoken", kind)
    path = _existing_file(files.tokenizer_model, "--tokenizer-model", kind)  # before megatron-core's import
    import patches  # noqa: F401  (as above)
    from megatron.core.tokenizers.text.libraries import TikTokenTokenizer
    from megatron.core.tokenizers.text.libraries.tiktoken_tokenizer import DEFAULT_TIKTOKEN_MAX_VOCAB

    if not path.endswith(".json"):
        raise UserError(f"--tokenizer-model {path}: TikTokenizer reads Megatron's tiktoken JSON vocabulary (*.json)")
    size = vocab_size or DEFAULT_TIKTOKEN_MAX_VOCAB
    specials = files.tiktoken_num_special_tokens
    with open(path, encoding="utf-8") as stream:
        entries = len(json.load(stream))
    if size - specials > entries:
        raise UserError(f"--tokenizer-model {path} holds {entries} tokens: --vocab-size {size} needs "
                        f"{size - specials} after {specials} special tokens (give --vocab-size "
                        f"{entries + specials} or less)")
    pattern = files.tiktoken_pattern or "v2"
    if pattern not in ("v1", "v2"):
        raise UserError(f"--tiktoken-pattern {pattern}: choose v1 or v2")
    return CoreTokenizer(kind, TikTokenTokenizer(path, num_special_tokens=specials, pattern=pattern,
                                                 vocab_size=size))
