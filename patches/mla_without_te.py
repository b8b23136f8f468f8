"""Patch: multi-latent attention builds without Transformer Engine.

Why: multi_latent_attention.py decides HAVE_TE by importing megatron.core.extensions.transformer_engine,
which imports without Transformer Engine too (it stands a MagicMock in for `te`, and its own HAVE_TE is
False), so MLA's HAVE_TE is True and its TELinear is a MagicMock instance. MultiLatentAttention.__init__
then runs `isinstance(self.linear_proj, TELinear)`, which raises TypeError: no MLA layer builds on
Megatron-Core's local spec where TE is absent. The patch sets MLA's HAVE_TE to the extension's, so the
fp8/fp4 check it guards is skipped, as it would be with TE's own flag (no fp8 runs without TE).
Targets: megatron-core 0.16.1.
Removable when: multi_latent_attention.py takes HAVE_TE from the extension (or checks that TE imports).
Applied wherever Transformer Engine is absent, GPU hosts included (applies_on_cuda).
"""
from __future__ import annotations

import importlib

from ._checks import require_text, require_version

NAME = "mla_without_te"
TARGET_VERSIONS = ("0.16.1",)
MODULE = "megatron.core.transformer.multi_latent_attention"
EXTENSION = "megatron.core.extensions.transformer_engine"
MARKER = "and isinstance(self.linear_proj, TELinear)"


def _te_imports() -> bool:
    return bool(importlib.import_module(EXTENSION).HAVE_TE)


def applies_on_cuda() -> bool:
    """MLA's flag is wrong wherever TE does not import, on GPU hosts too."""
    return not _te_imports()


def check() -> None:
    """Raise PatchTargetChanged unless MLA still guards its isinstance test with its own HAVE_TE."""
    require_version(NAME, TARGET_VERSIONS)
    module = require_text(MODULE, MARKER, NAME)
    require_text(MODULE, "HAVE_TE = True", NAME)
    if not hasattr(module, "HAVE_TE"):
        raise importlib.import_module("patches._source").PatchTargetChanged(f"patch {NAME}: {MODULE} has no HAVE_TE")


def apply() -> None:
    check()
    importlib.import_module(MODULE).HAVE_TE = _te_imports()


def is_applied() -> bool:
    return importlib.import_module(MODULE).HAVE_TE == _te_imports()
