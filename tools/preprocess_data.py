"""Build a Megatron indexed dataset (PREFIX_text_document.bin/.idx) from text or jsonl, offline.

    .venv/bin/python tools/preprocess_data.py --input data/tiny_corpus.jsonl \
        --output-prefix data/generated/tiny --tokenizer-type ByteTokenizer

A `.jsonl` input holds one document per line under `--json-keys` (default
`text`); any other file is plain text with documents separated by blank lines.
Each document ends with the tokenizer's end-of-document id. Tokenizers:
ByteTokenizer (UTF-8 bytes, vocabulary 257) or NullTokenizer (space-separated
ids, `--vocab-size V`, vocabulary V+1), both offline.
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from megatron_auto.errors import UserError  # noqa: E402
from megatron_auto.runtime.tokenizers import TOKENIZER_TYPES, make_tokenizer  # noqa: E402


def documents(path: Path, key: str):
    """The documents of a jsonl or blank-line-separated text file."""
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".jsonl":
        for number, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    yield json.loads(line)[key]
                except (json.JSONDecodeError, KeyError, TypeError):
                    raise UserError(f"{path}:{number}: not a JSON object with key '{key}'") from None
    else:
        yield from (doc.strip() for doc in text.split("\n\n") if doc.strip())


def build(input_path: Path, prefix: str, tokenizer) -> tuple[int, int]:
    """Write PREFIX_text_document.{bin,idx}; return (documents, tokens)."""
    import numpy as np
    import torch
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    out = f"{prefix}_text_document"
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    dtype = np.uint16 if tokenizer.vocab_size < 65500 else np.int32
    builder = IndexedDatasetBuilder(out + ".bin", dtype=dtype)
    count = tokens = 0
    for doc in documents(input_path, "text"):
        ids = tokenizer.tokenize(doc) + [tokenizer.eod]
        builder.add_document(torch.tensor(ids, dtype=torch.int64), [len(ids)])
        count, tokens = count + 1, tokens + len(ids)
    builder.finalize(out + ".idx")
    return count, tokens


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--input", required=True, type=Path)
    parser.add_argument("--output-prefix", required=True)
    parser.add_argument("--tokenizer-type", default="ByteTokenizer", choices=TOKENIZER_TYPES)
    parser.add_argument("--vocab-size", type=int)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        if not args.input.is_file():
            raise UserError(f"--input {args.input}: no such file")
        tokenizer = make_tokenizer(args.tokenizer_type, args.vocab_size)
        count, tokens = build(args.input, args.output_prefix, tokenizer)
    except UserError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"wrote {args.output_prefix}_text_document.bin/.idx: {count} documents, {tokens} tokens, "
          f"vocabulary {tokenizer.vocab_size} ({tokenizer.kind})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
