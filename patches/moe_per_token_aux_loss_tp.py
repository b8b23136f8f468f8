"""Patch: with per-token loss, a router's aux and z losses weigh the tokens of its whole TP group.

Why: under `calculate_per_token_loss`, megatron-core scales every gradient by 1 / (the job's token count)
in finalize_model_grads, so `TopKRouter` multiplies its load-balancing loss and its z-loss by the number
of tokens they were computed over before attaching them (router.py, "To correct this scaling ...").
It multiplies by this rank's own tokens. Under sequence parallelism each rank of a TP group holds 1/tp of
the tokens: its load-balancing loss is the rank's share of a loss computed over the TP group's tokens
(token counts reduced over tp_cp), and its z-loss coefficient is already divided by the tp_cp size, so
both reach the gradients tp times too weak, where the same run without per-token loss weighs them
right. The sequence-level loss (seq_aux_loss), the mean over the micro-batch's b sequences, is counted
as s/tp tokens instead of b x s/tp (its routing map is reshaped to [s/tp, b x experts] before the count):
b x tp times too weak. Measured here: a hybrid plan (per-token loss, since its layers differ in data-parallel degree)
with a MoE layer at TP2 + SP missed one process's first-step gradient norm by 3.2e-5 relative; the
rewrite weighs each rank's share by its TP group's tokens (local tokens x tp_cp size; x b for the
sequence-level loss), and the plan
matches within 1e-6 (tests/runtime/test_moe_equivalence.py, hybrid cases).
Targets: megatron-core 0.16.1.
Removable when: router.py scales the attached losses by the token count of the TP group's whole
micro-batch under per-token loss.
Applied on every host (its row in patches/registry.py): the gradient is wrong on GPUs too.
"""
from __future__ import annotations

import importlib

from ._checks import require_version
from ._source import Replacement, patched_source, rewrite_function

NAME = "moe_per_token_aux_loss_tp"
TARGET_VERSIONS = ("0.16.1",)
REWRITES = {
    "attach_and_log_load_balancing_loss": (Replacement(
        "num_tokens = valid_token_count if valid_token_count is not None else activation.shape[0]",
        "num_tokens = (valid_token_count if valid_token_count is not None else activation.shape[0]) "
        "* self.tp_cp_group.size()"),),
    "_apply_seq_aux_loss": (Replacement("valid_token_count=local_num_tokens,",
                                        "valid_token_count=local_num_tokens * bsz,"),),
    "apply_z_loss": (Replacement(
        "num_tokens = (~padding_mask).sum() if padding_mask is not None else logits.shape[0]",
        "num_tokens = ((~padding_mask).sum() if padding_mask is not None else logits.shape[0]) "
        "* self.tp_cp_group.size()"),),
}


def _router():
    return importlib.import_module("megatron.core.transformer.moe.router").TopKRouter


def check() -> None:
    """Raise PatchTargetChanged unless the three token counts are still the rank's own."""
    require_version(NAME, TARGET_VERSIONS)
    for name, replacements in REWRITES.items():
        patched_source(_router(), name, replacements)


def apply() -> None:
    check()
    for name, replacements in REWRITES.items():
        rewrite_function(_router(), name, replacements)


def is_applied() -> bool:
    return all(getattr(_router().__dict__[name], "__megatron_auto_patched__", False) for name in REWRITES)
