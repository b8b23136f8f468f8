"""Megatron indexed datasets (PREFIX_KEY_document.bin/.idx) from jsonl or text: tools/preprocess_data.py's work."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

from ..errors import UserError


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


def build(input_path: Path, out: str, key: str, tokenizer, append_eod: bool) -> tuple[int, int]:
    """Write OUT.{bin,idx} from the documents under `key`; return (documents, tokens)."""
    import patches  # noqa: F401  (megatron-core with torch.compile deferred, ~3 s less: patches/deferred_compile.py)
    import torch
    from megatron.core.datasets.indexed_dataset import DType, IndexedDatasetBuilder

    Path(out).parent.mkdir(parents=True, exist_ok=True)
    builder = IndexedDatasetBuilder(out + ".bin", dtype=DType.optimal_dtype(tokenizer.vocab_size))
    count = tokens = 0
    for doc in documents(input_path, key):
        ids = tokenizer.tokenize(doc)
        if not ids:  # Megatron-LM drops empty documents (keep_empty is off)
            continue
        if append_eod:
            ids = ids + [tokenizer.eod]
        builder.add_document(torch.tensor(ids, dtype=torch.int64), [len(ids)])
        count, tokens = count + 1, tokens + len(ids)
    builder.finalize(out + ".idx")
    return count, tokens


def write_datasets(input_path: Path, output_prefix: str, keys: list[str], tokenizer,
                   append_eod: bool) -> Iterator[tuple[str, int, int]]:
    """One dataset PREFIX_KEY_document per key, each as it is written: (its prefix, documents, tokens)."""
    for key in keys:
        out = f"{output_prefix}_{key}_document"
        count, tokens = build(input_path, out, key, tokenizer, append_eod)
        yield out, count, tokens
