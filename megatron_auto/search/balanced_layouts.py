"""Interleaved chunks for layer counts that no stock split interleaves: NVIDIA's layouts for DeepSeek-V3.

DeepSeek-V3's 61 layers do not divide over 4, 8 or 16 pipeline stages, with or without the embedding and the loss
counted as layers (61, 62 and 63 are not multiples of 4). So stock Megatron builds no interleaved chunks there, and
Megatron-Core refuses its EP overlap (--overlap-moe-expert-parallel-comm) with pp > 1 and one chunk per stage.
NVIDIA's recipes instead write the split out as a --pipeline-model-parallel-layout: Megatron-Bridge's DeepSeek-V3
pre-training on 1,024 H100s sets 'Et|(tt|)*30mL' at pp 8 with 4 chunks per stage
(scripts/performance/configs/deepseek/deepseek_v3_llm_pretrain.yaml @fa0315ae; data/published_h100/more_runs.json,
row mbridge2509_deepseekv3_fp8): the embedding E, the 61 layers t, the MTP module m and the loss L, two to a chunk.
megatron-auto builds no chunk without a decoder layer and puts the MTP module on the last chunk beside its layers,
so the nearest it builds is 'Et|(tt|)*29t|tL': two units to every chunk but the one before the last.

balanced_layout builds that rule for any pp and v; the search offers its layouts only where no stock split gives
interleaved chunks at that pp and chunks are wanted (megatron_space._balanced_layouts). Their chunks differ by one
layer at most, so they are not the far-uneven interleaved chunks the search leaves to the user's --virtual-stages
(megatron_space._mixed_splits says why).
"""
from __future__ import annotations

from typing import Optional

BALANCED_CHUNKS = (2, 4, 8)
"""Chunks per stage offered: the fill and drain fall as 1 / v, so the counts between these change the pipeline
little (as search/mixed_splits.py's interleaved_layouts), and each count is a config of its own to price."""


def balanced_layout(num_layers: int, pp: int, virtual_stages: int) -> Optional[tuple[int, ...]]:
    """Decoder layers per chunk, in Megatron's chunk order (chunk c on stage c % pp), of the layout that counts the
    embedding and the loss as a layer each and spreads the counted units over the pp x v chunks as evenly as they
    go: the first chunk and the last take the one unit more first, then chunks 1, 2, ... in order, so the short
    chunks fall just before the last. None where a chunk would hold no decoder layer."""
    chunks = pp * virtual_stages
    base, extra = divmod(num_layers + 2, chunks)
    units = [base] * chunks
    for chunk in [0, chunks - 1, *range(1, chunks - 1)][:extra]:
        units[chunk] += 1
    units[0] -= 1
    units[-1] -= 1
    return tuple(units) if chunks > 1 and min(units) >= 1 else None


def balanced_layouts(num_layers: int, pp: int) -> list[tuple[int, ...]]:
    """balanced_layout at each of BALANCED_CHUNKS chunks per stage, where it exists."""
    if pp < 2:
        return []
    layouts = (balanced_layout(num_layers, pp, v) for v in BALANCED_CHUNKS)
    return [layout for layout in layouts if layout is not None]
