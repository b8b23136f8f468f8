"""Every random stream a rank draws from, saved beside a checkpoint so a resume is bit-identical.

What Megatron-LM keeps in its `rng_state` (checkpointing.get_rng_state): Python's
`random`, numpy's global generator, torch's CPU generator, the CUDA generator when
there is one, and Megatron's RNG tracker (the "model-parallel-rng" stream that
tensor-parallel dropout forks). Each rank writes its own file, named by its rank and
the world size; a resume under another world size has no file per rank to take, so it
keeps the fresh seeds and says so (its layout draws other masks anyway).
"""
from __future__ import annotations

import os
import random

import numpy as np
import torch

FOLDER = "rng"


def capture() -> dict:
    """This process's random streams, as picklable values."""
    from megatron.core.tensor_parallel import get_cuda_rng_tracker

    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state() if torch.cuda.is_available() else None,
        "tracker": {name: state.clone() for name, state in get_cuda_rng_tracker().get_states().items()},
    }


def restore(state: dict) -> None:
    """Set every stream `capture` returned."""
    from megatron.core.tensor_parallel import get_cuda_rng_tracker

    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if state["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
    get_cuda_rng_tracker().set_states(state["tracker"])


def rank_file(checkpoint_dir: str, rank: int, world_size: int) -> str:
    return os.path.join(checkpoint_dir, FOLDER, f"rank_{rank:05d}_of_{world_size:05d}.pt")


def save(checkpoint_dir: str, part_streams: list = ()) -> None:
    """Write this rank's streams into `checkpoint_dir`/rng/ (every rank calls it). `part_streams`: the
    hybrid runtime's per-part dropout streams (hybrid/rng.PartRng), saved with them."""
    path = rank_file(checkpoint_dir, torch.distributed.get_rank(), torch.distributed.get_world_size())
    os.makedirs(os.path.dirname(path), exist_ok=True)
    torch.save({**capture(), "parts": [stream.state.clone() for stream in part_streams]}, path)


def load(checkpoint_dir: str, part_streams: list = ()) -> bool:
    """Restore this rank's streams (and those of `part_streams`) from `checkpoint_dir`; False (streams
    untouched) when the checkpoint has none for this rank and world size, or another number of parts."""
    path = rank_file(checkpoint_dir, torch.distributed.get_rank(), torch.distributed.get_world_size())
    if not os.path.isfile(path):
        return False
    state = torch.load(path, weights_only=False)
    parts = state.get("parts", [])
    if len(parts) != len(part_streams):
        return False
    restore(state)
    for stream, saved in zip(part_streams, parts):
        stream.state = saved
    return True
