"""`megatron-auto profile-cluster` and `profile-model`: measure, then write a versioned profile JSON.

Both run under torchrun (`python -m torch.distributed.run --nproc_per_node N -m
megatron_auto profile-...`); every rank measures, rank 0 writes the file. The
measuring code lives in megatron_auto/profiling/ (torch, megatron.core), which
is imported only here.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from .. import serde
from ..errors import UserError
from ..specs import load_model
from .progress import ProgressBar


def _is_rank_zero() -> bool:
    return os.environ.get("RANK", "0") == "0"


def _write(record, path: str) -> None:
    if not _is_rank_zero():
        return
    try:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(serde.dumps(record))
    except OSError as error:
        raise UserError(f"cannot write profile '{path}': {error.strerror or error}") from None
    sys.stderr.write(f"wrote {path}\n")


def _progress(label: str) -> ProgressBar:
    """A bar on rank 0's stderr; silent elsewhere."""
    bar = ProgressBar(label)
    bar.enabled = bar.enabled and _is_rank_zero()
    return bar


def _sizes(args: argparse.Namespace) -> tuple[int, ...]:
    if args.min_bytes > args.max_bytes:
        raise UserError("--min-bytes must not exceed --max-bytes")
    sizes, size = [], args.min_bytes
    while size <= args.max_bytes:
        sizes.append(size)
        size *= args.size_factor
    return tuple(sizes)


def run_profile_cluster(args: argparse.Namespace) -> int:
    import torch.distributed as dist

    from ..profiling.cluster_bench import ClusterBenchConfig
    from ..profiling.cluster_profile import profile_cluster

    config = ClusterBenchConfig(message_bytes=_sizes(args), iters=args.iters, name=args.name)
    with _progress("profiling collectives") as progress:
        profile = profile_cluster(config, progress)
    _write(profile, args.out)
    dist.destroy_process_group()
    return 0


def run_profile_model(args: argparse.Namespace) -> int:
    import torch.distributed as dist

    from ..profiling.layer_bench import LayerBenchSettings, bench_kernels
    from ..profiling.model_profile import ModelSweep, profile_model

    model = load_model(args.model)
    if args.rotary_percent > 1:
        raise UserError(f"--rotary-percent must be in (0, 1], got {args.rotary_percent:g}")
    if all(layer.moe is not None for layer in model.layers):
        raise UserError(f"every layer of {model.name} is a mixture of experts; profile-model times "
                        "dense layers only (MoE layers are priced analytically, cost/moe.py)")
    sweep = ModelSweep(tuple(args.tp), tuple(args.micro_batch_size), tuple(args.seq_length or [model.seq_length]),
                       LayerBenchSettings(precision=args.precision, iters=args.iters,
                                          attention_backend=args.attention_backend,
                                          optimizer_impl=args.optimizer_impl, bias_fusions=args.bias_fusions,
                                          grad_accumulation_fusion=args.grad_accumulation_fusion,
                                          rotary_percent=args.rotary_percent))
    if _is_rank_zero():  # the kernels measured, named as tools/pretrain_gpt.py's log names the run's
        dense = next(layer for layer in model.layers if layer.moe is None)
        sys.stderr.write(f"measuring {bench_kernels(dense, sweep.settings).describe()}\n")
    with _progress("profiling layers") as progress:
        profile = profile_model(model, sweep, progress)
    _write(profile, args.out)
    dist.destroy_process_group()
    return 0
