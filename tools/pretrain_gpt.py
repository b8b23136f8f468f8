"""Drop-in for Megatron-LM's pretrain_gpt.py: the same flags, plus `--auto-parallel`.

Four CPU ranks over gloo, tiny GPT, the shipped corpus, parallelism chosen by the planner:

    .venv/bin/python tools/preprocess_data.py --input data/tiny_corpus.jsonl \
        --output-prefix data/generated/tiny --tokenizer-type ByteTokenizer
    OMP_NUM_THREADS=1 .venv/bin/python -m torch.distributed.run --nproc_per_node 4 tools/pretrain_gpt.py \
        --num-layers 4 --hidden-size 64 --num-attention-heads 4 --seq-length 64 \
        --max-position-embeddings 64 --micro-batch-size 2 --global-batch-size 16 --train-iters 60 \
        --lr 3e-3 --min-lr 3e-4 --lr-decay-style cosine --lr-warmup-iters 5 \
        --data-path data/generated/tiny_text_document --tokenizer-type ByteTokenizer \
        --log-interval 5 --eval-interval 30 --eval-iters 2 --auto-parallel

The same job with the parallelism spelled out (what Megatron-LM users type today):

    ... tools/pretrain_gpt.py <same flags, without --auto-parallel> --tensor-model-parallel-size 2 \
        --pipeline-model-parallel-size 2

Other forms: `--mock-data --tokenizer-type NullTokenizer --vocab-size 256` instead of a
dataset; `--auto-parallel-plan plan.json` runs a saved plan (`megatron-auto plan --out`);
`--bf16`, or `--fp16` with Megatron-LM's loss-scaling flags, trains in 16-bit with fp32 master
weights; `--auto-parallel-profile cluster.json model.json` prices the search from the files that
`megatron-auto profile-cluster` and `profile-model` wrote (the analytic model otherwise);
`--save DIR --save-interval N` / `--load DIR` checkpoint through Megatron-Core's
dist_checkpointing, and a run may resume under another plan or world size. On GPUs, the
same command under torchrun uses NCCL, detects the cluster preset from the GPU name and prices
WORLD_SIZE / LOCAL_WORLD_SIZE nodes of LOCAL_WORLD_SIZE GPUs (torchrun's node shape).

Kernels: `--attention-backend` (Megatron-LM's flash/fused/unfused/local/auto) and
`--optimizer-impl fused|foreach|auto` choose the core attention and torch Adam's step
(auto: SDPA, fused Adam and Megatron's bias fusions on GPUs; Megatron's unfused attention
and foreach Adam on CPU); one log line names what runs, and `--auto-parallel` prices it.

Megatron-LM's own launch scripts run as they are (tests/launch_lines/ holds shrunk copies): sample-based
schedules (`--train-samples`, `--lr-decay-samples`, `--lr-warmup-samples`), growing batches
(`--rampup-batch-size`, `--step-batch-size-schedule`: runtime/batch_schedule.py), `--kv-channels`,
`--add-qkv-bias`, `--qk-layernorm`, `--apply-layernorm-1p`, `--decoupled-lr`, `--calculate-per-token-loss`,
`--exit-duration-in-mins`, `--exit-signal-handler`, `--no-load-optim`, NaN checks, evaluations that walk through
the validation split and a validation pass after the last iteration keep Megatron-LM's meaning; `--tensorboard-dir` and
`--wandb-*` write scalars when their packages import; MoE models (`--num-experts`, `--moe-*`) train with
Megatron-Core's MoE layer under `--expert-model-parallel-size` / `--expert-tensor-parallel-size` (chosen
by the planner under --auto-parallel); multi-latent attention (`--multi-latent-attention` and its shape and
YaRN flags) runs Megatron-Core's MLASelfAttention; multi-token prediction (`--mtp-num-layers`,
`--mtp-loss-scaling-factor`) builds Megatron-Core's MTP modules on the last stage; `--context-parallel-size`
splits sequences on the flash core (dense layers without MLA); fp8 is refused before any work with one line
saying why; kernel, logging and I/O flags are accepted and named in the log as without effect, with the reason
(megatron_auto/runtime/compat_flags.py; README.md's table lists every flag).

Parallelism flags given beside `--auto-parallel` become constraints on the search;
`--micro-batch-size` is then the planner's to choose. A user error (a plan for another
world size or model, a bad flag combination) prints one line on stderr and exits 2.

Each rank logs its device memory at start and, after iteration 2, its measured peak against
the cost model's peak for its pipeline stage (runtime/memory_check.py). An out-of-memory
error in the first two iterations is agreed on by all ranks (runtime/oom.py): under
`--auto-parallel` the job re-plans under a budget lowered by the overshoot and starts again;
otherwise it writes the re-planned plan to `auto_parallel_replan.json` (in `--save` or the
working directory) and exits 2 with one line naming it (runtime/fit.py).
"""
from __future__ import annotations

import argparse
import dataclasses
import logging
import math
import os
import sys
import warnings
from pathlib import Path
from typing import Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from megatron_auto.cli.job import CPU_CLUSTER_PRESET  # noqa: E402
from megatron_auto.cli.parser import margin_fraction  # noqa: E402
from megatron_auto.errors import UserError  # noqa: E402
from megatron_auto.kernels import (ATTENTION_BACKENDS, BIAS_FUSIONS, GRAD_ACCUMULATION_FUSIONS,  # noqa: E402
                                   OPTIMIZER_IMPLS, resolve_attention_backend, resolve_optimizer_impl)
from megatron_auto.runtime import compat_flags  # noqa: E402
from megatron_auto.runtime.manual_plan import ManualParallelism, plan_from_flags  # noqa: E402
from megatron_auto.runtime.settings import EXIT_SIGNALS, DataSettings, MoESettings, TrainSettings  # noqa: E402
from megatron_auto.runtime.tokenizers import add_tokenizer_flags, tokenizer_from_flags  # noqa: E402
from megatron_auto.search.constraints import SearchConstraints  # noqa: E402
from megatron_auto.specs.model import ModelSpec, uniform_model  # noqa: E402
from megatron_auto.specs.training import (DEFAULT_RECOMPUTE_MODULES, RECOMPUTE_MODULES, TrainingSpec,  # noqa: E402
                                         recompute_modules_problem)

logger = logging.getLogger("pretrain_gpt")


def _model_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("model")
    group.add_argument("--num-layers", type=int, required=True)
    group.add_argument("--hidden-size", type=int, required=True)
    group.add_argument("--num-attention-heads", type=int, required=True)
    group.add_argument("--num-query-groups", type=int)
    group.add_argument("--ffn-hidden-size", type=int)
    group.add_argument("--seq-length", type=int, required=True)
    group.add_argument("--max-position-embeddings", type=int)
    group.add_argument("--swiglu", action="store_true")
    group.add_argument("--untie-embeddings-and-output-weights", action="store_true")
    group.add_argument("--make-vocab-size-divisible-by", type=int, default=128)
    group.add_argument("--padded-vocab-size", type=int, help="the embedding's rows (default: the vocabulary padded "
                                                             "to a multiple of --make-vocab-size-divisible-by x TP)")
    group.add_argument("--hidden-dropout", type=float, default=0.1)
    group.add_argument("--attention-dropout", type=float, default=0.1)
    group.add_argument("--init-method-std", type=float, default=0.02)
    group.add_argument("--init-method-xavier-uniform", action="store_true",
                       help="Xavier-uniform initialisation of the weights (Megatron-LM's flag)")
    group.add_argument("--position-embedding-type", choices=("learned_absolute", "rope", "none"),
                       default="learned_absolute")
    group.add_argument("--use-rotary-position-embeddings", action="store_true",
                       help="older Megatron-LM spelling of --position-embedding-type rope")
    group.add_argument("--no-position-embedding", action="store_true",
                       help="no learned position table (older scripts pair it with rotary embeddings)")
    group.add_argument("--rotary-base", type=int, default=10000)
    group.add_argument("--rotary-percent", type=float, default=1.0)
    group.add_argument("--use-rope-scaling", action="store_true", help="Llama 3.1's RoPE frequency scaling")
    group.add_argument("--rope-scaling-factor", type=float, default=8.0, help="its factor (default 8)")
    group.add_argument("--rotary-seq-len-interpolation-factor", type=int,
                       help="RoPE position interpolation: positions divided by this factor (a longer context)")
    group.add_argument("--normalization", choices=("LayerNorm", "RMSNorm"), default="LayerNorm")
    group.add_argument("--norm-epsilon", type=float, default=1e-5)
    group.add_argument("--disable-bias-linear", action="store_true")
    group.add_argument("--group-query-attention", action="store_true",
                       help="grouped-query attention with --num-query-groups groups (without it: multi-head)")
    group.add_argument("--kv-channels", type=int, help="width of one attention head (default hidden / heads)")
    group.add_argument("--add-qkv-bias", action="store_true", help="a bias on the QKV projection alone")
    group.add_argument("--qk-layernorm", action="store_true", help="normalise each query and key head")
    group.add_argument("--apply-layernorm-1p", action="store_true",
                       help="norm weights stored as gamma - 1, zero-initialised")


def _mla_args(parser: argparse.ArgumentParser) -> None:
    """Megatron-LM 0.16.1's multi-latent attention flags, with its defaults (arguments.py _add_mla_args), and
    --rope-type (its _add_network_size_args: MLA defaults to yarn, other attention runs rope)."""
    group = parser.add_argument_group("multi-latent attention (DeepSeek-V2/V3; Megatron-LM's names)")
    group.add_argument("--multi-latent-attention", action="store_true",
                       help="Megatron-Core's MLASelfAttention: keys and values from a compressed latent")
    group.add_argument("--q-lora-rank", type=int, help="query latent width (default: no query latent)")
    group.add_argument("--kv-lora-rank", type=int, default=32, help="key/value latent width")
    group.add_argument("--qk-head-dim", type=int, default=128, help="query/key channels per head without RoPE")
    group.add_argument("--qk-pos-emb-head-dim", type=int, default=64, help="query/key channels per head with RoPE")
    group.add_argument("--v-head-dim", type=int, default=128, help="value channels per head")
    group.add_argument("--rope-type", choices=("rope", "yarn"),
                       help="MLA's RoPE (default yarn); other attention takes rope only")
    group.add_argument("--rotary-scaling-factor", type=float, default=1.0, help="YaRN's scaling factor")
    group.add_argument("--mscale", type=float, default=1.0, help="YaRN's mscale")
    group.add_argument("--mscale-all-dim", type=float, default=0.0, help="YaRN's mscale_all_dim")


def _mtp_args(parser: argparse.ArgumentParser) -> None:
    """Megatron-LM 0.16.1's multi-token prediction flags, with its defaults (TransformerConfig's mtp_num_layers and
    mtp_loss_scaling_factor, which its arguments.py turns into flags); it has no other --mtp-* flag."""
    group = parser.add_argument_group("multi-token prediction (DeepSeek-V3; Megatron-LM's names)")
    group.add_argument("--mtp-num-layers", type=int, default=None,
                       help="MTP depths: modules after the decoder that each predict one more token (default: none)")
    group.add_argument("--mtp-loss-scaling-factor", type=float, default=0.1,
                       help="weight of the mean MTP loss beside the lm loss")


def mtp_model_flags(args: argparse.Namespace) -> dict:
    """uniform_model's MTP fields from the flags (Megatron-LM's None depth is no MTP: 0 here)."""
    return dict(mtp_num_layers=args.mtp_num_layers or 0, mtp_loss_scaling_factor=args.mtp_loss_scaling_factor)


def mtp_flags_error(args: argparse.Namespace) -> Optional[str]:
    """What Megatron-LM asserts of the MTP flags, and what this runtime does not run with MTP, as one line."""
    if not args.mtp_num_layers:
        return None
    from megatron_auto.runtime.config import mtp_error

    return mtp_error(position_embedding_type(args), args.context_parallel_size, args.recompute_method,
                     args.recompute_num_layers, args.pipeline_model_parallel_layout)


def mla_flags_error(args: argparse.Namespace) -> Optional[str]:
    """What Megatron-LM asserts of the MLA flags (arguments.py: validate_args and
    core_transformer_config_from_args) and what this runtime does not run with MLA, as one line."""
    if args.multi_latent_attention and args.group_query_attention:
        return ("--group-query-attention cannot go with --multi-latent-attention (Megatron-LM: 'Group query "
                "attention is mutually exclusive with multi latent attention')")
    if args.rope_type not in (None, "rope") and not args.multi_latent_attention:
        return (f"--rope-type {args.rope_type} needs --multi-latent-attention (Megatron-LM: common attention only "
                "supports rope_type=\"rope\")")
    if args.multi_latent_attention and args.context_parallel_size > 1:
        from megatron_auto.runtime.config import MLA_CONTEXT_PARALLEL

        return MLA_CONTEXT_PARALLEL
    if "mla_up_proj" in (args.recompute_modules or ()) and not args.multi_latent_attention:
        return ("--recompute-modules mla_up_proj needs --multi-latent-attention (megatron-core: 'mla_up_proj in "
                "recompute_modules is only supported with multi_latent_attention')")
    return None


def mla_model_flags(args: argparse.Namespace) -> dict:
    """uniform_model's `mla` from the flags: an MLASpec under --multi-latent-attention, else None (Megatron-LM
    reads the shape flags only under the switch)."""
    from megatron_auto.specs.model import MLA_KEYS, mla_from_flags

    if not args.multi_latent_attention:
        return {}
    return {"mla": mla_from_flags(True, **{key: getattr(args, key) for key in MLA_KEYS})}


def moe_layer_freq(text: str):
    """Megatron-LM's --moe-layer-freq: an int N (every N-th layer is MoE), or a Python list expression of
    0/1 per layer such as "[1,0,1,0]" or "([0]*3+[1]*29)" (specs.model.parse_moe_layer_freq)."""
    from megatron_auto.specs.model import parse_moe_layer_freq

    try:
        return parse_moe_layer_freq(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--moe-layer-freq takes an int or a list such as [1,0,1,0], "
                                         f"got {text!r}") from None


def _moe_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("mixture of experts (Megatron-LM's names)")
    group.add_argument("--num-experts", type=int, help="experts per MoE layer (without it: a dense model)")
    group.add_argument("--moe-router-topk", type=int, default=2)
    group.add_argument("--moe-ffn-hidden-size", type=int, help="width of one expert (default --ffn-hidden-size)")
    group.add_argument("--moe-shared-expert-intermediate-size", type=int)
    group.add_argument("--moe-layer-freq", type=moe_layer_freq, default=1)
    group.add_argument("--moe-router-load-balancing-type", default="aux_loss",
                       choices=("aux_loss", "seq_aux_loss", "sinkhorn", "none"))
    group.add_argument("--moe-aux-loss-coeff", type=float, default=0.0)
    group.add_argument("--moe-z-loss-coeff", type=float)
    group.add_argument("--moe-token-dispatcher-type", default="allgather", choices=("alltoall", "allgather", "flex"),
                       help="flex (DeepEP/HybridEP kernels) runs the alltoall dispatcher")
    group.add_argument("--moe-grouped-gemm", action="store_true")
    group.add_argument("--moe-router-dtype", choices=("fp32", "fp64"))
    group.add_argument("--moe-router-pre-softmax", action="store_true")
    group.add_argument("--moe-router-score-function", choices=("softmax", "sigmoid"), default="softmax")
    group.add_argument("--moe-router-topk-scaling-factor", type=float)
    group.add_argument("--moe-expert-capacity-factor", type=float)
    group.add_argument("--moe-pad-expert-input-to-capacity", action="store_true")
    group.add_argument("--moe-token-drop-policy", choices=("probs", "position"), default="probs")
    group.add_argument("--moe-input-jitter-eps", type=float)
    group.add_argument("--moe-per-layer-logging", action="store_true")
    group.add_argument("--moe-router-enable-expert-bias", action="store_true",
                       help="auxiliary-loss-free balancing (DeepSeek-V3): a per-expert routing bias, updated after "
                            "each global batch; needs --moe-router-score-function sigmoid")
    group.add_argument("--moe-router-bias-update-rate", type=float, default=1e-3)
    group.add_argument("--moe-router-num-groups", type=int, help="expert groups for group-limited routing")
    group.add_argument("--moe-router-group-topk", type=int, help="groups a token's experts may come from")
    group.add_argument("--moe-shared-expert-overlap", action="store_true",
                       help="run the shared expert on its own CUDA stream beside the alltoall dispatch")
    group.add_argument("--moe-layer-recompute", action="store_true",
                       help="Megatron-LM's older spelling of --recompute-granularity selective with `moe` added "
                            "to --recompute-modules")
    group.add_argument("--expert-model-parallel-size", type=int, help="EP degree (a constraint under --auto-parallel)")
    group.add_argument("--expert-tensor-parallel-size", type=int,
                       help="expert TP degree (default --tensor-model-parallel-size)")


def moe_settings(args: argparse.Namespace) -> MoESettings:
    """How the MoE layers route and dispatch (the shape of the experts is the model's)."""
    return MoESettings(
        token_dispatcher="alltoall" if args.moe_token_dispatcher_type == "flex" else args.moe_token_dispatcher_type,
        grouped_gemm=args.moe_grouped_gemm, router_dtype=args.moe_router_dtype,
        router_pre_softmax=args.moe_router_pre_softmax, router_score_function=args.moe_router_score_function,
        router_topk_scaling_factor=args.moe_router_topk_scaling_factor,
        expert_capacity_factor=args.moe_expert_capacity_factor,
        pad_expert_input_to_capacity=args.moe_pad_expert_input_to_capacity,
        token_drop_policy=args.moe_token_drop_policy, input_jitter_eps=args.moe_input_jitter_eps,
        per_layer_logging=args.moe_per_layer_logging, router_expert_bias=args.moe_router_enable_expert_bias,
        router_bias_update_rate=args.moe_router_bias_update_rate, router_num_groups=args.moe_router_num_groups,
        router_group_topk=args.moe_router_group_topk, shared_expert_overlap=args.moe_shared_expert_overlap)


def moe_router_error(args: argparse.Namespace) -> Optional[str]:
    """The router flags' constraints that TransformerConfig asserts on (megatron-core 0.16.1), as one line."""
    if args.moe_router_enable_expert_bias and args.moe_router_score_function != "sigmoid":
        return ("--moe-router-enable-expert-bias needs --moe-router-score-function sigmoid (as in Megatron-LM), "
                f"not {args.moe_router_score_function}")
    groups, picked = args.moe_router_num_groups, args.moe_router_group_topk
    if groups is None and picked is None:
        return None
    if groups is None or picked is None or not 1 <= picked <= groups:
        return f"--moe-router-num-groups {groups} --moe-router-group-topk {picked}: give both, with 1 <= topk <= groups"
    experts, topk = args.num_experts or 0, args.moe_router_topk
    if experts % groups or not picked <= topk <= picked * (experts // groups):
        return (f"--moe-router-num-groups {groups} --moe-router-group-topk {picked}: the groups must split the "
                f"{experts} experts evenly, and the chosen groups must hold --moe-router-topk {topk} experts, "
                "at least one from each")
    return None


def moe_layer_recompute_error(args: argparse.Namespace) -> Optional[str]:
    """--moe-layer-recompute as megatron-core 0.16.1's TransformerConfig reads it: selective recomputation with
    `moe` added to the modules (the default's core_attn kept); full granularity is refused. Edits `args`."""
    if not args.moe_layer_recompute:
        return None
    if args.recompute_granularity == "full":
        return "do not set --moe-layer-recompute with full recompute granularity (as in Megatron-Core)"
    args.recompute_granularity = "selective"
    modules = list(args.recompute_modules or DEFAULT_RECOMPUTE_MODULES)
    args.recompute_modules = modules + ["moe"] * ("moe" not in modules)
    return None


def shared_expert_overlap_error(args: argparse.Namespace) -> Optional[str]:
    """--moe-shared-expert-overlap's constraints that megatron-core 0.16.1's TransformerConfig raises on."""
    if not (args.moe_shared_expert_overlap and args.moe_shared_expert_intermediate_size):
        return None
    if args.moe_token_dispatcher_type != "alltoall":
        return ("--moe-shared-expert-overlap only works with --moe-token-dispatcher-type alltoall "
                f"(as in Megatron-Core), not {args.moe_token_dispatcher_type}")
    if "shared_experts" in (args.recompute_modules or ()):
        return "--recompute-modules shared_experts cannot go with --moe-shared-expert-overlap (as in Megatron-Core)"
    return None


def moe_model_flags(args: argparse.Namespace) -> dict:
    """uniform_model's MoE keywords from the flags (none without --num-experts)."""
    if args.num_experts is None:
        return {}
    return dict(num_experts=args.num_experts, moe_router_topk=args.moe_router_topk,
                moe_ffn_hidden_size=args.moe_ffn_hidden_size,
                moe_shared_expert_intermediate_size=args.moe_shared_expert_intermediate_size,
                moe_layer_freq=args.moe_layer_freq, moe_router_load_balancing_type=args.moe_router_load_balancing_type,
                moe_aux_loss_coeff=args.moe_aux_loss_coeff, moe_z_loss_coeff=args.moe_z_loss_coeff or 0.0)


def _training_args(parser: argparse.ArgumentParser) -> None:
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
    group.add_argument("--calculate-per-token-loss", action="store_true",
                       help="divide the loss and gradients once by the global batch's token count")
    group.add_argument("--check-for-nan-in-loss-and-grad", dest="check_for_nan_in_loss_and_grad",
                       action="store_true", default=True, help="stop on a NaN loss or gradient (default)")
    group.add_argument("--no-check-for-nan-in-loss-and-grad", dest="check_for_nan_in_loss_and_grad",
                       action="store_false")
    group.add_argument("--disable-bf16-reduced-precision-matmul", action="store_true",
                       help="CUDA bf16 GEMMs accumulate without reduced-precision reductions")
    group.add_argument("--weight-decay", type=float, default=0.01)
    group.add_argument("--start-weight-decay", type=float, help="with --weight-decay-incr-style linear/cosine")
    group.add_argument("--end-weight-decay", type=float, help="with --weight-decay-incr-style linear/cosine")
    group.add_argument("--weight-decay-incr-style", default="constant", choices=("constant", "linear", "cosine"),
                       help="how the weight decay moves from its start to its end value over the run")
    group.add_argument("--clip-grad", type=float, default=1.0)
    group.add_argument("--adam-beta1", type=float, default=0.9)
    group.add_argument("--adam-beta2", type=float, default=0.999)
    group.add_argument("--adam-eps", type=float, default=1e-8)
    group.add_argument("--bf16", action="store_true", help="bf16 weights and activations, fp32 master weights")
    group.add_argument("--fp16", action="store_true", help="fp16 weights and activations with loss scaling")
    group.add_argument("--loss-scale", type=float, help="--fp16: constant loss scale (default: dynamic)")
    group.add_argument("--initial-loss-scale", type=float, default=2.0**32)
    group.add_argument("--min-loss-scale", type=float, default=1.0)
    group.add_argument("--loss-scale-window", type=int, default=1000)
    group.add_argument("--hysteresis", type=int, default=2)
    group.add_argument("--seed", type=int, default=1234)
    group.add_argument("--distributed-timeout-minutes", type=float, default=10.0)


def _kernel_args(parser: argparse.ArgumentParser) -> None:
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
                            "stand-in once it passed its start-up check; off on CPU; megatron_auto.kernels)")
    group.add_argument("--no-gradient-accumulation-fusion", dest="grad_accumulation_fusion", action="store_const",
                       const="off", help="Megatron-LM's flag: --grad-accumulation-fusion off")


def _parallel_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("parallelism (constraints under --auto-parallel)")
    group.add_argument("--tensor-model-parallel-size", type=int)
    group.add_argument("--pipeline-model-parallel-size", type=int)
    group.add_argument("--context-parallel-size", type=int, default=1,
                       help="each sequence split over this many ranks (dense models; the core attention runs flash)")
    group.add_argument("--num-layers-per-virtual-pipeline-stage", type=int)
    group.add_argument("--decoder-first-pipeline-num-layers", type=int)
    group.add_argument("--decoder-last-pipeline-num-layers", type=int)
    group.add_argument("--account-for-embedding-in-pipeline-split", action="store_true",
                       help="the pipeline split counts the embedding as a layer: the first chunk builds one fewer")
    group.add_argument("--account-for-loss-in-pipeline-split", action="store_true",
                       help="the pipeline split counts the output layer and loss as a layer: the last chunk "
                            "builds one fewer")
    group.add_argument("--pipeline-model-parallel-layout", metavar="LAYOUT",
                       help="the layers of every model chunk, as Megatron-LM spells it (e.g. \"Et|(tt|)*3,tL\")")
    group.add_argument("--sequence-parallel", action="store_true", default=None)
    group.add_argument("--use-distributed-optimizer", action="store_true", default=None)
    group.add_argument("--overlap-param-gather", action="store_true", default=None,
                       help="all-gather the distributed optimizer's updated weights during the next forward "
                            "(default: on with CUDA, off on CPU)")
    group.add_argument("--recompute-granularity", choices=("full", "selective"))
    group.add_argument("--recompute-method", choices=("uniform", "block"))
    group.add_argument("--recompute-num-layers", type=int)
    group.add_argument("--recompute-modules", nargs="+", metavar="MODULE",
                       help="what --recompute-granularity selective re-runs: "
                            f"{', '.join(RECOMPUTE_MODULES)} (Megatron-LM's names; default: core_attn with manual "
                            "flags, the planner's choice under --auto-parallel, the plan's with a plan file)")
    group.add_argument("--recompute-activations", action="store_true",
                       help="Megatron-LM's older spelling of --recompute-granularity selective")
    group.add_argument("--auto-parallel", action="store_true", help="let the planner choose the parallelism")
    group.add_argument("--auto-parallel-cluster", help="cluster preset or JSON (default: detected)")
    group.add_argument("--auto-parallel-plan", help="run this plan file (megatron or hybrid space)")
    group.add_argument("--auto-parallel-dry-run", action="store_true",
                       help="print the plan, its prediction and (with --auto-parallel or a plan file) the line's own "
                            "parallelism flags priced alike, then exit: no process group, no data, no training. "
                            "The world size is WORLD_SIZE's and a node LOCAL_WORLD_SIZE GPUs (unset: the cluster's "
                            "own node size); on a machine without the job's GPUs, name the cluster with "
                            "--auto-parallel-cluster")
    group.add_argument("--auto-parallel-profile", nargs="+", metavar="FILE", default=[],
                       help="cluster and/or model profile JSON (megatron-auto profile-cluster / profile-model):"
                            " the search prices plans from these measurements")
    group.add_argument("--auto-parallel-space", choices=("megatron", "hybrid"), default="megatron",
                       help="search space of --auto-parallel: one layout (megatron) or per-layer layouts (hybrid)")
    group.add_argument("--auto-parallel-memory-margin", type=margin_fraction, metavar="FRACTION",
                       help="safety margin of --auto-parallel: a plan fits when its predicted device memory is at "
                            "most the GPU's capacity x (1 - FRACTION) (default: the cluster's, as megatron-auto "
                            "plan --memory-margin)")


def _data_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("data and logging")
    group.add_argument("--data-path", nargs="+",
                       help="Megatron-LM's forms: PREFIX, PREFIX1 PREFIX2 ... (weighted by size), or "
                            "W1 PREFIX1 W2 PREFIX2 ... (a weighted blend)")
    group.add_argument("--mock-data", action="store_true")
    for flag, split in zip(PER_SPLIT_DATA_FLAGS, ("training", "validation", "test")):
        group.add_argument(flag, nargs="+", help=f"the {split} split's own datasets, whole (--data-path's forms; "
                                                 "in place of --data-path and --split)")
    add_tokenizer_flags(group, default_type=None)
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
    group.add_argument("--log-interval", type=int, default=100)
    group.add_argument("--eval-interval", type=int, default=0)
    group.add_argument("--eval-iters", type=int, default=10)
    group.add_argument("--exit-interval", type=int, default=0)
    group.add_argument("--exit-duration-in-mins", type=float, default=0.0,
                       help="save (with --save) and stop once training has run this long")
    group.add_argument("--exit-signal-handler", action="store_true",
                       help="on --exit-signal (a scheduler's warning before it kills the job), save (with --save) "
                            "and stop after the current iteration, on every rank")
    group.add_argument("--exit-signal", choices=EXIT_SIGNALS, default="SIGTERM",
                       help="the signal --exit-signal-handler catches (default SIGTERM)")
    group.add_argument("--tensorboard-dir", help="write TensorBoard scalars here (needs the tensorboard package)")
    group.add_argument("--wandb-project", default="", help="write the scalars to this wandb project (needs wandb)")
    group.add_argument("--wandb-exp-name", default="", help="the wandb run's name (needed with --wandb-project)")
    group.add_argument("--wandb-save-dir", default="", help="wandb's local directory (default SAVE/wandb)")
    group.add_argument("--wandb-entity", default="", help="the wandb team or user")


def _checkpoint_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("checkpoints")
    group.add_argument("--save")
    group.add_argument("--load")
    group.add_argument("--save-interval", type=int, default=0)
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
    group.add_argument("--override-opt_param-scheduler", action="store_true",
                       help="on resume, take the learning-rate and weight-decay schedule from the command line, "
                            "not the checkpoint")
    group.add_argument("--use-checkpoint-opt_param-scheduler", action="store_true",
                       help="on resume, keep the checkpoint's schedule (the default here; Megatron-LM stops instead "
                            "when the two differ)")


def no_effect_reasons(args: argparse.Namespace) -> list[tuple[str, str]]:
    """(flag, reason) of the accepted-without-effect flags this run was given."""
    from megatron_auto.runtime.tensorboard_log import tensorboard_available, wandb_available

    reasons = compat_flags.no_effect(args)
    if args.tensorboard_dir is not None and not tensorboard_available():
        reasons.append(("--tensorboard-dir", "the tensorboard package is not installed"))
    if args.wandb_project and not wandb_available():
        reasons.append(("--wandb-project", "the wandb package is not installed"))
    return reasons


def no_effect_flags(args: argparse.Namespace) -> list[str]:
    """The accepted-without-effect flags this run was given."""
    return [flag for flag, _ in no_effect_reasons(args)]


class _OneLineParser(argparse.ArgumentParser):
    """argparse whose errors are one line on stderr and exit status 2 (no usage block)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    # No abbreviations, as Megatron-LM's parser: `--optimizer adam` is not `--optimizer-impl adam`.
    parser = _OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                            allow_abbrev=False)
    for add in (_model_args, _mla_args, _mtp_args, _moe_args, _training_args, _kernel_args, _parallel_args, _data_args,
                _checkpoint_args, compat_flags.add_arguments):
        add(parser)
    args, unknown = parser.parse_known_args(argv)
    refused = compat_flags.refusal(args, unknown)
    if refused:
        parser.error(refused)
    if compat_flags.unknown_flags(unknown):
        parser.error(f"unrecognized arguments: {' '.join(compat_flags.unknown_flags(unknown))}")
    if args.wandb_project and not args.wandb_exp_name:
        parser.error("--wandb-project needs --wandb-exp-name (Megatron-LM: 'Please specify the wandb "
                     "experiment name!')")
    if args.recompute_activations and args.recompute_granularity is None:
        args.recompute_granularity = "selective"
    flags_error = (moe_layer_recompute_error(args) or schedule_flags_error(args) or batch_ramp_error(args)
                   or size_flags_error(args)
                   or checkpoint_flags_error(args) or moe_router_error(args) or shared_expert_overlap_error(args)
                   or mla_flags_error(args) or mtp_flags_error(args))
    if flags_error:
        parser.error(flags_error)
    if not args.mock_data and not args.data_path and not any(per_split_paths(args)):
        parser.error("give --data-path PREFIX or --mock-data")
    return args


def checkpoint_flags_error(args: argparse.Namespace) -> Optional[str]:
    """Megatron-LM's checks of the resume and checkpoint-rotation flags (its arguments.py asserts)."""
    if args.override_opt_param_scheduler and args.use_checkpoint_opt_param_scheduler:
        return ("--override-opt_param-scheduler and --use-checkpoint-opt_param-scheduler cannot both be given "
                "(Megatron-LM: 'both override and use-checkpoint are set')")
    retain = args.save_retain_interval
    if retain is not None and (retain < 1 or not args.save_interval or retain % args.save_interval):
        return (f"--save-retain-interval {retain} must be a positive multiple of --save-interval "
                f"({args.save_interval or 'not given'}), as in Megatron-LM")
    if args.non_persistent_ckpt_type in ("local", "in_memory"):
        return (f"--non-persistent-ckpt-type {args.non_persistent_ckpt_type}: node-local checkpoints need NVIDIA's "
                "resiliency extension (nvidia_resiliency_ext), not run here; use --non-persistent-ckpt-type global")
    interval = args.non_persistent_save_interval
    if interval is not None and (interval < 1 or args.non_persistent_ckpt_type != "global"):
        return (f"--non-persistent-save-interval {interval} needs a positive interval and "
                "--non-persistent-ckpt-type global")
    return None


def schedule_flags_error(args: argparse.Namespace) -> Optional[str]:
    """Megatron-LM's checks of the iteration- and sample-based schedule flags (arguments.validate_args)."""
    if (args.train_iters is None) == (args.train_samples is None):
        return "give exactly one of --train-iters and --train-samples"
    if args.train_iters is not None:
        mixed = [f for f, v in (("--lr-decay-samples", args.lr_decay_samples),
                                ("--lr-warmup-samples", args.lr_warmup_samples or None)) if v is not None]
        kind, other = "--train-iters", "iteration"
    else:
        mixed = [f for f, v in (("--lr-decay-iters", args.lr_decay_iters),
                                ("--lr-warmup-iters", args.lr_warmup_iters or None)) if v is not None]
        kind, other = "--train-samples", "sample"
    if mixed:
        return f"{' and '.join(mixed)} cannot go with {kind}: use the {other}-based form"
    if args.lr_warmup_fraction is not None and (args.lr_warmup_iters or args.lr_warmup_samples):
        return "give --lr-warmup-fraction or --lr-warmup-iters/--lr-warmup-samples, not both"
    return None


def size_flags_error(args: argparse.Namespace) -> Optional[str]:
    """Batch, parallelism and recompute flags Megatron-LM's validate_args asserts on (micro batch > 0,
    no --recompute-method with selective recompute), and sizes that would divide by zero here."""
    at_least_one = (("--micro-batch-size", args.micro_batch_size), ("--global-batch-size", args.global_batch_size),
                    ("--tensor-model-parallel-size", args.tensor_model_parallel_size),
                    ("--pipeline-model-parallel-size", args.pipeline_model_parallel_size),
                    ("--context-parallel-size", args.context_parallel_size),
                    ("--num-layers-per-virtual-pipeline-stage", args.num_layers_per_virtual_pipeline_stage),
                    ("--recompute-num-layers", args.recompute_num_layers))
    for flag, value in at_least_one:
        if value is not None and value < 1:
            return f"{flag} must be at least 1, got {value}"
    for flag, value in (("--decoder-first-pipeline-num-layers", args.decoder_first_pipeline_num_layers),
                        ("--decoder-last-pipeline-num-layers", args.decoder_last_pipeline_num_layers)):
        if value is not None and value < 0:
            return f"{flag} must be non-negative, got {value}"
    if args.context_parallel_size > 1 and args.attention_backend in ("unfused", "local"):
        return (f"--context-parallel-size {args.context_parallel_size} needs the flash core attention "
                f"(--attention-backend flash or auto), not {args.attention_backend}")
    if args.recompute_granularity == "selective" and args.recompute_method is not None:
        return "--recompute-method is not supported with --recompute-granularity selective (as in Megatron-LM)"
    unknown = [m for m in args.recompute_modules or () if m not in RECOMPUTE_MODULES]
    if args.recompute_modules and (unknown or len(set(args.recompute_modules)) != len(args.recompute_modules)):
        what = f"{' '.join(unknown)} not run by this runtime yet" if unknown else "a module named twice"
        return (f"--recompute-modules {' '.join(args.recompute_modules)}: {what} "
                f"(it runs {', '.join(RECOMPUTE_MODULES)})")
    uneven = args.decoder_first_pipeline_num_layers is not None or args.decoder_last_pipeline_num_layers is not None
    if args.num_layers_per_virtual_pipeline_stage and uneven:
        return ("--num-layers-per-virtual-pipeline-stage cannot go with --decoder-first/last-pipeline-num-layers "
                "(as in Megatron-LM)")
    if uneven and (args.account_for_embedding_in_pipeline_split or args.account_for_loss_in_pipeline_split):
        return ("--account-for-embedding/loss-in-pipeline-split cannot go with "
                "--decoder-first/last-pipeline-num-layers (as in Megatron-LM)")
    return data_source_error(args)


PER_SPLIT_DATA_FLAGS = ("--train-data-path", "--valid-data-path", "--test-data-path")


def per_split_paths(args: argparse.Namespace) -> tuple[tuple[str, ...], ...]:
    """The words of each per-split data flag, in train, validation, test order (empty where not given)."""
    return tuple(tuple(getattr(args, flag[2:].replace("-", "_")) or ()) for flag in PER_SPLIT_DATA_FLAGS)


def data_source_error(args: argparse.Namespace) -> Optional[str]:
    """One data source, as Megatron-LM takes it: --mock-data, --data-path, or the per-split paths."""
    if args.mock_data and args.data_path:
        return "give --data-path or --mock-data, not both (Megatron-LM takes a single data source)"
    per_split = [flag for flag, words in zip(PER_SPLIT_DATA_FLAGS, per_split_paths(args)) if words]
    if per_split and (args.data_path or args.mock_data):
        return f"give {per_split[0]} or {'--data-path' if args.data_path else '--mock-data'}, not both"
    if per_split and args.split:
        return f"--split divides --data-path's datasets; {per_split[0]}'s are taken whole"
    if per_split and not args.train_data_path:
        return f"{per_split[0]} needs --train-data-path (the training split's datasets)"
    return None


def batch_ramp_error(args: argparse.Namespace) -> Optional[str]:
    """Megatron-LM's checks of the growing-batch flags; sets args.batch_ramp (and the global batch of a
    step schedule, its last batch)."""
    from megatron_auto.runtime.batch_schedule import BatchRamp, parse_step_schedule

    args.batch_ramp = None
    if args.rampup_batch_size and args.step_batch_size_schedule:
        return "give --rampup-batch-size or --step-batch-size-schedule, not both"
    if args.rampup_batch_size:
        if args.train_samples is None:
            return ("--rampup-batch-size needs --train-samples (Megatron-LM: no batch-size ramp-up for "
                    "iteration-based training)")
        if args.global_batch_size is None:
            return "--rampup-batch-size needs --global-batch-size (the batch the ramp-up ends at)"
        args.batch_ramp = BatchRamp(rampup=tuple(args.rampup_batch_size))
    elif args.step_batch_size_schedule:
        try:
            steps = parse_step_schedule(" ".join(args.step_batch_size_schedule), args.seq_length)
        except UserError as error:
            return str(error)
        final = steps[-1][1]
        # Megatron-LM refuses --global-batch-size beside a step schedule; its own gpt3 example gives both,
        # with the schedule's last batch: that agreement is accepted here.
        if args.global_batch_size not in (None, final):
            return (f"--global-batch-size {args.global_batch_size} differs from the last batch of "
                    f"--step-batch-size-schedule ({final}): drop --global-batch-size")
        args.global_batch_size = final
        args.batch_ramp = BatchRamp(steps=steps)
    return None


def position_embedding_type(args: argparse.Namespace) -> str:
    """Megatron-LM's resolution of --position-embedding-type and the older rotary/no-position flags."""
    if args.use_rotary_position_embeddings:
        return "rope"
    if args.no_position_embedding and args.position_embedding_type == "learned_absolute":
        return "none"
    return args.position_embedding_type


def model_from_args(args: argparse.Namespace, vocab_size: int) -> ModelSpec:
    try:
        # Megatron-LM: --num-query-groups counts only with --group-query-attention (else multi-head).
        groups = args.num_query_groups if args.group_query_attention else None
        return uniform_model("pretrain_gpt", args.num_layers, args.hidden_size, args.num_attention_heads,
                             args.seq_length, vocab_size, ffn_hidden_size=args.ffn_hidden_size,
                             num_query_groups=groups, swiglu=args.swiglu, kv_channels=args.kv_channels,
                             add_qkv_bias=args.add_qkv_bias, qk_layernorm=args.qk_layernorm,
                             apply_layernorm_1p=args.apply_layernorm_1p,
                             untie_embeddings_and_output_weights=args.untie_embeddings_and_output_weights,
                             normalization=args.normalization, add_bias_linear=not args.disable_bias_linear,
                             position_embedding_type=position_embedding_type(args), rotary_base=args.rotary_base,
                             **moe_model_flags(args), **mla_model_flags(args), **mtp_model_flags(args))
    except ValueError as error:
        raise UserError(f"model flags: {error}") from None


def precision_from_args(args: argparse.Namespace) -> str:
    """fp32, bf16 or fp16; both 16-bit flags together is a user error."""
    if args.bf16 and args.fp16:
        raise UserError("--bf16 and --fp16 are mutually exclusive: give one")
    return "bf16" if args.bf16 else "fp16" if args.fp16 else "fp32"


def settings_from_args(args: argparse.Namespace, vocab_size: int, eod: int = 0) -> TrainSettings:
    from dataclasses import replace

    from megatron_auto.runtime.config import check_loss_scaling
    from megatron_auto.runtime.validation import check_settings

    settings = _settings(args, vocab_size, precision_from_args(args))
    check_settings(settings, args.seq_length)
    check_loss_scaling(settings)
    return replace(settings, data=replace(settings.data, eod=eod))


def log_tokenizer_and_data(args: argparse.Namespace, tokenizer) -> None:
    """The tokenizer's line, and the data flags that change nothing here, with the reason."""
    logger.info("tokenizer: %s, vocabulary %d, end of document %d", tokenizer.kind, tokenizer.vocab_size,
                tokenizer.eod)
    if not args.create_attention_mask_in_dataloader:
        logger.info("--no-create-attention-mask-in-dataloader: without effect here (the dataloader never "
                    "builds attention masks; the attention kernel applies the causal mask)")


def data_from_args(args: argparse.Namespace, vocab_size: int) -> DataSettings:
    """The data flags: the `--data-path` blend (empty for --mock-data) and its split (Megatron-LM's default
    969,30,1 when not given), or the per-split datasets; .bin reading, cache, masks."""
    from megatron_auto.runtime.gpt_data import MAX_SCAN_BYTES, check_data, check_data_tokens, check_run_data

    if args.reset_attention_mask:
        raise UserError("--reset-attention-mask: per-document attention masks are not supported "
                        "(the attention here is causal over the whole sequence)")
    per_split = per_split_paths(args)
    data = DataSettings(blend=tuple(args.data_path or ()), blend_per_split=per_split if any(per_split) else (),
                        vocab_size=vocab_size, split=args.split or "969,30,1", mmap_bin_files=args.mmap_bin_files,
                        cache_path=args.data_cache_path, eod_mask_loss=args.eod_mask_loss,
                        reset_position_ids=args.reset_position_ids)
    if data.from_files:
        check_data(data)  # before any work: a truncated .bin, a bad blend or split is one line
        check_run_data(data, args.eval_iters)
        if not check_data_tokens(data):
            logger.info("--data-path: a .bin over %d GiB: token ids are checked against the vocabulary as "
                        "samples are read", MAX_SCAN_BYTES >> 30)
    return data


def _settings(args: argparse.Namespace, vocab_size: int, precision: str) -> TrainSettings:
    return TrainSettings(
        train_iters=args.train_iters or 0, train_samples=args.train_samples, batch_ramp=args.batch_ramp,
        lr_decay_samples=args.lr_decay_samples,
        lr_warmup_samples=args.lr_warmup_samples, lr_warmup_fraction=args.lr_warmup_fraction,
        lr_warmup_init=args.lr_warmup_init, override_schedule=args.override_opt_param_scheduler,
        decoupled_lr=args.decoupled_lr, decoupled_min_lr=args.decoupled_min_lr,
        calculate_per_token_loss=args.calculate_per_token_loss, check_for_nan=args.check_for_nan_in_loss_and_grad,
        exit_duration_s=args.exit_duration_in_mins * 60, load_optimizer=not args.no_load_optim,
        save_optimizer=not args.no_save_optim, save_rng=not args.no_save_rng,
        exit_signal=args.exit_signal if args.exit_signal_handler else None,
        load_rng=not args.no_load_rng, tensorboard_dir=args.tensorboard_dir, wandb_project=args.wandb_project,
        wandb_exp_name=args.wandb_exp_name, wandb_save_dir=args.wandb_save_dir, wandb_entity=args.wandb_entity,
        lr=args.lr, min_lr=args.min_lr, lr_decay_style=args.lr_decay_style,
        lr_wsd_decay_style=args.lr_wsd_decay_style, lr_wsd_decay_iters=args.lr_wsd_decay_iters,
        lr_wsd_decay_samples=args.lr_wsd_decay_samples, weight_decay_incr_style=args.weight_decay_incr_style,
        start_weight_decay=args.start_weight_decay, end_weight_decay=args.end_weight_decay,
        lr_warmup_iters=args.lr_warmup_iters, lr_decay_iters=args.lr_decay_iters, weight_decay=args.weight_decay,
        clip_grad=args.clip_grad, adam_beta1=args.adam_beta1, adam_beta2=args.adam_beta2, adam_eps=args.adam_eps,
        precision=precision, loss_scale=args.loss_scale, initial_loss_scale=args.initial_loss_scale,
        min_loss_scale=args.min_loss_scale, loss_scale_window=args.loss_scale_window, hysteresis=args.hysteresis,
        hidden_dropout=args.hidden_dropout, attention_dropout=args.attention_dropout,
        init_method_std=args.init_method_std, init_method_xavier_uniform=args.init_method_xavier_uniform,
        seed=args.seed, norm_epsilon=args.norm_epsilon,
        attention_backend=args.attention_backend, optimizer_impl=args.optimizer_impl,
        recompute_modules=tuple(args.recompute_modules or DEFAULT_RECOMPUTE_MODULES),
        bias_activation_fusion=not (args.no_bias_swiglu_fusion if args.swiglu else args.no_bias_gelu_fusion),
        bias_dropout_fusion=not args.no_bias_dropout_fusion, bias_fusions=args.bias_fusions,
        grad_accumulation_fusion=args.grad_accumulation_fusion, overlap_param_gather=args.overlap_param_gather,
        rotary_percent=args.rotary_percent, rope_scaling=args.use_rope_scaling,
        rope_scaling_factor=args.rope_scaling_factor,
        rotary_interpolation_factor=args.rotary_seq_len_interpolation_factor, rope_type=args.rope_type,
        rotary_scaling_factor=args.rotary_scaling_factor, mscale=args.mscale, mscale_all_dim=args.mscale_all_dim,
        make_vocab_size_divisible_by=args.make_vocab_size_divisible_by, padded_vocab_size=args.padded_vocab_size,
        max_position_embeddings=args.max_position_embeddings, log_interval=args.log_interval,
        eval_interval=args.eval_interval, eval_iters=args.eval_iters, save=args.save, load=args.load,
        save_interval=args.save_interval, exit_interval=args.exit_interval, ckpt_step=args.ckpt_step,
        save_retain_interval=args.save_retain_interval,
        non_persistent_save_interval=args.non_persistent_save_interval or 0,
        non_persistent_ckpt_type=args.non_persistent_ckpt_type,
        non_persistent_global_ckpt_dir=args.non_persistent_global_ckpt_dir,
        finetune=args.finetune, pretrained_checkpoint=args.pretrained_checkpoint,
        exit_on_missing_checkpoint=args.exit_on_missing_checkpoint, timeout_s=args.distributed_timeout_minutes * 60,
        data=data_from_args(args, vocab_size), moe=moe_settings(args))


def manual_flags(args: argparse.Namespace) -> ManualParallelism:
    return ManualParallelism(
        tensor_parallel=args.tensor_model_parallel_size or 1, pipeline_parallel=args.pipeline_model_parallel_size or 1,
        micro_batch_size=args.micro_batch_size, global_batch_size=args.global_batch_size,
        layers_per_virtual_stage=args.num_layers_per_virtual_pipeline_stage,
        first_stage_layers=args.decoder_first_pipeline_num_layers, last_stage_layers=args.decoder_last_pipeline_num_layers,
        account_for_embedding=args.account_for_embedding_in_pipeline_split,
        account_for_loss=args.account_for_loss_in_pipeline_split,
        pipeline_layout=args.pipeline_model_parallel_layout,
        recompute_granularity=args.recompute_granularity, recompute_method=args.recompute_method,
        recompute_num_layers=args.recompute_num_layers, sequence_parallel=bool(args.sequence_parallel),
        distributed_optimizer=bool(args.use_distributed_optimizer),
        expert_parallel=args.expert_model_parallel_size or 1, expert_tensor_parallel=args.expert_tensor_parallel_size,
        context_parallel=args.context_parallel_size)


def search_constraints(args: argparse.Namespace, model: ModelSpec) -> SearchConstraints:
    """The explicit parallelism flags, as constraints on the search."""
    virtual = None
    if args.num_layers_per_virtual_pipeline_stage and args.pipeline_model_parallel_size:
        virtual = model.num_layers // (args.num_layers_per_virtual_pipeline_stage * args.pipeline_model_parallel_size)
    # A growing batch keeps --micro-batch-size (every batch of the ramp must split into micro-batches).
    micro_batch = args.micro_batch_size if args.batch_ramp is not None else None
    return SearchConstraints(tp=args.tensor_model_parallel_size, pp=args.pipeline_model_parallel_size,
                             micro_batch_size=micro_batch,
                             virtual_stages=virtual, sequence_parallel=None,  # SP: the planner's choice
                             distributed_optimizer=args.use_distributed_optimizer,
                             recompute=args.recompute_granularity, expert_parallel=args.expert_model_parallel_size,
                             expert_tensor_parallel=args.expert_tensor_parallel_size,
                             context_parallel=args.context_parallel_size if args.context_parallel_size > 1 else None)


def training_for_job(args: argparse.Namespace, settings: TrainSettings, world_size: int) -> TrainingSpec:
    """What the search prices: the global batch, the precision, the kernels this run resolves to (Transformer
    Engine's layer spec, with its fused norms, where it imports on a GPU) and the memory margin."""
    import torch

    from megatron_auto.runtime.kernels import transformer_engine_available

    global_batch = args.global_batch_size or args.micro_batch_size * world_size
    # A dry run prices the named GPU cluster's kernels, wherever it runs.
    on_gpu = torch.cuda.is_available() or (args.auto_parallel_dry_run and args.auto_parallel_cluster is not None
                                           and args.auto_parallel_cluster != CPU_CLUSTER_PRESET)
    common = dict(attention_backend=resolve_attention_backend(settings.attention_backend, on_gpu),
                  optimizer_impl=resolve_optimizer_impl(settings.optimizer_impl, on_gpu),
                  memory_margin=args.auto_parallel_memory_margin,
                  moe_token_dispatcher=settings.moe.token_dispatcher, moe_grouped_gemm=settings.moe.grouped_gemm,
                  moe_shared_expert_overlap=settings.moe.shared_expert_overlap,
                  recompute_modules=settings.recompute_modules,
                  fused_norms=on_gpu and transformer_engine_available(),
                  # `auto` fuses on a GPU (once the stand-in's start-up check passes): cli.job prices the same.
                  grad_accumulation_fusion=settings.grad_accumulation_fusion == "on"
                  or (settings.grad_accumulation_fusion == "auto" and on_gpu))
    return TrainingSpec.for_precision(settings.precision, global_batch, **common)


def choose_plan(args: argparse.Namespace, model: ModelSpec, world_size: int, settings: TrainSettings,
                gpus_per_node: Optional[int] = None):
    """The plan this run uses: the plan file's, the search's (on nodes of `gpus_per_node` GPUs when given,
    LOCAL_WORLD_SIZE) or the launch line's flags'."""
    from megatron_auto.runtime import planning

    if args.auto_parallel_plan:
        return planning.plan_from_file(args.auto_parallel_plan, model, world_size)
    if not args.auto_parallel:
        return plan_from_flags(model, world_size, manual_flags(args))
    constraints = search_constraints(args, model)
    search = lambda constraints: planning.search_for_job(  # noqa: E731
        model, world_size, args.auto_parallel_cluster, training_for_job(args, settings, world_size), constraints,
        args.auto_parallel_space, args.auto_parallel_profile, choose_recompute_modules=args.recompute_modules is None,
        gpus_per_node=gpus_per_node)
    plan = search(constraints)
    if args.batch_ramp is None or _ramp_splits(args, plan):
        return plan
    # Every batch of a growing batch must split over the replicas: the widest data parallelism that does.
    unit = math.gcd(*args.batch_ramp.batch_sizes(args.global_batch_size)) // args.micro_batch_size
    for dp in sorted((d for d in range(1, world_size + 1) if world_size % d == 0 and unit % d == 0), reverse=True):
        try:
            return search(dataclasses.replace(constraints, dp=dp))
        except UserError:
            continue
    return plan  # session.build_session names the batch that does not split


def _ramp_splits(args: argparse.Namespace, plan) -> bool:
    """Whether every batch of the ramp splits into micro-batches over `plan`'s data-parallel replicas."""
    from megatron_auto.runtime.layout import layout_from_plan

    if plan.space != "megatron":
        return True
    layout = layout_from_plan(plan)
    unit = layout.micro_batch_size * layout.data_parallel
    return all(batch % unit == 0 for batch in args.batch_ramp.batch_sizes(args.global_batch_size))


def with_plan_recompute_modules(args: argparse.Namespace, settings: TrainSettings, plan) -> TrainSettings:
    """`settings` re-running what the plan's selective recomputation was priced with, when --recompute-modules
    was not given (the planner chose it, or the plan file records it)."""
    if args.recompute_modules is not None or plan.prediction is None:
        return settings
    return dataclasses.replace(settings, recompute_modules=tuple(plan.prediction.recompute_modules))


def check_plan_runs(plan, settings: TrainSettings, model: ModelSpec) -> None:
    """Before any work: what the chosen plan's global batch or its runtime cannot run (UserError)."""
    from megatron_auto.runtime.validation import check_global_batch

    check_global_batch(settings, plan.global_batch_size)
    problem = recompute_modules_problem(model.layers, settings.recompute_modules)
    if problem:
        raise UserError(problem)
    for strategy in plan.distinct_strategies | {plan.embedding}:
        if strategy.sp and strategy.tp > 1 and model.seq_length % strategy.tp:
            raise UserError(f"--sequence-parallel splits the sequence over tensor parallel {strategy.tp}: "
                            f"--seq-length {model.seq_length} must be divisible by it")
    if plan.space == "hybrid":
        from megatron_auto.runtime.hybrid.session import check_supported

        check_supported(plan, model)
    priced = plan.prediction.recompute_modules if plan.prediction is not None else settings.recompute_modules
    if tuple(priced) != settings.recompute_modules and plan.recomputes_selectively:
        raise UserError(f"the plan's selective recompute was priced re-running {' '.join(priced)}; this run's "
                        f"--recompute-modules is {' '.join(settings.recompute_modules)}: give --recompute-modules "
                        f"{' '.join(priced)} to run the plan as priced")


def plan_basis(args: argparse.Namespace, plan, model: ModelSpec, world_size: int, settings: TrainSettings,
               gpus_per_node: Optional[int] = None):
    """The cluster (in nodes of `gpus_per_node` GPUs when given) and training spec the plan is priced under
    (runtime.memory_check.PlanBasis); None when no cluster preset matches the device of a run that did not search."""
    from dataclasses import replace

    from megatron_auto.runtime import planning
    from megatron_auto.runtime.memory_check import PlanBasis

    try:
        cluster = planning.job_cluster(world_size, args.auto_parallel_cluster, args.auto_parallel_profile,
                                       gpus_per_node)
    except UserError:
        if args.auto_parallel:
            raise
        logger.info("no cluster preset for this device: the plan's memory is not checked")
        return None
    training = replace(training_for_job(args, settings, world_size), global_batch_size=plan.global_batch_size)
    return PlanBasis(plan.model or model, cluster, training)


def replanner(args: argparse.Namespace, basis, world_size: int, gpus_per_node: Optional[int] = None):
    """The search's plan under a lowered memory budget, with --auto-parallel's constraints
    (none when the plan came from flags or a file: the planner's free choice is the suggestion)."""
    from dataclasses import replace

    from megatron_auto.runtime import planning

    constraints = search_constraints(args, basis.model) if args.auto_parallel else SearchConstraints()
    return lambda budget: planning.search_for_job(
        basis.model, world_size, args.auto_parallel_cluster, replace(basis.training, memory_budget_bytes=budget),
        constraints, args.auto_parallel_space, args.auto_parallel_profile, gpus_per_node=gpus_per_node)


def own_flags_plan(args: argparse.Namespace, model: ModelSpec, world_size: int, basis):
    """The plan of the launch line's own parallelism flags (Megatron-LM's defaults where absent), priced under
    `basis`; or None and why it is no layout here."""
    from megatron_auto.cost.estimate import estimate_plan

    flags = manual_flags(args)
    flags = dataclasses.replace(flags, sequence_parallel=flags.sequence_parallel and flags.tensor_parallel > 1)
    try:
        own = plan_from_flags(model, world_size, flags)
        training = dataclasses.replace(basis.training, global_batch_size=own.global_batch_size)
        return dataclasses.replace(own, prediction=estimate_plan(own, basis.model, basis.cluster, training)), None
    except UserError as error:
        return None, str(error)


def dry_run(args: argparse.Namespace, adjustments: list[str], plan, model: ModelSpec, world_size: int,
            settings: TrainSettings, gpus_per_node: Optional[int] = None) -> None:
    """--auto-parallel-dry-run: the plan and its prediction on stdout, and under --auto-parallel (or a plan file)
    the line's own flags priced on the same cluster (in nodes of `gpus_per_node` GPUs when given); rank 0 only."""
    from megatron_auto.cost.estimate import estimate_plan
    from megatron_auto.report import comparison_lines, plan_table
    from megatron_auto.runtime.planning import describe_job_cluster

    if int(os.environ.get("RANK", "0")) != 0:
        return
    for line in adjustments:
        logger.warning("%s", line)
    basis = plan_basis(args, plan, model, world_size, settings, gpus_per_node)
    if basis is None:
        raise UserError("--auto-parallel-dry-run: no cluster preset for this device; name one with "
                        "--auto-parallel-cluster PRESET|FILE.json")
    logger.info("%s", describe_job_cluster(basis.cluster, world_size, gpus_per_node))
    if plan.prediction is None or args.auto_parallel_plan:  # a plan file's prediction was priced elsewhere
        plan = dataclasses.replace(plan, prediction=estimate_plan(plan, basis.model, basis.cluster, basis.training))
    text = plan_table(plan)
    if args.auto_parallel or args.auto_parallel_plan:
        text += "\n" + "\n".join(comparison_lines(plan, *own_flags_plan(args, model, world_size, basis))) + "\n"
    sys.stdout.write(text)
    sys.stdout.flush()


def precision_summary(settings: TrainSettings) -> str:
    """One log line naming the precision (and the loss scaling of fp16)."""
    if settings.precision == "fp32":
        return "fp32"
    text = f"{settings.precision} (fp32 main gradients and master weights in the optimizer"
    if settings.precision == "fp16":
        scaling = (f"constant loss scale {settings.loss_scale:g}" if settings.loss_scale else
                   f"dynamic loss scale from {settings.initial_loss_scale:g}, window {settings.loss_scale_window},"
                   f" hysteresis {settings.hysteresis}, min {settings.min_loss_scale:g}")
        text += f"; {scaling}"
    return text + ")"


def megatron_lm_adjustments(args: argparse.Namespace) -> list[str]:
    """Flags Megatron-LM turns off with a warning rather than refuse; returns the warnings (mutates `args`)."""
    warnings_given = []
    if args.sequence_parallel and args.auto_parallel:
        warnings_given.append("--sequence-parallel: under --auto-parallel sequence parallelism is the planner's "
                              "choice (with tensor parallelism)")
    split_flags = [flag for flag, given in (
        ("--decoder-first-pipeline-num-layers", args.decoder_first_pipeline_num_layers is not None),
        ("--decoder-last-pipeline-num-layers", args.decoder_last_pipeline_num_layers is not None),
        ("--account-for-embedding-in-pipeline-split", args.account_for_embedding_in_pipeline_split),
        ("--account-for-loss-in-pipeline-split", args.account_for_loss_in_pipeline_split),
        ("--pipeline-model-parallel-layout", args.pipeline_model_parallel_layout is not None)) if given]
    if split_flags and args.auto_parallel:
        warnings_given.append(f"{', '.join(split_flags)}: under --auto-parallel the planner splits the layers over "
                              "the pipeline stages (it prices the embedding and the loss on their stages)")
    if args.context_parallel_size > 1 and args.attention_backend == "auto":
        args.attention_backend = "flash"  # the core attention that runs context parallelism, on CPU too
    if args.moe_token_dispatcher_type == "flex":
        warnings_given.append("--moe-token-dispatcher-type flex: DeepEP/HybridEP kernels are not available here; "
                              "the alltoall dispatcher moves the same tokens")
    if args.sequence_parallel and args.auto_parallel:
        pass
    elif args.sequence_parallel and (args.tensor_model_parallel_size or 1) == 1:
        args.sequence_parallel = False
        warnings_given.append("Disabling sequence parallelism because tensor model parallelism is disabled")
    return warnings_given


def _use_matmul_flags(args: argparse.Namespace) -> None:
    """--disable-bf16-reduced-precision-matmul, as Megatron-LM sets it (CUDA only; no-op on CPU)."""
    import torch

    if args.disable_bf16_reduced_precision_matmul:
        torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False


def _log_run_header(args: argparse.Namespace, adjustments: list[str], settings: TrainSettings, model: ModelSpec,
                    plan) -> None:
    from megatron_auto.report import plan_table
    from megatron_auto.runtime import kernels
    from megatron_auto.runtime.config import param_gather_overlap_requested

    for line in adjustments:
        logger.warning("%s", line)
    for flag, reason in no_effect_reasons(args):
        logger.info("accepted without effect here: %s (%s)", flag, reason)
    logger.info("precision: %s", precision_summary(settings))
    logger.info("%s", kernels.kernels_for_run(model, settings).describe())
    if param_gather_overlap_requested(settings) and any(s.zero == 1 for s in (*plan.distinct_strategies, plan.embedding)):
        logger.info("distributed optimizer: the updated weights are all-gathered during the next forward "
                    "(--overlap-param-gather)")
    if plan.recomputes_selectively:
        logger.info("selective recompute re-runs: %s (--recompute-modules)", " ".join(settings.recompute_modules))
    logger.info("parallel plan (%s):\n%s", "auto-parallel" if args.auto_parallel else "flags", plan_table(plan))


def run(args: argparse.Namespace) -> None:
    import patches
    from megatron_auto.runtime import checkpoint, distributed, fit, planning, session

    adjustments = megatron_lm_adjustments(args)
    _use_matmul_flags(args)
    tokenizer = tokenizer_from_flags(args)
    settings = settings_from_args(args, tokenizer.vocab_size, tokenizer.eod)
    model = model_from_args(args, args.padded_vocab_size or tokenizer.vocab_size)  # the rows the planner prices
    patches.apply_all()
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    gpus_per_node = planning.gpus_per_node_from_env(world_size)
    plan = choose_plan(args, model, world_size, settings, gpus_per_node)
    settings = with_plan_recompute_modules(args, settings, plan)
    check_plan_runs(plan, settings, model)
    if args.auto_parallel_dry_run:
        return dry_run(args, adjustments, plan, model, world_size, settings, gpus_per_node)
    info = distributed.init_distributed(settings.timeout_s)
    try:
        checkpoint.check_paths(settings.save, settings.load, settings.non_persistent_save_dir)
        if session.is_logging_rank():
            _log_run_header(args, adjustments, settings, model, plan)
            log_tokenizer_and_data(args, tokenizer)
        basis = plan_basis(args, plan, model, world_size, settings, gpus_per_node)
        if basis is None:
            job = session.build_session(plan, model, settings, info.backend, info.device)
            if settings.starts_from_checkpoint:
                session.resume(job)
            session.train(job)
        else:
            if session.is_logging_rank():
                logger.info("%s", planning.describe_job_cluster(basis.cluster, world_size, gpus_per_node))
            fit.train_fitting(plan, basis, settings, info, replanner(args, basis, world_size, gpus_per_node),
                              restart=args.auto_parallel)
    finally:
        distributed.shutdown()


def configure_logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
    logging.getLogger("megatron").setLevel(logging.WARNING)
    if int(os.environ.get("RANK", "0")) != 0:
        # Every rank runs the same deterministic search; one rank reports it.
        logging.getLogger("megatron_auto.search").setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", module="megatron")
    warnings.filterwarnings("ignore", category=UserWarning)
    warnings.filterwarnings("ignore", category=FutureWarning)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    configure_logging()
    from megatron_auto.runtime.faults import peer_failure
    from megatron_auto.runtime.stopping import TrainingDiverged

    try:
        run(args)
    except UserError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except TrainingDiverged as error:  # Megatron-LM stops with an error too (its rerun state machine)
        print(f"error: {error}", file=sys.stderr)
        return 1
    except RuntimeError as error:  # a peer that stalled or died: one line, and torchrun may restart the job
        said = peer_failure(error)
        if said is None:
            raise
        print(f"error: {said}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
