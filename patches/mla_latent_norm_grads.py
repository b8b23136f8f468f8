"""Patch: finalize_model_grads does not sum multi-latent attention's latent-norm gradients over TP.

Why: with --qk-layernorm, _allreduce_non_tensor_model_parallel_grads sums over the TP group every parameter
named q_layernorm or k_layernorm, since a standard attention's per-head q/k norms get a part of their gradient
from each rank's heads. MLA's q_layernorm normalises the query latent, which every TP rank holds whole (its up
projection all-reduces its input gradient), so each rank's gradient is already the whole: the sum doubles it
at TP2 (measured: the q latent norm's gradient exactly 2x one process's). Under sequence parallelism the
latent norms run on each rank's share of the tokens and are summed as sequence-parallel parameters (their
`sequence_parallel` mark), as they must be. The rewrite leaves MLA configs out of the name rule.
Targets: megatron-core 0.16.1.
Removable when: finalize_model_grads sums only per-head q/k norm gradients.
Applied on every host (its row in patches/registry.py): the local spec's MLA names its latent norm q_layernorm on GPUs too.
"""
from __future__ import annotations

import importlib

from ._checks import require_version
from ._source import Replacement, has_replacements, patched_source, rewrite_function

NAME = "mla_latent_norm_grads"
TARGET_VERSIONS = ("0.16.1",)
MODULE = "megatron.core.distributed.finalize_model_grads"
FUNCTION = "_allreduce_non_tensor_model_parallel_grads"
REPLACEMENTS = (Replacement(
    'config.qk_layernorm and ("q_layernorm" in name or "k_layernorm" in name)',
    'config.qk_layernorm and not config.multi_latent_attention and ("q_layernorm" in name or "k_layernorm" in name)'),)


def check() -> None:
    require_version(NAME, TARGET_VERSIONS)
    patched_source(importlib.import_module(MODULE), FUNCTION, REPLACEMENTS)


def apply() -> None:
    check()
    module = importlib.import_module(MODULE)
    new = rewrite_function(module, FUNCTION, REPLACEMENTS)
    if getattr(module, "_allreduce_layernorm_grads", None) is not new:  # upstream's legacy alias
        module._allreduce_layernorm_grads = new


def is_applied() -> bool:
    return has_replacements(importlib.import_module(MODULE), FUNCTION, REPLACEMENTS)
