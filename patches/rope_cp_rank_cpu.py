"""Patch: the rotary embedding picks this context-parallel rank's positions on the CPU.

Why: under context parallelism `RotaryEmbedding.forward` keeps the positions of this rank's two
sequence chunks with `rope_utils.get_pos_emb_on_this_cp_rank`, which builds its index tensor in
pinned memory and moves it with `.cuda()`: both fail without CUDA. The rewrite builds the index on
the embedding's own device; the indices, and so the positions, are the same.
Targets: megatron-core 0.16.1.
Removable when: get_pos_emb_on_this_cp_rank builds its index on pos_emb's device.
Applied only when CUDA is absent (patches.apply_all).
"""
from __future__ import annotations

import importlib

from ._checks import require_version
from ._source import Replacement, patched_source, rewrite_function

NAME = "rope_cp_rank_cpu"
TARGET_VERSIONS = ("0.16.1",)
FUNCTION = "get_pos_emb_on_this_cp_rank"
REPLACEMENTS = (
    Replacement('device="cpu", pin_memory=True\n    ).cuda(non_blocking=True)', "device=pos_emb.device\n    )"),
)


def _modules():
    """(rope_utils, rotary_pos_embedding, yarn_rotary_pos_embedding): the owner and the modules that
    imported it by name."""
    embeddings = "megatron.core.models.common.embeddings"
    return tuple(importlib.import_module(f"{embeddings}.{name}")
                 for name in ("rope_utils", "rotary_pos_embedding", "yarn_rotary_pos_embedding"))


def check() -> None:
    """Raise PatchTargetChanged unless the index is still built in pinned memory and moved with .cuda()."""
    require_version(NAME, TARGET_VERSIONS)
    patched_source(_modules()[0], FUNCTION, REPLACEMENTS)


def apply() -> None:
    check()
    owner, *users = _modules()
    rewrite_function(owner, FUNCTION, REPLACEMENTS, rebind=tuple(users))


def is_applied() -> bool:
    return all(getattr(getattr(module, FUNCTION), "__megatron_auto_patched__", False) for module in _modules())
