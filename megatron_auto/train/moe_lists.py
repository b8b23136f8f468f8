"""--moe-router-load-balancing-type and --moe-aux-loss-coeff: Megatron-LM takes a list of each (nargs='+').

Megatron-Core can run several load-balancing losses at once, one coefficient each; Megatron-LM's validate_args
unwraps a list of one. This runtime runs one loss, so a list of one is unwrapped as Megatron-LM does and a
longer list is refused with one line (rather than argparse's "unrecognized arguments" for the second value).
"""
from __future__ import annotations

import argparse
from typing import Optional

LIST_FLAGS = (("--moe-router-load-balancing-type", "moe_router_load_balancing_type"),
              ("--moe-aux-loss-coeff", "moe_aux_loss_coeff"))


def unwrap_moe_lists(args: argparse.Namespace) -> Optional[str]:
    """Unwrap each list of one on `args` (as Megatron-LM's validate_args); the problem with a longer list."""
    for flag, name in LIST_FLAGS:
        value = getattr(args, name)
        if isinstance(value, list) and len(value) == 1:
            setattr(args, name, value[0])
        elif isinstance(value, list):
            return (f"{flag} {' '.join(map(str, value))}: several load-balancing losses at once are not run by "
                    "this runtime yet (give one)")
    return None
