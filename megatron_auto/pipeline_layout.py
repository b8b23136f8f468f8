"""Megatron-LM's `--pipeline-model-parallel-layout`: the layers of every model chunk, spelled out.

The grammar is Megatron-Core's (transformer/pipeline_parallel_layer_layout.py, 0.16):
chunks are separated by `|`, in chunk order (chunk c runs on pipeline stage c % pp, so
pp x v chunks give v virtual stages); `E` is the embedding, `t` a decoder layer, `L` the
output layer and loss, `m` a multi-token-prediction layer; `x*n` repeats a character,
`(...)*n` a group; commas are cosmetic. "Et*3|(tt|)*29,m|L" is DeepSeek-V3's.

This module reads a layout into decoder layers per chunk, which is what a Plan holds, and
writes one back for chunk sizes that no other Megatron-LM flag expresses. No torch here.
"""
from __future__ import annotations

import re

from .errors import UserError

LAYOUT_FLAG = "--pipeline-model-parallel-layout"
_REPEATS = (re.compile(r"\(([^)]+)\)\*(\d+)"), re.compile(r"(.)\*(\d+)"))


def unrolled_chunks(text: str) -> list[str]:
    """The chunks of `text` with every repeat written out: "E(tt|)*2L" -> ["Ett", "tt", "L"]."""
    unrolled = text.replace(",", "")
    for pattern in _REPEATS:  # groups first, then single characters, as Megatron-Core does
        unrolled = pattern.sub(lambda match: match.group(1) * int(match.group(2)), unrolled)
    return unrolled.split("|")


def chunk_layers_of_layout(text: str, pipeline_parallel: int, num_layers: int) -> tuple[int, ...]:
    """Decoder layers per model chunk of the layout `text`, in chunk order; UserError (one line) for a layout
    Megatron-Core refuses (what this runtime cannot build besides: runtime_chunk_problem, runtime_mtp_problem)."""
    where = f"{LAYOUT_FLAG} {text!r}"
    chunks = unrolled_chunks(text)
    stray = sorted({char for chunk in chunks for char in chunk} - set("EtLm"))
    if stray:
        raise UserError(f"{where}: unknown layer character(s) {' '.join(stray)} (E, t, L and m are Megatron's)")
    if len(chunks) % pipeline_parallel:
        raise UserError(f"{where}: {len(chunks)} chunks do not divide over {pipeline_parallel} pipeline stages")
    _check_mtp_placement(where, chunks, pipeline_parallel)
    flat = "".join(chunks)
    if flat.count("E") != 1 or flat.count("L") != 1 or not flat.startswith("E") or not flat.endswith("L"):
        raise UserError(f"{where}: the layout must start with the embedding E and end with the loss L, "
                        "each once (as Megatron-Core checks)")
    counts = tuple(chunk.count("t") for chunk in chunks)
    if sum(counts) != num_layers:
        raise UserError(f"{where} places {sum(counts)} decoder layers; the model has {num_layers} (--num-layers)")
    if "" in chunks:
        raise UserError(f"{where}: chunk {chunks.index('')} holds nothing (each chunk here holds a decoder layer, "
                        "the embedding E, or the loss L)")
    return counts


def _check_mtp_placement(where: str, chunks: list[str], pipeline_parallel: int) -> None:
    """Megatron-Core's rules for the MTP layers (transformer/pipeline_parallel_layer_layout.py,
    validate_layer_layout): all in one chunk, after every decoder layer, and in the last virtual stage of its
    pipeline rank; UserError (one line) otherwise."""
    holding = _chunks_holding_mtp(chunks)
    if not holding:
        return
    flat = "".join(chunks)
    if len(holding) > 1 or "t" in flat[flat.index("m"):]:
        raise UserError(f"{where}: the multi-token-prediction layers (m) go in one chunk, after every decoder "
                        "layer (as Megatron-Core checks)")
    if holding[0] < len(chunks) - pipeline_parallel:
        raise UserError(f"{where}: the multi-token-prediction layers (m) go in the last chunk of a pipeline stage "
                        "(as Megatron-Core checks)")


def mtp_chunk_of_layout(text: str) -> int | None:
    """The chunk of the layout `text` that holds the MTP layers when it is not the last (Megatron-Core's
    standalone MTP: "...|m|L"); None when they are in the last chunk, beside the loss, or absent."""
    chunks = unrolled_chunks(text)
    holding = _chunks_holding_mtp(chunks)
    return holding[0] if holding and holding[0] != len(chunks) - 1 else None


def _chunks_holding_mtp(chunks: list[str]) -> list[int]:
    return [index for index, chunk in enumerate(chunks) if "m" in chunk]


def runtime_chunk_problem(counts: tuple[int, ...]) -> str:
    """Why this runtime cannot build chunks of these decoder layers, or '': it builds every chunk with at least
    one. `estimate` prices chunks that hold only the embedding, the MTP layers or the loss, as Megatron-Core
    builds them (e.g. Megatron-Bridge's DeepSeek-V3 layout "Et|(tt|)*30mL")."""
    if min(counts) >= 1:
        return ""
    return (f"chunk {counts.index(0)} holds no decoder layer (this runtime builds every chunk with at least one; "
            "`megatron-auto estimate` prices such a layout)")


def runtime_mtp_problem(mtp_chunk: int | None) -> str:
    """Why this runtime cannot build MTP layers in chunk `mtp_chunk`, or '': it builds them in the last chunk,
    beside the loss, as Megatron-Core does without a layout; `estimate` prices a stage of their own."""
    if mtp_chunk is None:
        return ""
    return (f"the multi-token-prediction layers (m) in chunk {mtp_chunk}, a stage of their own (Megatron-Core's "
            "standalone MTP), are not run by this runtime (`megatron-auto estimate` prices such a layout)")


def layout_of_chunk_layers(counts: tuple[int, ...], mtp_num_layers: int = 0, mtp_chunk: int | None = None) -> str:
    """The layout string of these decoder layers per chunk: "Et*3|t*4|t*4|t*3L" for (3, 4, 4, 3), "E|t*4|t*4|t*6L"
    for (0, 4, 4, 6); with `mtp_num_layers`, the MTP layers after the last chunk's decoder layers ("...|t*3mL"),
    where Megatron-Core builds them without a layout, or in chunk `mtp_chunk` (standalone: "...|t*3|m|L")."""
    chunks = [f"t*{count}" if count > 1 else "t" * count for count in counts]
    chunks[0] = "E" + chunks[0]
    mtp = len(chunks) - 1 if mtp_chunk is None else mtp_chunk
    chunks[mtp] = chunks[mtp] + "m" * mtp_num_layers
    chunks[-1] = chunks[-1] + "L"
    return "|".join(chunks)


def mtp_layers_of_layout(text: str) -> int:
    """How many multi-token-prediction layers (m) the layout `text` places."""
    return "".join(unrolled_chunks(text)).count("m")
