"""The rest of Megatron-LM 0.16.1's parser: every flag the argument groups do not honour gets a verdict here.

A launch line written for Megatron-LM must never meet argparse's "unrecognized arguments". The flags honoured
are the argument groups' (arguments_*.py); runtime/compat_flags.py holds the older lists of flags accepted
without effect or refused. This module covers the remainder of megatron_lm_flags_0_16_1.txt (generated from
Megatron-LM's source by flag_list.py): each is accepted without effect (named in the log with the reason) or
refused before any work with one line saying why. Each is registered with the shape Megatron-LM gives it
(switch, or how many values), read from that list, so that its values are consumed as Megatron-LM consumes them.
"""
from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Optional

from .flag_verdicts_tables import NO_EFFECT, REFUSED

if TYPE_CHECKING:
    from .flag_list import FlagSpec


def dest(flag: str) -> str:
    return "verdict_" + flag.lstrip("-").replace("-", "_")


POST_TRAINING_SPECS = ((("--export-te-mcore-model",), "store_true", "-"),)
"""FlagSpec fields of Megatron-LM's post-training (ModelOpt) flags, outside arguments.py's parser, that its GPT
functional tests pass to pretraining (tests/megatron_lm_cases/): each has a verdict too."""


def covered_specs() -> list[FlagSpec]:
    """The arguments of Megatron-LM's parser that this module registers (keyed by their first option string)."""
    # Imported here: `python -m megatron_auto.train.flag_list` runs that module after the package imports this one.
    from .flag_list import FlagSpec, read_list

    specs = [*read_list(), *(FlagSpec(*spec) for spec in POST_TRAINING_SPECS)]
    return [spec for spec in specs if spec.options[0] in NO_EFFECT or spec.options[0] in REFUSED]


def _add(group: argparse._ArgumentGroup, spec: FlagSpec) -> None:
    """One argument with Megatron-LM's shape; its value is None unless the launch line gives it."""
    name = dest(spec.options[0])
    if spec.action == "BooleanOptionalAction":
        group.add_argument(*spec.options, dest=name, action=argparse.BooleanOptionalAction, default=None)
    elif not spec.takes_value:
        group.add_argument(*spec.options, dest=name, action="store_const", const=True, default=None)
    else:
        nargs = None if spec.nargs == "-" else int(spec.nargs) if spec.nargs.isdigit() else spec.nargs
        group.add_argument(*spec.options, dest=name, nargs=nargs, metavar="VALUE", default=None)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The remaining Megatron-LM flags: without effect, then refused (README.md's flag table says why)."""
    no_effect = parser.add_argument_group("other Megatron-LM flags accepted without effect (README.md says why)")
    refused = parser.add_argument_group("other Megatron-LM flags refused here (one line says why)")
    for spec in covered_specs():
        _add(no_effect if spec.options[0] in NO_EFFECT else refused, spec)


def no_effect(args: argparse.Namespace) -> list[tuple[str, str]]:
    """(flag, reason) of every accepted-without-effect flag of this module the run was given."""
    return [(flag, why) for flag, why in NO_EFFECT.items() if getattr(args, dest(flag), None) is not None]


def refusal(args: argparse.Namespace) -> Optional[str]:
    """One line naming the first refused flag of this module the run was given, and why; or None."""
    for flag, why in REFUSED.items():
        if getattr(args, dest(flag), None) is not None:
            return f"{flag}: {why}"
    return None

