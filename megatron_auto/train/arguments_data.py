"""The data, logging and checkpoint flags, grouped as Megatron-LM's arguments.py groups them: validation,
data, tokenizer, logging, checkpointing."""
from __future__ import annotations

import argparse

from megatron_auto.runtime.tokenizers import add_tokenizer_flags

PER_SPLIT_DATA_FLAGS = ("--train-data-path", "--valid-data-path", "--test-data-path")
"""Megatron-LM's per-split datasets, in train, validation, test order."""


def per_split_paths(args: argparse.Namespace) -> tuple[tuple[str, ...], ...]:
    """The words of each per-split data flag, in train, validation, test order (empty where not given)."""
    return tuple(tuple(getattr(args, flag[2:].replace("-", "_")) or ()) for flag in PER_SPLIT_DATA_FLAGS)


def add_validation_args(parser: argparse.ArgumentParser) -> None:
    """Megatron-LM's _add_validation_args: how often and how long to evaluate."""
    group = parser.add_argument_group("validation")
    group.add_argument("--eval-interval", type=int, default=0)
    group.add_argument("--eval-iters", type=int, default=10)


def add_data_args(parser: argparse.ArgumentParser) -> None:
    """Megatron-LM's _add_data_args: the datasets, their split, and how samples are read."""
    group = parser.add_argument_group("data and dataloader")
    group.add_argument("--data-path", nargs="+",
                       help="Megatron-LM's forms: PREFIX, PREFIX1 PREFIX2 ... (weighted by size), or "
                            "W1 PREFIX1 W2 PREFIX2 ... (a weighted blend)")
    group.add_argument("--mock-data", action="store_true")
    for flag, split in zip(PER_SPLIT_DATA_FLAGS, ("training", "validation", "test")):
        group.add_argument(flag, nargs="+", help=f"the {split} split's own datasets, whole (--data-path's forms; "
                                                 "in place of --data-path and --split)")
    group.add_argument("--split", help="train,validation,test weights of each dataset's documents "
                                       "(default 969,30,1, as Megatron-LM)")
    group.add_argument("--no-mmap-bin-files", action="store_false", dest="mmap_bin_files",
                       help="read the .bin files with file reads instead of memory maps")
    group.add_argument("--data-cache-path", help="directory for the dataset index cache (default: beside each dataset)")
    group.add_argument("--eod-mask-loss", action="store_true", help="no loss on end-of-document tokens")
    group.add_argument("--reset-position-ids", action="store_true",
                       help="positions restart after each end-of-document token")
    group.add_argument("--reset-attention-mask", action="store_true",
                       help="refused: per-document attention masks are not supported here")
    group.add_argument("--no-create-attention-mask-in-dataloader", action="store_false",
                       dest="create_attention_mask_in_dataloader",
                       help="without effect: the dataloader never builds masks here (attention is causal in the kernel)")


def add_fim_args(parser: argparse.ArgumentParser) -> None:
    """Megatron-LM's fill-in-the-middle flags (its _add_data_args; defaults as there): runtime/fim.py."""
    group = parser.add_argument_group("fill-in-the-middle data")
    group.add_argument("--fim-data", action="store_true",
                       help="put samples in fill-in-the-middle form (Megatron-LM's GPTFIMDataset)")
    group.add_argument("--fim-rate", type=float, default=0.5, help="probability of the FIM form (default 0.5)")
    group.add_argument("--fim-spm-rate", type=float, default=0.5,
                       help="probability that a FIM example is suffix-prefix-middle rather than prefix-suffix-middle")
    group.add_argument("--fim-split-sample", help="token at which samples are cut into fragments, each FIM'd apart")
    group.add_argument("--fim-fragment-rate", type=float,
                       help="probability of the FIM form of each fragment (with --fim-split-sample)")
    group.add_argument("--fim-no-prefix", help="leave segments whose text starts with this as they are")
    for name, default in (("prefix", "<fim_prefix>"), ("middle", "<fim_middle>"), ("suffix", "<fim_suffix>"),
                          ("pad", "<fim_pad>"), ("eod", "<|endoftext|>")):
        group.add_argument(f"--fim-{name}-token", default=default, help=f"FIM {name} token (default {default})")


def add_tokenizer_args(parser: argparse.ArgumentParser) -> None:
    """Megatron-LM's _add_tokenizer_args (runtime/tokenizers.py; preprocess_data.py takes the same)."""
    add_tokenizer_flags(parser.add_argument_group("tokenizer"), default_type=None)


def add_logging_args(parser: argparse.ArgumentParser) -> None:
    """Megatron-LM's _add_logging_args: the log interval, TensorBoard and wandb."""
    group = parser.add_argument_group("logging")
    group.add_argument("--log-interval", type=int, default=100)
    group.add_argument("--tensorboard-dir", help="write TensorBoard scalars here (needs the tensorboard package)")
    group.add_argument("--wandb-project", default="", help="write the scalars to this wandb project (needs wandb)")
    group.add_argument("--wandb-exp-name", default="", help="the wandb run's name (needed with --wandb-project)")
    group.add_argument("--wandb-save-dir", default="", help="wandb's local directory (default SAVE/wandb)")
    group.add_argument("--wandb-entity", default="", help="the wandb team or user")


def add_checkpointing_args(parser: argparse.ArgumentParser) -> None:
    """Megatron-LM's _add_checkpointing_args: saving, loading, resuming and rotating checkpoints."""
    group = parser.add_argument_group("checkpointing")
    group.add_argument("--save")
    group.add_argument("--load")
    group.add_argument("--save-interval", "--persistent-save-interval", type=int, default=0)
    group.add_argument("--no-save-optim", action="store_true",
                       help="checkpoints without the optimizer state and schedule (weights only: resume them with "
                            "--no-load-optim or --finetune)")
    group.add_argument("--no-save-rng", action="store_true", help="checkpoints without the random streams")
    group.add_argument("--no-load-optim", action="store_true",
                       help="with --load: restore the weights and the iteration, not the optimizer or schedule")
    group.add_argument("--no-load-rng", action="store_true",
                       help="with --load: keep fresh seeds instead of the checkpoint's random streams")
    group.add_argument("--ckpt-step", type=int)
    group.add_argument("--finetune", action="store_true")
    group.add_argument("--exit-on-missing-checkpoint", action="store_true",
                       help="stop with one line when --load holds no checkpoint, instead of starting from scratch")
    group.add_argument("--pretrained-checkpoint",
                       help="where --load holds no checkpoint (or is not given), fine-tune from this one's weights "
                            "(--finetune's semantics): a fine-tuning job's first run starts from the base model, "
                            "its restarts resume from --load")
    group.add_argument("--save-retain-interval", type=int, metavar="R",
                       help="each save removes the previous checkpoint unless its iteration is a multiple of R")
    group.add_argument("--non-persistent-save-interval", type=int, metavar="N",
                       help="between the --save-interval ones, a checkpoint every N iterations that only the next "
                            "replaces (with --non-persistent-ckpt-type global)")
    group.add_argument("--non-persistent-ckpt-type", choices=("global", "local", "in_memory"),
                       help="global: full checkpoints in --non-persistent-global-ckpt-dir (local and in_memory need "
                            "NVIDIA's resiliency extension: refused)")
    group.add_argument("--non-persistent-global-ckpt-dir",
                       help="where non-persistent checkpoints go and are resumed from (default: SAVE/non_persistent "
                            "and LOAD/non_persistent)")
    group.add_argument("--override-opt_param-scheduler", "--override-opt-param-scheduler", action="store_true",
                       help="on resume, take the learning-rate and weight-decay schedule from the command line, "
                            "not the checkpoint")
    group.add_argument("--use-checkpoint-opt_param-scheduler", "--use-checkpoint-opt-param-scheduler",
                       action="store_true",
                       help="on resume, keep the checkpoint's schedule (the default here; Megatron-LM stops instead "
                            "when the two differ)")
