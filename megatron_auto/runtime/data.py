"""Training samples: mock tokens or a Megatron indexed dataset, split over data-parallel ranks.

Sample `n` of the run is a fixed function of `n`, and iteration `i` uses
samples `i*B ... (i+1)*B - 1` in Megatron's sampler order (micro-batch by
micro-batch, each DP rank taking its slice of `micro_batch_size`), so every
layout, and a run resumed at any iteration, sees the same global batches.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Optional

import numpy as np
import torch

from ..errors import UserError
from .layout import MegatronLayout


class MockTokens:
    """Pseudo-random tokens, a fixed function of (seed, sample index)."""

    def __init__(self, vocab_size: int, seq_length: int, seed: int) -> None:
        self.vocab_size, self.seq_length, self.seed = vocab_size, seq_length, seed

    def sample(self, index: int, split: str = "train") -> np.ndarray:
        """seq_length + 1 token ids."""
        offset = 0 if split == "train" else 1 << 40
        rng = np.random.default_rng((self.seed, offset + index))
        return rng.integers(0, self.vocab_size, self.seq_length + 1, dtype=np.int64)


class IndexedTokens:
    """Consecutive windows of a Megatron indexed dataset's token stream, in a seeded order.

    Documents lie back to back in `PREFIX.bin`, so the file is the token stream
    (each document ends in the tokenizer's end-of-document id).
    """

    def __init__(self, prefix: str, seq_length: int, seed: int, eval_fraction: float) -> None:
        from megatron.core.datasets.indexed_dataset import IndexedDataset

        try:
            index = IndexedDataset(prefix, mmap=True)
        except (FileNotFoundError, AssertionError, ValueError) as error:
            raise UserError(f"cannot open indexed dataset '{prefix}' (.bin/.idx): {error}") from None
        self.tokens = np.memmap(prefix + ".bin", dtype=index.index.dtype, mode="r")
        self.seq_length = seq_length
        windows = (len(self.tokens) - 1) // seq_length
        if windows < 2:
            raise UserError(f"dataset '{prefix}' has {len(self.tokens)} tokens: too few for sequences of {seq_length}")
        order = np.random.default_rng(seed).permutation(windows)
        held_out = max(1, int(windows * eval_fraction))
        self.order = {"train": order[held_out:], "eval": order[:held_out]}

    def sample(self, index: int, split: str = "train") -> np.ndarray:
        order = self.order[split]
        start = int(order[index % len(order)]) * self.seq_length
        return np.asarray(self.tokens[start:start + self.seq_length + 1], dtype=np.int64)


def open_source(data_path: Optional[str], vocab_size: int, seq_length: int, seed: int,
                eval_fraction: float = 0.05):
    """Mock tokens when `data_path` is None, else the indexed dataset at that prefix."""
    if data_path is None:
        return MockTokens(vocab_size, seq_length, seed)
    return IndexedTokens(data_path, seq_length, seed, eval_fraction)


@dataclass(frozen=True)
class BatchSlicer:
    """Which samples one data-parallel rank reads for each micro-batch."""

    layout: MegatronLayout
    dp_rank: int

    def sample_indices(self, iteration: int, micro_batch: int) -> range:
        """Global indices of this rank's samples in micro-batch `micro_batch` of `iteration`."""
        mbs, dp = self.layout.micro_batch_size, self.layout.data_parallel
        start = iteration * self.layout.global_batch_size + micro_batch * mbs * dp + self.dp_rank * mbs
        return range(start, start + mbs)


def make_batch(samples: list[np.ndarray], device: torch.device) -> dict[str, torch.Tensor]:
    """Inputs, shifted labels, loss mask and positions for GPTModel."""
    data = torch.from_numpy(np.stack(samples))
    tokens, labels = data[:, :-1].contiguous(), data[:, 1:].contiguous()
    seq_length = tokens.shape[1]
    return {
        "tokens": tokens.to(device),
        "labels": labels.to(device),
        "loss_mask": torch.ones(tokens.shape, dtype=torch.float32, device=device),
        "position_ids": torch.arange(seq_length, device=device).unsqueeze(0).expand_as(tokens).contiguous(),
    }


def micro_batches(source, slicer: BatchSlicer, iteration: int, device: torch.device,
                  split: str = "train") -> Iterator[dict[str, torch.Tensor]]:
    """This rank's micro-batches of one iteration, in schedule order."""
    for micro_batch in range(slicer.layout.num_micro_batches):
        indices = slicer.sample_indices(iteration, micro_batch)
        yield make_batch([source.sample(i, split) for i in indices], device)


def iterators_for_chunks(source, slicer: BatchSlicer, iteration: int, device: torch.device,
                         split: str = "train"):
    """One iterator per model chunk (the interleaved schedule pulls each separately)."""
    if slicer.layout.virtual_stages == 1:
        return micro_batches(source, slicer, iteration, device, split)
    return [micro_batches(source, slicer, iteration, device, split) for _ in range(slicer.layout.virtual_stages)]
