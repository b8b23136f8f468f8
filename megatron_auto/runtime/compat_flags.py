"""Megatron-LM flags that tools/pretrain_gpt.py accepts without effect, or refuses, each with its reason.

A launch line written for Megatron-LM runs unchanged when every flag is either honoured (the
argument groups of pretrain_gpt.py), accepted without effect because it picks a kernel, a
logging sink or an I/O back-end and leaves the training's math alone (`NO_EFFECT_*`, named in
the log with the reason), or refused before any work with one line naming it and why
(`refusal`). README.md's flag table lists the same three sets.
"""
from __future__ import annotations

import argparse
from typing import Optional

KERNEL = "a kernel choice; this runtime picks its kernels itself (runtime/kernels.py)"
SINK = "a logging or profiling sink this runtime does not write"
STRAGGLER = ("Megatron-LM's straggler detector (nvidia-resiliency-ext) is not run; this runtime's own watch finds slow "
             "nodes and re-plans around them (--auto-parallel-straggler-interval, README.md)")
IO = "an I/O back-end choice; checkpoints are Megatron-Core dist_checkpointing, data loading is in-process"
LAYOUT = "a sharding/overlap choice; the plan decides the layout (--auto-parallel) and the math is unchanged"

NO_EFFECT_SWITCHES = {
    "--use-mcore-models": "Megatron-Core models are the only ones here",
    "--use-flash-attn": KERNEL + " (--attention-backend chooses the core attention)",
    "--attention-softmax-in-fp32": "the unfused softmax runs in fp32 already",
    "--no-masked-softmax-fusion": KERNEL + " (the masked-softmax fusion needs apex: always off)",
    "--no-rope-fusion": KERNEL + " (the RoPE fusion needs apex/TE: always off)",
    "--cross-entropy-loss-fusion": KERNEL + " (the loss is Megatron's vocab-parallel cross entropy)",
    "--overlap-grad-reduce": LAYOUT + " (on GPUs the gradient reduce overlaps the backward anyway)",
    "--use-megatron-fsdp": LAYOUT + " (ZeRO-3 layers come from --auto-parallel-space hybrid)",
    "--fsdp-double-buffer": LAYOUT, "--fsdp-manual-registration": LAYOUT,
    "--use-nccl-ub": LAYOUT,
    "--init-model-with-meta-device": "weights are initialised on the CPU and split, for any layout",
    "--accumulate-allreduce-grads-in-fp32": "main gradients are fp32 already",
    "--grad-reduce-in-bf16": "gradients are reduced in fp32 (as precise or more)",
    "--log-throughput": "throughput is always in the iteration line",
    "--log-timers-to-tensorboard": SINK, "--log-validation-ppl-to-tensorboard": SINK,
    "--log-memory-to-tensorboard": SINK, "--log-params-norm": SINK, "--log-num-zeros-in-grad": SINK,
    "--profile": SINK + " (no torch-profiler or nsys trace)",
    "--record-memory-history": SINK,
    "--use-checkpoint-args": "the model is what the command line says",
    "--manual-gc": "Python's garbage collector runs as usual",
    "--async-save": IO + " (saves are synchronous)",
    "--auto-detect-ckpt-format": IO,
    "--nvtx-ranges": SINK,
    "--deterministic-mode": "CPU runs are deterministic already; on GPUs torch's deterministic algorithms are "
                            "not forced (kernel choice)",
    "--use-cpu-initialization": "weights are initialised on the CPU and split, for any layout",
    "--no-persist-layer-norm": KERNEL + " (apex's persistent LayerNorm kernel is not used)",
    "--te-rng-tracker": KERNEL + " (Megatron's own RNG tracker keeps the dropout streams)",
    "--use-dist-ckpt": IO, "--ckpt-fully-parallel-save": IO, "--ckpt-fully-parallel-load": IO,
    "--ckpt-assume-constant-structure": IO, "--use-persistent-ckpt-worker": IO,
    "--log-progress": SINK, "--log-world-size-to-tensorboard": SINK, "--log-loss-scale-to-tensorboard": SINK,
    "--log-batch-size-to-tensorboard": SINK, "--log-energy": SINK, "--log-straggler": STRAGGLER,
    "--disable-straggler-on-startup": STRAGGLER,
    "--ddp-average-in-collective": LAYOUT + " (the gradients are averaged over the data-parallel ranks either way)",
    "--use-precision-aware-optimizer": "with fp32 main gradients, master weights and Adam moments (the default of "
                                       "its four dtype flags) Adam takes the same step; lower dtypes are refused",
    "--use-tp-pp-dp-mapping": LAYOUT + " (it orders the ranks into groups; each group computes the same)",
    "--inference-rng-tracker": "read only at inference; training's dropout streams are Megatron's RNG tracker",
    "--overlap-cpu-optimizer-d2h-h2d": "read only by --optimizer-cpu-offload, which is refused",
}
NO_EFFECT_VALUES = {
    "--distributed-backend": "NCCL on GPUs, gloo on CPU, chosen by the host",
    "--transformer-impl": KERNEL + " (Transformer Engine when it imports on a GPU, else local)",
    "--tensorboard-log-interval": SINK,
    "--num-workers": IO, "--dataloader-type": IO, "--ckpt-format": IO,
    "--timing-log-level": SINK, "--logging-level": SINK,
    "--manual-gc-interval": "Python's garbage collector runs as usual",
    "--profile-step-start": SINK, "--profile-step-end": SINK,
    "--empty-unused-memory-level": "torch.cuda.empty_cache() between steps only returns cached memory; the "
                                   "memory check measures allocated and reserved peaks",
    "--data-parallel-sharding-strategy": LAYOUT + " (ZeRO-3 layers come from --auto-parallel-space hybrid)",
    "--megatron-fsdp-grad-comm-dtype": LAYOUT + " (gradients are reduced in fp32)",
    "--megatron-fsdp-main-grads-dtype": LAYOUT + " (main gradients are fp32)",
    "--dist-ckpt-strictness": IO,
    "--dist-ckpt-format": IO, "--num-dataset-builder-threads": IO,
    "--timing-log-option": SINK,
    "--ddp-bucket-size": LAYOUT + " (the bucket size sets how the gradient reduction overlaps, not its result)",
    "--check-weight-hash-across-dp-replicas-interval": "a consistency check this runtime does not run",
    "--sgd-momentum": "read only by --optimizer sgd, which is refused",
    "--optimizer-offload-fraction": "read only by --optimizer-cpu-offload, which is refused",
    "--non-persistent-local-ckpt-dir": "read only by --non-persistent-ckpt-type local, which is refused",
    "--non-persistent-local-ckpt-algo": "read only by --non-persistent-ckpt-type local, which is refused",
}
MOE_NO_EFFECT_SWITCHES = {
    "--moe-permute-fusion": KERNEL + " (the fused permutation needs Transformer Engine; the tokens are the same)",
    "--moe-router-fusion": KERNEL + " (the fused router needs Transformer Engine; the scores are the same)",
    "--moe-use-legacy-grouped-gemm": KERNEL + " (--moe-grouped-gemm picks TE's or Megatron's grouped GEMM)",
    "--overlap-moe-expert-parallel-comm": LAYOUT,
    "--moe-enable-deepep": KERNEL + " (DeepEP's dispatcher needs its CUDA kernels; alltoall moves the same tokens)",
}
NO_EFFECT_LISTS = {
    "--profile-ranks": SINK,
    "--cp-comm-type": KERNEL + " (the local spec's context-parallel attention all-gathers K and V, which "
                               "computes what p2p and a2a compute; Transformer Engine, where it runs, runs its "
                               "default p2p ring, as --auto-parallel prices it; `megatron-auto plan`/`estimate` "
                               "price each type for Megatron-LM runs)",
}

REFUSED_PREFIXES = {
    "--fp8": "fp8 training needs Transformer Engine's fp8 recipes, which this runtime does not run yet",
    "--moe-": ("not a Megatron-LM 0.16.1 flag (each of its --moe-* flags is honoured, without effect or refused: "
               "README.md's flag table)"),
    "--mtp-": ("not a Megatron-LM 0.16.1 flag: its multi-token prediction flags are --mtp-num-layers and "
               "--mtp-loss-scaling-factor (which run here) and --mtp-standalone (without effect)"),
}
_CONVERT = ("converting a checkpoint's format is not run here (checkpoints are Megatron-Core dist_checkpointing "
            "torch_dist, which every layout loads)")
_LOW_PRECISION_OPTIMIZER = ("main gradients, master weights or Adam moments below fp32 need Transformer Engine's "
                            "FusedAdam (--use-precision-aware-optimizer), which this runtime does not drive yet")
REFUSED_ANY_VALUE = {
    "--window-size": "sliding-window attention is not built by this runtime yet",
    "--softmax-type": "attention sinks / learnable softmax are not built by this runtime yet",
    "--enable-gpt-oss": "gpt-oss layers (MoE, sinks, sliding windows) are not built by this runtime yet",
    "--window-attn-skip-freq": "sliding-window attention is not built by this runtime yet",
    "--glu-linear-offset": "gpt-oss's clamped GLU is not built by this runtime yet",
    "--activation-func-clamp-value": "gpt-oss's clamped GLU is not built by this runtime yet",
    "--ckpt-convert-format": _CONVERT, "--ckpt-convert-save": _CONVERT,
}
REFUSED_UNLESS = {
    "--optimizer": ("adam", "only Adam with decoupled weight decay (Megatron's `adam`) runs here; Megatron-Core "
                            "0.16.1's Muon would also need NVIDIA's emerging_optimizers package, which does not "
                            "install here"),
    "--main-grads-dtype": ("fp32", _LOW_PRECISION_OPTIMIZER), "--main-params-dtype": ("fp32", _LOW_PRECISION_OPTIMIZER),
    "--exp-avg-dtype": ("fp32", _LOW_PRECISION_OPTIMIZER), "--exp-avg-sq-dtype": ("fp32", _LOW_PRECISION_OPTIMIZER),
}
"""flag: (the one value accepted, why others are refused)."""
REFUSED_SWITCHES = {
    "--quick-geglu": "the quick-GeGLU activation is not built by this runtime yet",
    "--cache-mla-latents": "caching MLA's latents serves Megatron-Core's dynamic inference backend (Flash MLA); "
                           "training cannot run with it (MLA asserts 'cache_mla_latents conflicts with training')",
    "--export-force-local-attention": "gpt-oss's local attention is not built by this runtime yet",
    "--optimizer-cpu-offload": "optimizer CPU offload (Megatron-Core's HybridDeviceOptimizer) is not run by this "
                               "runtime yet, and the planner does not price it",
    "--ckpt-convert-update-legacy-dist-opt-format": _CONVERT,
    "--load-main-params-from-ckpt": "copying the fp32 main parameters alone from a checkpoint's optimizer state is "
                                    "not run here; with --no-load-optim they are rebuilt from the model weights "
                                    "(Megatron-LM's behaviour without this flag)",
}
REFUSED_ABOVE_ONE: dict[str, str] = {}
"""Sizes that only 1 runs (none left: --context-parallel-size runs since CP came in)."""


def dest(flag: str) -> str:
    return "compat_" + flag.lstrip("-").replace("-", "_")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The accepted-without-effect flags and the refused flags that take a value."""
    group = parser.add_argument_group("Megatron-LM flags accepted without effect (README.md says why)")
    for flag in NO_EFFECT_SWITCHES:
        group.add_argument(flag, action="store_true", dest=dest(flag))
    for flag in NO_EFFECT_VALUES:
        group.add_argument(flag, dest=dest(flag), metavar="VALUE")
    for flag in NO_EFFECT_LISTS:
        group.add_argument(flag, dest=dest(flag), nargs="+", metavar="VALUE")
    for flag in MOE_NO_EFFECT_SWITCHES:
        group.add_argument(flag, action="store_true", dest=dest(flag))

    refused = parser.add_argument_group("Megatron-LM flags refused here (one line says why)")
    for flag in REFUSED_ANY_VALUE:
        refused.add_argument(flag, dest=dest(flag), metavar="VALUE")
    for flag in REFUSED_ABOVE_ONE:
        refused.add_argument(flag, dest=dest(flag), type=int, metavar="N")
    for flag in REFUSED_SWITCHES:
        refused.add_argument(flag, dest=dest(flag), action="store_true")
    for flag in REFUSED_UNLESS:
        refused.add_argument(flag, dest=dest(flag), metavar="VALUE")


def no_effect(args: argparse.Namespace) -> list[tuple[str, str]]:
    """(flag, reason) of every accepted-without-effect flag this run was given."""
    switches = {**NO_EFFECT_SWITCHES, **MOE_NO_EFFECT_SWITCHES}
    given = [(f, why) for f, why in switches.items() if getattr(args, dest(f))]
    values = {**NO_EFFECT_VALUES, **NO_EFFECT_LISTS}
    return given + [(f, why) for f, why in values.items() if getattr(args, dest(f)) is not None]


def refusal(args: argparse.Namespace, unknown: list[str]) -> Optional[str]:
    """One line naming the first refused flag and why, or None."""
    for token in unknown:
        for prefix, why in REFUSED_PREFIXES.items():
            if token.startswith(prefix):
                return f"{token.split('=')[0]}: {why}"
    for flag, why in REFUSED_ANY_VALUE.items():
        if getattr(args, dest(flag)) is not None:
            return f"{flag}: {why}"
    for flag, why in REFUSED_SWITCHES.items():
        if getattr(args, dest(flag)):
            return f"{flag}: {why}"
    for flag, (accepted, why) in REFUSED_UNLESS.items():
        value = getattr(args, dest(flag))
        if value is not None and value != accepted:
            return f"{flag} {value}: {why}"
    for flag, why in REFUSED_ABOVE_ONE.items():
        size = getattr(args, dest(flag))
        if size is not None and size > 1:
            return f"{flag} {size}: {why} (size 1 is accepted)"
    return None


def unknown_flags(unknown: list[str]) -> list[str]:
    """The tokens parse_known_args left that are neither refused-prefix flags nor their values."""
    left, skipping = [], False
    for token in unknown:
        if any(token.startswith(p) for p in REFUSED_PREFIXES):
            skipping = True
            continue
        if skipping and not token.startswith("--"):
            continue
        skipping = False
        left.append(token)
    return left
