"""Dropout RNG per part: each TP rank of a segment draws its own masks inside TP regions.

Megatron forks the tracker's "model-parallel-rng" state for dropout on
tensor-parallel shards (attention probabilities without SP, hidden states and
embeddings with SP) and seeds it `seed + 2718 + tp_rank` from the *global* TP
rank, which the hybrid runtime keeps at tp=1: every rank would hold TP rank 0's
stream, and the TP ranks of a segment would share masks for different shards.
Here every part (segment, or the embedding/head shell) keeps its own state,
seeded from the part's TP rank, and swaps it in for its forward. Outside TP
regions dropout draws from the default generator, seeded alike on every rank of
a stage, so the TP ranks of a part draw the same masks there, as in Megatron.

Recomputation replays correctly: Megatron's checkpoint saves the tracker
states at forward time (this part's state is then swapped in) and restores
them around the recompute.
"""
from __future__ import annotations

import contextlib

import torch

MODEL_PARALLEL = "model-parallel-rng"
TP_SEED_OFFSET = 2718
"""Megatron's offset of the model-parallel seed (model_parallel_cuda_manual_seed)."""
PART_SEED_STRIDE = 65537
"""Seed distance between parts, so two parts with the same TP rank draw different streams."""


def part_seed(stage_seed: int, tp_rank: int, part_index: int) -> int:
    """The model-parallel seed of a part: Megatron's for part 0 (the shell), offset per part after it."""
    return stage_seed + TP_SEED_OFFSET + tp_rank + PART_SEED_STRIDE * part_index


def _fresh_state(seed: int) -> torch.Tensor:
    """The generator state the tracker stores ("cuda" generator, or the CPU one without CUDA)."""
    generator = torch.Generator(device="cuda" if torch.cuda.is_available() else "cpu")
    generator.manual_seed(seed)
    return generator.get_state()


class PartRng:
    """One part's model-parallel dropout stream, swapped into Megatron's RNG tracker on entry."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.state = _fresh_state(seed)

    @contextlib.contextmanager
    def active(self):
        """Run the part's forward with its own "model-parallel-rng" state; keep the advanced state after."""
        from megatron.core.tensor_parallel import get_cuda_rng_tracker

        tracker = get_cuda_rng_tracker()
        states = tracker.get_states()
        outer = states[MODEL_PARALLEL]
        states[MODEL_PARALLEL] = self.state
        tracker.set_states(states)
        try:
            yield
        finally:
            states = tracker.get_states()
            self.state = states[MODEL_PARALLEL]
            states[MODEL_PARALLEL] = outer
            tracker.set_states(states)
