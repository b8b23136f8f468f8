"""The training flags, grouped as Megatron-LM's arguments.py groups them: regularization, training,
initialization, learning rate, mixed precision; and the kernels this runtime chooses between."""
from __future__ import annotations

import argparse

from megatron_auto.kernel_choice import ATTENTION_BACKENDS, BIAS_FUSIONS, GRAD_ACCUMULATION_FUSIONS, OPTIMIZER_IMPLS
from megatron_auto.runtime.settings import EXIT_SIGNALS
from megatron_auto.specs.training import RECOMPUTE_MODULES


def add_regularization_args(parser: argparse.ArgumentParser) -> None:
    """Megatron-LM's _add_regularization_args: dropout, weight decay, gradient clipping, Adam's constants."""
    group = parser.add_argument_group("regularization")
    group.add_argument("--hidden-dropout", type=float, default=0.1)
    group.add_argument("--attention-dropout", type=float, default=0.1)
    group.add_argument("--weight-decay", type=float, default=0.01)
    group.add_argument("--start-weight-decay", type=float, help="with --weight-decay-incr-style linear/cosine")
    group.add_argument("--end-weight-decay", type=float, help="with --weight-decay-incr-style linear/cosine")
    group.add_argument("--weight-decay-incr-style", default="constant", choices=("constant", "linear", "cosine"),
                       help="how the weight decay moves from its start to its end value over the run")
    group.add_argument("--clip-grad", type=float, default=1.0)
    group.add_argument("--adam-beta1", type=float, default=0.9)
    group.add_argument("--adam-beta2", type=float, default=0.999)
    group.add_argument("--adam-eps", type=float, default=1e-8)


def add_training_args(parser: argparse.ArgumentParser) -> None:
    """Megatron-LM's _add_training_args: batches, length of the run, when to stop, activation recomputation."""
    group = parser.add_argument_group("training")
    group.add_argument("--micro-batch-size", type=int, default=1)
    group.add_argument("--global-batch-size", type=int)
    group.add_argument("--train-iters", type=int, help="iterations to train (or --train-samples)")
    group.add_argument("--train-samples", type=int, help="samples to train on (Megatron-LM's sample-based schedule)")
    group.add_argument("--rampup-batch-size", nargs=3, type=int, metavar=("START", "INCREMENT", "SAMPLES"),
                       help="with --train-samples: the global batch grows from START by INCREMENT over SAMPLES "
                            "samples to --global-batch-size (megatron-core's ramp-up calculator)")
    # nargs="+": Megatron-LM's gpt3 example expands the quoted schedule unquoted (${TRAINING_ARGS[@]}),
    # so it arrives as one word per step.
    group.add_argument("--step-batch-size-schedule", nargs="+", metavar="THRESHOLD:BATCH",
                       help="the global batch of each step of consumed tokens (K/M/B/T suffixes; the first "
                            "threshold 0); the last batch is the global batch")
    group.add_argument("--calculate-per-token-loss", action="store_true",
                       help="divide the loss and gradients once by the global batch's token count")
    group.add_argument("--check-for-nan-in-loss-and-grad", dest="check_for_nan_in_loss_and_grad",
                       action="store_true", default=True, help="stop on a NaN loss or gradient (default)")
    group.add_argument("--no-check-for-nan-in-loss-and-grad", dest="check_for_nan_in_loss_and_grad",
                       action="store_false")
    group.add_argument("--disable-bf16-reduced-precision-matmul", action="store_true",
                       help="CUDA bf16 GEMMs accumulate without reduced-precision reductions")
    group.add_argument("--exit-interval", type=int, default=0)
    group.add_argument("--exit-duration-in-mins", type=float, default=0.0,
                       help="save (with --save) and stop once training has run this long")
    group.add_argument("--exit-signal-handler", action="store_true",
                       help="on --exit-signal (a scheduler's warning before it kills the job), save (with --save) "
                            "and stop after the current iteration, on every rank")
    group.add_argument("--exit-signal", choices=EXIT_SIGNALS, default="SIGTERM",
                       help="the signal --exit-signal-handler catches (default SIGTERM)")
    _add_recompute_args(group)


def _add_recompute_args(group) -> None:
    """Megatron-LM's activation-recomputation flags (constraints on the search under --auto-parallel)."""
    group.add_argument("--recompute-granularity", choices=("full", "selective"))
    group.add_argument("--recompute-method", choices=("uniform", "block"))
    group.add_argument("--recompute-num-layers", type=int)
    group.add_argument("--recompute-modules", nargs="+", metavar="MODULE",
                       help="what --recompute-granularity selective re-runs: "
                            f"{', '.join(RECOMPUTE_MODULES)} (Megatron-LM's names; default: core_attn with manual "
                            "flags, the planner's choice under --auto-parallel, the plan's with a plan file)")
    group.add_argument("--recompute-activations", action="store_true",
                       help="Megatron-LM's older spelling of --recompute-granularity selective")


def add_initialization_args(parser: argparse.ArgumentParser) -> None:
    """Megatron-LM's _add_initialization_args: the seed and the weights' initialisation."""
    group = parser.add_argument_group("initialization")
    group.add_argument("--seed", type=int, default=1234)
    group.add_argument("--init-method-std", type=float, default=0.02)
    group.add_argument("--init-method-xavier-uniform", action="store_true",
                       help="Xavier-uniform initialisation of the weights (Megatron-LM's flag)")


def add_learning_rate_args(parser: argparse.ArgumentParser) -> None:
    """Megatron-LM's _add_learning_rate_args: the schedule's shape, warm-up and decay."""
    group = parser.add_argument_group("learning rate")
    group.add_argument("--lr", type=float, default=1e-4)
    group.add_argument("--min-lr", type=float, default=0.0)
    group.add_argument("--lr-decay-style", default="linear",
                       choices=("constant", "linear", "cosine", "inverse-square-root", "WSD"))
    group.add_argument("--lr-wsd-decay-style", default="exponential",
                       choices=("exponential", "linear", "cosine", "minus_sqrt"))
    group.add_argument("--lr-wsd-decay-iters", type=int, help="with WSD: iterations of the final decay")
    group.add_argument("--lr-wsd-decay-samples", type=int, help="with WSD and --train-samples: samples of it")
    group.add_argument("--lr-warmup-iters", type=int, default=0)
    group.add_argument("--lr-warmup-fraction", type=float)
    group.add_argument("--lr-warmup-init", type=float, default=0.0, help="learning rate at the start of the warm-up")
    group.add_argument("--lr-decay-iters", type=int)
    group.add_argument("--lr-decay-samples", type=int, help="with --train-samples: samples of decay")
    group.add_argument("--lr-warmup-samples", type=int, default=0, help="with --train-samples: samples of warm-up")
    group.add_argument("--decoupled-lr", type=float, help="peak learning rate of the embedding and output layer")
    group.add_argument("--decoupled-min-lr", type=float, help="final learning rate of the embedding and output layer")


def add_mixed_precision_args(parser: argparse.ArgumentParser) -> None:
    """Megatron-LM's _add_mixed_precision_args: 16-bit training and fp16's loss scaling."""
    group = parser.add_argument_group("mixed precision")
    group.add_argument("--bf16", action="store_true", help="bf16 weights and activations, fp32 master weights")
    group.add_argument("--fp16", action="store_true", help="fp16 weights and activations with loss scaling")
    group.add_argument("--loss-scale", type=float, help="--fp16: constant loss scale (default: dynamic)")
    group.add_argument("--initial-loss-scale", type=float, default=2.0**32)
    group.add_argument("--min-loss-scale", type=float, default=1.0)
    group.add_argument("--loss-scale-window", type=int, default=1000)
    group.add_argument("--hysteresis", type=int, default=2)


def add_kernel_args(parser: argparse.ArgumentParser) -> None:
    """The kernels a run chooses between (runtime/kernels.py), in Megatron-LM's names where it has them."""
    group = parser.add_argument_group("kernels (runtime/kernels.py; one log line names them)")
    group.add_argument("--attention-backend", choices=ATTENTION_BACKENDS, default="auto",
                       help="core attention, Megatron-LM's names (auto: flash on GPUs, unfused on CPU; "
                            "without Transformer Engine flash/fused run torch SDPA, unfused/local Megatron's own)")
    group.add_argument("--optimizer-impl", choices=OPTIMIZER_IMPLS, default="auto",
                       help="torch Adam's step: fused (one kernel, no temporaries) or foreach "
                            "(auto: fused on GPUs, foreach on CPU)")
    group.add_argument("--bias-fusions", choices=BIAS_FUSIONS, default="auto",
                       help="Megatron's torch.compile'd bias-activation and bias-dropout-add fusions on GPUs "
                            "(auto: off, their host cost exceeds the time they save; see docs/benchmarks.md)")
    for flag in ("--no-bias-gelu-fusion", "--no-bias-swiglu-fusion", "--no-bias-dropout-fusion"):
        group.add_argument(flag, action="store_true", help="keep this Megatron fusion off (with --bias-fusions on)")
    group.add_argument("--grad-accumulation-fusion", choices=GRAD_ACCUMULATION_FUSIONS, default="auto",
                       help="Megatron's gradient_accumulation_fusion: weight gradients added into the fp32 "
                            "main_grad by the GEMM (auto: on with apex's extension, or on GPUs with the torch "
                            "stand-in once it passed its start-up check; off on CPU; megatron_auto.kernel_choice)")
    group.add_argument("--no-gradient-accumulation-fusion", dest="grad_accumulation_fusion", action="store_const",
                       const="off", help="Megatron-LM's flag: --grad-accumulation-fusion off")
