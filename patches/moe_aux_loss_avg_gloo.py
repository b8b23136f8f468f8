"""Patch: averaging the logged MoE auxiliary losses over ranks without ReduceOp.AVG.

Why: `moe_utils.reduce_aux_losses_tracker_across_ranks` (called by `track_moe_metrics`, which
logs load_balancing_loss / z_loss) averages over the data-parallel group with
`all_reduce(op=ReduceOp.AVG)`, which gloo does not implement. The rewrite sums and divides by
the group's size: the same mean. It changes only what is logged, never a gradient.
Targets: megatron-core 0.16.1.
Removable when: torch's gloo backend implements ReduceOp.AVG.
Applied only when CUDA is absent (patches.apply_all).
"""
from __future__ import annotations

import importlib

from ._checks import require_version
from ._source import Replacement, patched_source, rewrite_function

NAME = "moe_aux_loss_avg_gloo"
TARGET_VERSIONS = ("0.16.1",)
FUNCTION = "reduce_aux_losses_tracker_across_ranks"
REPLACEMENTS = (
    Replacement("""                torch.distributed.all_reduce(
                    values, group=dp_group, op=torch.distributed.ReduceOp.AVG
                )""", """                torch.distributed.all_reduce(values, group=dp_group)
                values /= torch.distributed.get_world_size(dp_group)"""),
    Replacement("""            torch.distributed.all_reduce(
                values, group=tracker[name]['avg_group'], op=torch.distributed.ReduceOp.AVG
            )""", """            torch.distributed.all_reduce(values, group=tracker[name]['avg_group'])
            values /= torch.distributed.get_world_size(tracker[name]['avg_group'])"""),
)


def _moe_utils():
    return importlib.import_module("megatron.core.transformer.moe.moe_utils")


def check() -> None:
    """Raise PatchTargetChanged unless both averages still read as expected."""
    require_version(NAME, TARGET_VERSIONS)
    patched_source(_moe_utils(), FUNCTION, REPLACEMENTS)


def apply() -> None:
    check()
    rewrite_function(_moe_utils(), FUNCTION, REPLACEMENTS)


def is_applied() -> bool:
    return getattr(getattr(_moe_utils(), FUNCTION), "__megatron_auto_patched__", False)
