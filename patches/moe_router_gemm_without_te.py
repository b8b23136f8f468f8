"""Patch: the MoE router's gating GEMM without Transformer Engine.

Why: `moe_utils.RouterGatingLinearFunction` tests `te_general_gemm is not None`, but
moe_utils defines `te_general_gemm` only inside its `try: import transformer_engine` block;
without TE the name is missing and every router forward raises NameError (with any
--moe-router-dtype but fp64). The patch defines it as None when TE did not import, so the
router runs its torch.mm path, as upstream intends.
Targets: megatron-core 0.16.1.
Removable when: moe_utils sets te_general_gemm = None in its ImportError branch.
Applied wherever Transformer Engine is absent, GPU hosts included (applies_on_cuda).
"""
from __future__ import annotations

import importlib

from ._checks import require_text, require_version

NAME = "moe_router_gemm_without_te"
TARGET_VERSIONS = ("0.16.1",)
MODULE = "megatron.core.transformer.moe.moe_utils"
MARKER = "if te_general_gemm is not None and router_dtype != torch.float64:"


def applies_on_cuda() -> bool:
    """The name is missing wherever TE did not import, on GPU hosts too."""
    return not importlib.import_module(MODULE).HAVE_TE


def check() -> None:
    """Raise PatchTargetChanged unless the router still tests the name."""
    require_version(NAME, TARGET_VERSIONS)
    require_text(MODULE, MARKER, NAME)


def apply() -> None:
    check()
    module = importlib.import_module(MODULE)
    if not hasattr(module, "te_general_gemm"):
        module.te_general_gemm = None


def is_applied() -> bool:
    return hasattr(importlib.import_module(MODULE), "te_general_gemm")
