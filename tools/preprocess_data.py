"""Build Megatron indexed datasets (PREFIX_KEY_document.bin/.idx) from jsonl or text, offline.

Megatron-LM's tools/preprocess_data.py flags:

    .venv/bin/python tools/preprocess_data.py --input data/tiny_corpus.jsonl \
        --output-prefix data/generated/tiny --tokenizer-type ByteTokenizer --append-eod

A `.jsonl` input holds one document per line; each key of `--json-keys` (default `text`)
becomes its own dataset PREFIX_KEY_document. Any other file is plain text with documents
separated by blank lines (key `text`). `--append-eod` ends each document with the tokenizer's
end-of-document id, as Megatron-LM does. Tokenizers (runtime/tokenizers.py), all offline:
ByteTokenizer, NullTokenizer (`--vocab-size`), GPT2BPETokenizer (`--vocab-file --merge-file`),
SentencePieceTokenizer / GPTSentencePieceTokenizer / Llama2Tokenizer (`--tokenizer-model`),
HuggingFaceTokenizer (`--tokenizer-model DIR`), TikTokenizer (`--tokenizer-model FILE.json`,
`--tiktoken-pattern`, `--tiktoken-num-special-tokens`, `--vocab-size`). `--workers`,
`--partitions` and `--log-interval` are accepted; one process does the work.
The work is megatron_auto/runtime/preprocess.py.
"""
from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from megatron_auto.errors import UserError
from megatron_auto.runtime.preprocess import write_datasets
from megatron_auto.runtime.tokenizers import add_tokenizer_flags, tokenizer_from_flags


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--input", required=True, type=Path)
    parser.add_argument("--output-prefix", required=True)
    parser.add_argument("--json-keys", nargs="+", default=["text"])
    parser.add_argument("--append-eod", action="store_true", help="end each document with the end-of-document id")
    add_tokenizer_flags(parser, default_type="ByteTokenizer")
    for flag, default in (("--workers", 1), ("--partitions", 1), ("--log-interval", 1000)):
        parser.add_argument(flag, type=int, default=default, help="accepted; one process does the work")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("megatron").setLevel(logging.WARNING)
    try:
        if not args.input.is_file():
            raise UserError(f"--input {args.input}: no such file")
        tokenizer = tokenizer_from_flags(args)
        for out, count, tokens in write_datasets(args.input, args.output_prefix, args.json_keys, tokenizer,
                                                 args.append_eod):
            print(f"wrote {out}.bin/.idx: {count} documents, {tokens} tokens, "
                  f"vocabulary {tokenizer.vocab_size} ({tokenizer.kind}, end of document {tokenizer.eod})")
    except UserError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
