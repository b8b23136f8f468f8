"""Megatron-LM's pretrain_gpt.py command line: the parser, its groups in Megatron-LM's order, and parse_args."""
from __future__ import annotations

import argparse
from typing import Optional

from megatron_auto.cli.parser import OneLineParser
from megatron_auto.runtime import compat_flags

from . import flag_verdicts, validation, virtual_stages
from .arguments_data import (add_checkpointing_args, add_data_args, add_fim_args, add_logging_args,
                             add_tokenizer_args, add_validation_args)
from .arguments_model import add_mla_args, add_moe_args, add_mtp_args, add_network_size_args
from .arguments_parallel import add_auto_parallel_args, add_distributed_args
from .arguments_training import (add_initialization_args, add_kernel_args, add_learning_rate_args,
                                 add_mixed_precision_args, add_regularization_args, add_training_args)
from .moe_lists import unwrap_moe_lists
from .older_spellings import settle_encoder_spellings
from .usage import DESCRIPTION

ARGUMENT_GROUPS = (add_network_size_args, add_regularization_args, add_training_args, add_initialization_args,
                   add_learning_rate_args, add_checkpointing_args, add_mixed_precision_args, add_kernel_args,
                   add_distributed_args, add_auto_parallel_args, add_validation_args, add_data_args,
                   add_fim_args, add_tokenizer_args, add_logging_args, add_moe_args, add_mla_args, add_mtp_args,
                   compat_flags.add_arguments, flag_verdicts.add_arguments)
"""The groups of flags, in the order of Megatron-LM's arguments.py; the accepted and refused flags last."""


def build_parser() -> OneLineParser:
    """The parser: a usage error is one line (no usage block, no --help hint) and exit status 2."""
    # No abbreviations, as Megatron-LM's parser: `--optimizer adam` is not `--optimizer-impl adam`.
    parser = OneLineParser(description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter,
                           allow_abbrev=False, see_help=False)
    for add in ARGUMENT_GROUPS:
        add(parser)
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The flags, checked as Megatron-LM's validate_args checks them, with what they derive set."""
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    problem = unknown_flags_error(args, unknown) or settle_flags(args)
    if problem:
        parser.error(problem)
    return args


def unknown_flags_error(args: argparse.Namespace, unknown: list[str]) -> Optional[str]:
    """A refused flag (and why), flags no one knows, or a wandb project without a name."""
    refused = compat_flags.refusal(args, unknown) or flag_verdicts.refusal(args)
    if refused:
        return refused
    if compat_flags.unknown_flags(unknown):
        return f"unrecognized arguments: {' '.join(compat_flags.unknown_flags(unknown))}"
    if args.wandb_project and not args.wandb_exp_name:
        return "--wandb-project needs --wandb-exp-name (Megatron-LM: 'Please specify the wandb experiment name!')"
    return None


def settle_flags(args: argparse.Namespace) -> Optional[str]:
    """The cross-flag checks in order; between them, what the older spellings and the growing batch derive is
    set on `args` (this parser's own namespace, as Megatron-LM's validate_args sets it): the first problem."""
    problem = (settle_encoder_spellings(args) or unwrap_moe_lists(args)
               or validation.moe_layer_recompute_error(args))
    if problem:
        return problem
    args.recompute_granularity, args.recompute_modules = validation.recompute_from_flags(args)
    problem = validation.schedule_flags_error(args)
    if problem:
        return problem
    args.num_layers_per_virtual_pipeline_stage, problem = virtual_stages.layers_per_virtual_stage(args)
    if problem:
        return problem
    ramp = validation.batch_ramp_from_flags(args)
    if ramp.error:
        return ramp.error
    args.batch_ramp, args.global_batch_size = ramp.ramp, ramp.global_batch_size
    checks = (validation.size_flags_error, validation.checkpoint_flags_error, validation.moe_router_error,
              validation.shared_expert_overlap_error, validation.mla_flags_error, validation.mtp_flags_error,
              validation.missing_data_error)
    return next((problem for problem in (check(args) for check in checks) if problem), None)
