"""--encoder-num-layers and --encoder-seq-length: Megatron-LM's older spellings of --num-layers and --seq-length.

Megatron-LM 0.16.1's validate_args takes either spelling and refuses both together; older launch lines (and
some of its functional tests) still give the encoder form. They are settled first, as every later check reads
the model's depth and sequence length.
"""
from __future__ import annotations

import argparse
from typing import Optional

SPELLINGS = (("num_layers", "--num-layers", "encoder_num_layers", "--encoder-num-layers"),
             ("seq_length", "--seq-length", "encoder_seq_length", "--encoder-seq-length"))


def settle_encoder_spellings(args: argparse.Namespace) -> Optional[str]:
    """Set --num-layers / --seq-length from their encoder spelling on `args`; the problem, as Megatron-LM's."""
    for name, flag, older, older_flag in SPELLINGS:
        value, older_value = getattr(args, name), getattr(args, older)
        if value is not None and older_value is not None:
            return f"cannot have both {flag[2:]} and {older_flag[2:]} specified (as in Megatron-LM)"
        if value is None and older_value is None:
            return f"the following arguments are required: {flag} (or Megatron-LM's older {older_flag})"
        if value is None:
            setattr(args, name, older_value)
    return None
