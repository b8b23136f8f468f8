"""Split a hybrid plan into segments: maximal runs of consecutive layers with one strategy.

A Megatron `TransformerBlock` gives one process-group collection and one config
to all its layers, so each run of equal strategies (layout *and* recompute)
becomes its own block. Pure functions; no torch.
"""
from __future__ import annotations

from dataclasses import dataclass

from ...plan import LayerStrategy, Plan


@dataclass(frozen=True)
class Segment:
    """Layers `first ... first + count - 1` (global indices) sharing `strategy`."""

    first: int
    count: int
    strategy: LayerStrategy


def chunk_segments(plan: Plan, chunk_index: int) -> list[Segment]:
    """The segments of chunk `chunk_index`, in model order."""
    first = sum(len(c.layers) for c in plan.chunks[:chunk_index])
    segments: list[Segment] = []
    for offset, strategy in enumerate(plan.chunks[chunk_index].layers):
        if segments and segments[-1].strategy == strategy:
            last = segments[-1]
            segments[-1] = Segment(last.first, last.count + 1, strategy)
        else:
            segments.append(Segment(first + offset, 1, strategy))
    return segments


def stage_chunk_indices(plan: Plan, stage: int) -> list[int]:
    """Chunks that pipeline stage `stage` runs (one per virtual stage), in schedule order."""
    return list(range(stage, len(plan.chunks), plan.pipeline_parallel))
