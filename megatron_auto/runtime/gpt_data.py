"""Megatron indexed datasets through megatron-core's BlendedMegatronDatasetBuilder and GPTDataset.

`--data-path` takes Megatron-LM's forms: one prefix, prefixes (weighted by their sizes), or
`W1 PREFIX1 W2 PREFIX2 ...`; `--split 949,50,1` divides every dataset's documents into train,
validation and test, and each split is blended by the weights (megatron-core's builder: the
same code Megatron-LM's pretrain_gpt.py runs, with its compiled index helpers). `--train-data-path`,
`--valid-data-path` and `--test-data-path` (same forms) give each split datasets of its own instead,
each taken whole. The split sizes are Megatron-LM's (training.get_train_valid_test_num_samples):
train_iters x global batch, (train_iters // eval_interval + 1) x eval_iters x global batch, and
eval_iters x global batch.
The sample, document and shuffle indices are cached under `--data-cache-path` (default: beside
each dataset, PREFIX/cache/, as Megatron-LM does); rank 0 writes them, the others read them.

Every prefix's `.bin` is checked against its `.idx` before any work (a truncated `.bin` would
otherwise train on garbage or crash mid-run).
"""
from __future__ import annotations

import logging
import os
import re
import struct
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from ..errors import UserError
from .settings import DataSettings

logger = logging.getLogger(__name__)

SPLIT_NAMES = ("train", "eval", "test")
MAX_SCAN_BYTES = 8 << 30
"""Largest .bin whose token ids are all checked before any work (numpy's max over the memory map, in
16 Mi-token chunks, read 2.9-4.0 GB/s from the page cache on the 2-core CI host: 8 GiB in about 3 s);
a larger one is checked sample by sample as it is read."""


def parse_blend(words: Sequence[str]) -> tuple[list[str], Optional[list[float]]]:
    """Megatron-LM's `--data-path` list as (prefixes, weights or None)."""
    words = list(words)
    if not words:
        raise UserError("--data-path needs at least one dataset prefix")
    if len(words) % 2 == 1:
        return words, None
    weights, prefixes = words[0::2], words[1::2]
    try:
        values = [float(w) for w in weights]
    except ValueError:
        if any(_is_number(w) for w in weights):
            raise UserError("--data-path: give 'WEIGHT PREFIX' pairs or prefixes only, not a mix") from None
        return words, None
    if any(v < 0 for v in values) or sum(values) <= 0:
        raise UserError(f"--data-path weights must be non-negative with a positive sum, got {weights}")
    return prefixes, values


def _is_number(word: str) -> bool:
    try:
        float(word)
        return True
    except ValueError:
        return False


def parse_split(split: str) -> list[float]:
    """`--split` as normalized train/valid/test shares (megatron-core's parser, its errors as one line)."""
    from megatron.core.datasets.blended_megatron_dataset_config import parse_and_normalize_split

    # megatron-core keeps whatever its number pattern finds ("98,2,x" reads as 98,2,0 and "-1,2,3"
    # as 1,2,3), so each field is checked here first.
    # Megatron-LM's llama3 example passes the split with its quotes ("'99,1,0'"): they are not fields.
    fields = [field.strip() for field in re.split(r"[,/]", split.strip().strip("'\""))]
    shares = None
    if len(fields) <= 3 and all(re.fullmatch(r"\d+(\.\d*)?|\.\d+", field) for field in fields):
        try:
            shares = parse_and_normalize_split(split)
        except (AssertionError, ValueError, ZeroDivisionError):
            shares = None
    if shares is None or not np.isfinite(shares).all() or shares[0] <= 0:
        raise UserError(f"--split {split!r}: give up to three non-negative comma-separated weights "
                        "(train, validation, test) with a positive train weight, e.g. 949,50,1")
    return shares


def check_bin_matches_idx(prefix: str) -> None:
    """UserError unless PREFIX.idx reads and PREFIX.bin holds exactly the bytes it indexes."""
    index = read_index(prefix)
    count = len(index.sequence_lengths)
    expected = 0
    if count:
        expected = int(index.sequence_pointers[-1]) + int(index.sequence_lengths[-1]) * index.dtype_size
    actual = os.path.getsize(prefix + ".bin")
    if actual != expected:
        raise UserError(f"--data-path {prefix}: {prefix}.bin has {actual:,} bytes but {prefix}.idx indexes "
                        f"{expected:,} ({count} sequences): the files do not belong together or one is truncated")
    if count == 0:
        raise UserError(f"--data-path {prefix}: the dataset holds no documents")


def read_index(prefix: str):
    """PREFIX.idx through megatron-core's own reader (its _IndexReader, which IndexedDataset wraps), checked
    as IndexedDataset checks it. Not through IndexedDataset itself: when its constructor fails, its
    __del__ raises a second error at exit ("'IndexedDataset' object has no attribute 'index'")."""
    from megatron.core.datasets.indexed_dataset import _IndexReader

    for suffix in (".idx", ".bin"):
        if not os.path.isfile(prefix + suffix):
            raise UserError(f"--data-path {prefix}: no file {prefix + suffix}")
    try:
        index = _IndexReader(prefix + ".idx", multimodal=False)
    except (AssertionError, ValueError, OSError, KeyError, struct.error) as error:
        raise UserError(f"--data-path {prefix}: cannot read {prefix}.idx ({_reason(error)})") from None
    documents = index.document_indices
    if (len(documents) == 0 or documents[-1] != index.sequence_count or (np.diff(documents) < 0).any()
            or (index.sequence_lengths < 0).any()):
        raise UserError(f"--data-path {prefix}: {prefix}.idx is corrupt (its document and sequence tables disagree)")
    return index


def _reason(error: Exception) -> str:
    if isinstance(error, KeyError):
        return f"unknown token type code {error}"
    return str(error) or "bad header"


def check_token_ids(prefix: str, vocab_size: int, max_scan_bytes: int = MAX_SCAN_BYTES) -> bool:
    """UserError when PREFIX.bin holds a token id the tokenizer's vocabulary lacks (the embedding would
    index past its table). Scans the whole memory-mapped .bin in chunks when it has at most
    `max_scan_bytes`; returns False for a larger file (GPTDatasets then checks every sample as read)."""
    index = read_index(prefix)
    if np.iinfo(index.dtype).max < vocab_size:
        return True  # the token type cannot hold an id outside the vocabulary
    size = os.path.getsize(prefix + ".bin")
    if size > max_scan_bytes:
        return False
    tokens = np.memmap(prefix + ".bin", dtype=index.dtype, mode="r")
    chunk = 1 << 24
    largest = max((int(tokens[start:start + chunk].max()) for start in range(0, len(tokens), chunk)), default=0)
    del tokens
    if largest >= vocab_size:
        raise UserError(_vocabulary_message(prefix, largest, vocab_size))
    return True


def _vocabulary_message(prefix: str, token_id: int, vocab_size: int) -> str:
    return (f"--data-path {prefix}: token id {token_id} is outside the tokenizer's vocabulary of {vocab_size} "
            "(the data was tokenized with another tokenizer: give its --tokenizer-type/--vocab-size)")


@dataclass(frozen=True)
class DatasetTokenizer:
    """What GPTDataset reads of the tokenizer: the end-of-document id and the vocabulary size."""

    eod: int
    vocab_size: int

    @property
    def unique_identifiers(self) -> dict:
        """Part of the cache key of the dataset indices (megatron_dataset.MegatronDataset)."""
        return {"class": "megatron_auto", "eod": self.eod, "vocab_size": self.vocab_size}


def split_sizes(train_iters: int, eval_interval: int, eval_iters: int, global_batch: int) -> list[int]:
    """Samples to draw per split (Megatron-LM's get_train_valid_test_num_samples; no eval interval: one eval)."""
    evaluations = train_iters // eval_interval + 1 if eval_interval else 1
    return [train_iters * global_batch, evaluations * eval_iters * global_batch, eval_iters * global_batch]


def split_blends(data: DataSettings) -> Optional[list]:
    """The (prefixes, weights) of each split given its own datasets (None for a split without), or None when
    one `--data-path` blend is split by `--split`."""
    if not data.from_files or data.blend:
        return None
    return [parse_blend(words) if words else None for words in data.blend_per_split]


def all_prefixes(data: DataSettings) -> list[str]:
    """Every dataset prefix the run reads, once each."""
    blends = split_blends(data)
    if blends is None:
        return parse_blend(data.blend)[0]
    return list(dict.fromkeys(prefix for blend in blends if blend for prefix in blend[0]))


def check_data(data: DataSettings) -> Optional[tuple[list[str], Optional[list[float]]]]:
    """UserError for a malformed blend or split, or a dataset whose files do not match; else the blend
    (None with per-split datasets)."""
    blend = None if split_blends(data) is not None else parse_blend(data.blend)
    if blend is not None:
        parse_split(data.split)
    for prefix in all_prefixes(data):
        check_bin_matches_idx(prefix)
    return blend


def check_run_data(data: DataSettings, eval_iters: int) -> None:
    """Before any work, what megatron-core's dataset builder would fail on after it: no validation
    documents for a run that validates, and an index cache folder it cannot create."""
    if eval_iters > 0 and not _has_validation(data):
        raise UserError(_no_validation_message(data, f"--eval-iters {eval_iters}"))
    # Without --data-cache-path, GPTDataset caches beside each dataset.
    folders = [("--data-cache-path", data.cache_path)] if data.cache_path else [
        (f"--data-path {prefix}", os.path.join(prefix, "cache")) for prefix in all_prefixes(data)]
    for flag, folder in folders:
        if os.path.isdir(folder):
            continue  # megatron-core reads the indices there, or writes the missing ones
        existing = os.path.abspath(folder)
        while not os.path.exists(existing):
            existing = os.path.dirname(existing)
        if not os.path.isdir(existing) or not os.access(existing, os.W_OK | os.X_OK):
            raise UserError(f"{flag}: the dataset index cache {folder} cannot be created ({existing} is not a "
                            "writable directory); give --data-cache-path a writable directory")


def _has_validation(data: DataSettings) -> bool:
    blends = split_blends(data)
    return parse_split(data.split)[1] > 0 if blends is None else blends[1] is not None


def _no_validation_message(data: DataSettings, asker: str) -> str:
    if split_blends(data) is not None:
        return f"no --valid-data-path is given, but {asker} asks for validation (give one, or --eval-iters 0)"
    return (f"--split {data.split} leaves no validation data, but {asker} asks for validation "
            "(give the validation split a weight, or --eval-iters 0)")


def check_data_tokens(data: DataSettings) -> bool:
    """check_token_ids over the blend (after check_data); False when some .bin was too large to scan."""
    return all([check_token_ids(prefix, data.vocab_size) for prefix in all_prefixes(data)])


def check_split_documents(prefixes: list[str], data: DataSettings, sizes: list[int]) -> None:
    """UserError when --split gives a split of positive weight no document of a dataset: megatron-core's
    GPTDataset would loop forever counting epochs of zero tokens (gpt_dataset.py, _get_num_epochs), for any
    requested sample count, 0 included (None, the whole split, is safe). The document ranges are
    megatron-core's (blended_megatron_dataset_builder.py: round(cumulative share x documents))."""
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    shares = np.cumsum([0.0, *parse_split(data.split)])
    for prefix in prefixes:
        documents = IndexedDataset(prefix, mmap=data.mmap_bin_files).document_indices.shape[0] - 1
        for index, name in enumerate(("train", "validation", "test")):
            first, end = (int(round(share * float(documents))) for share in shares[index:index + 2])
            if sizes[index] is not None and shares[index + 1] > shares[index] and end <= first:
                raise UserError(f"--split {data.split}: the {name} split of {prefix} gets none of its {documents} "
                                f"documents; give it a larger weight (e.g. --split 949,50,1)")


def build_splits(data: DataSettings, seq_length: int, seed: int, sizes: list[int]) -> list:
    """megatron-core's train, validation and test datasets (None for a split of weight 0)."""
    from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
    from megatron.core.datasets.gpt_dataset import GPTDatasetConfig

    mock = data.mock_dataset and not data.from_files
    blend = None if mock else check_data(data)
    if blend is not None:
        check_split_documents(blend[0], data, sizes)
    config = GPTDatasetConfig(
        random_seed=seed, sequence_length=seq_length, blend=blend, blend_per_split=split_blends(data),
        split=data.split if blend is not None else None,  # no blend at all: megatron-core's mock, split 1,1,1
        path_to_cache=data.cache_path, mmap_bin_files=data.mmap_bin_files,
        tokenizer=DatasetTokenizer(data.eod, data.vocab_size), reset_position_ids=data.reset_position_ids,
        reset_attention_mask=False, eod_mask_loss=data.eod_mask_loss, create_attention_mask=False)
    blend_logger = logging.getLogger("megatron.core.datasets.blended_dataset")
    level = blend_logger.level
    if data.cache_path is None:  # Megatron warns on every rank that it cannot cache the blend index
        blend_logger.setLevel(logging.ERROR)
    try:
        return BlendedMegatronDatasetBuilder(dataset_class(data, seed, mock), sizes, lambda: True, config).build()
    finally:
        blend_logger.setLevel(level)


def dataset_class(data: DataSettings, seed: int, mock: bool) -> type:
    """megatron-core's MockGPTDataset or GPTDataset, or with --fim-data its FIM form (runtime/fim.py)."""
    from megatron.core.datasets.gpt_dataset import GPTDataset, MockGPTDataset

    if mock:
        return MockGPTDataset
    if data.fim is not None:
        from .fim import fim_dataset_class

        return fim_dataset_class(data.fim, seed)
    return GPTDataset


class GPTDatasets:
    """Samples from megatron-core's train / validation / test datasets, as GPTDataset makes them
    (tokens, labels, loss mask and positions: --eod-mask-loss and --reset-position-ids applied)."""

    def __init__(self, data: DataSettings, seq_length: int, seed: int, sizes: list[int], evaluates: bool) -> None:
        self.splits = dict(zip(SPLIT_NAMES, build_splits(data, seq_length, seed, sizes)))
        self.vocab_size = data.vocab_size
        self.prefixes = all_prefixes(data) if data.from_files else ["megatron-core's mock GPT dataset"]
        if evaluates and not self.splits["eval"]:
            raise UserError(_no_validation_message(data, f"{sizes[1]} validation samples"))
        built = ", ".join(f"{name} {len(ds) if ds else 0}" for name, ds in self.splits.items())
        self.description = f"needed {sizes[0]}/{sizes[1]}/{sizes[2]} (train/eval/test), built {built}"
        if data.fim is not None:
            self.description += f"; fill-in-the-middle: rate {data.fim.rate:g}, SPM rate {data.fim.spm_rate:g}"

    def sample(self, index: int, split: str = "train") -> dict:
        """Sample `index` of `split` (it wraps around the split's length)."""
        dataset = self.splits[split]
        item = dataset[index % len(dataset)]
        largest = max(int(item["tokens"].max()), int(item["labels"].max()))
        if largest >= self.vocab_size:  # what check_token_ids could not scan before the run
            raise UserError(_vocabulary_message(" ".join(self.prefixes), largest, self.vocab_size))
        return {key: item[key] for key in ("tokens", "labels", "loss_mask", "position_ids")}
