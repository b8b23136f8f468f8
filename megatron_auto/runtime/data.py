"""Training samples: mock tokens or Megatron indexed datasets (blended, split), over data-parallel ranks.

Sample `n` of the run is a fixed function of `n`, and iteration `i` uses
samples `i*B ... (i+1)*B - 1` in Megatron's sampler order (micro-batch by
micro-batch, each DP rank taking its slice of `micro_batch_size`), so every
layout, and a run resumed at any iteration, sees the same global batches. With a
growing batch (runtime/batch_schedule.py) an iteration starts at the samples consumed
before it, as Megatron's MegatronPretrainingSampler does.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Iterator, Optional

import numpy as np
import torch

from .layout import MegatronLayout
from .settings import TrainSettings

logger = logging.getLogger(__name__)


class MockTokens:
    """Pseudo-random tokens, a fixed function of (seed, sample index)."""

    def __init__(self, vocab_size: int, seq_length: int, seed: int) -> None:
        self.vocab_size, self.seq_length, self.seed = vocab_size, seq_length, seed

    def sample(self, index: int, split: str = "train") -> np.ndarray:
        """seq_length + 1 token ids."""
        offset = 0 if split == "train" else 1 << 40
        rng = np.random.default_rng((self.seed, offset + index))
        return rng.integers(0, self.vocab_size, self.seq_length + 1, dtype=np.int64)


def open_source(settings: TrainSettings, seq_length: int, global_batch_size: int):
    """Megatron-core's blended GPT datasets (runtime/gpt_data.py) sized for this run's iterations and
    evaluations, over `--data-path` or, for --mock-data, its MockGPTDataset; uniform random tokens when a run
    names neither (DataSettings.mock_dataset)."""
    data = settings.data
    if not data.from_files and not data.mock_dataset:
        return MockTokens(data.vocab_size, seq_length, settings.seed)
    from .gpt_data import SPLIT_NAMES, GPTDatasets, split_sizes

    sizes = split_sizes(settings.train_iters, settings.eval_interval, settings.eval_iters, global_batch_size)
    evaluates = settings.eval_iters > 0  # at every eval_interval, and after the last iteration
    source = GPTDatasets(data, seq_length, settings.seed, sizes, evaluates)
    if torch.distributed.is_initialized() and torch.distributed.get_rank() == torch.distributed.get_world_size() - 1:
        per_split = zip(SPLIT_NAMES, data.blend_per_split)
        # Without files megatron-core builds its mock dataset over an even split, whatever --split says.
        words, split = (data.blend, data.split) if data.from_files else (source.prefixes, "1,1,1")
        where = (f"{' '.join(words)}, split {split}" if not data.blend_per_split
                 else "; ".join(f"{name} {' '.join(words) or '(none)'}" for name, words in per_split))
        logger.info("data: %s; samples %s", where, source.description)
    return source


@dataclass(frozen=True)
class BatchSlicer:
    """Which samples one data-parallel rank reads for each micro-batch."""

    layout: MegatronLayout
    dp_rank: int

    def sample_indices(self, iteration: int, micro_batch: int, first_sample: Optional[int] = None) -> range:
        """Global indices of this rank's samples in micro-batch `micro_batch` of `iteration` (whose first
        sample is `first_sample`, by default iteration x global batch)."""
        mbs, dp = self.layout.micro_batch_size, self.layout.dims.dp
        if first_sample is None:
            first_sample = iteration * self.layout.global_batch_size
        start = first_sample + micro_batch * mbs * dp + self.dp_rank * mbs
        return range(start, start + mbs)


def make_batch(samples: list, device: torch.device) -> dict[str, torch.Tensor]:
    """Inputs, shifted labels, loss mask and positions for GPTModel, from token arrays of
    seq_length + 1 (mock data) or from GPTDataset's samples (dicts of those four fields)."""
    if isinstance(samples[0], dict):
        return {key: torch.stack([s[key] for s in samples]).contiguous().to(device) for key in samples[0]}
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
                  split: str = "train", first_sample: Optional[int] = None) -> Iterator[dict[str, torch.Tensor]]:
    """This rank's micro-batches of one iteration, in schedule order."""
    for micro_batch in range(slicer.layout.num_micro_batches):
        indices = slicer.sample_indices(iteration, micro_batch, first_sample)
        yield make_batch([source.sample(i, split) for i in indices], device)


def iterators_for_chunks(source, slicer: BatchSlicer, iteration: int, device: torch.device,
                         split: str = "train", first_sample: Optional[int] = None):
    """One iterator per model chunk (the interleaved schedule pulls each separately)."""
    if slicer.layout.dims.vp == 1:
        return micro_batches(source, slicer, iteration, device, split, first_sample)
    return [micro_batches(source, slicer, iteration, device, split, first_sample)
            for _ in range(slicer.layout.dims.vp)]
