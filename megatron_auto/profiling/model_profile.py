"""Sweep a model's layer types over (TP, micro-batch, sequence) and assemble a ModelProfile.

Launched like the job it prices: under torchrun with as many processes per node
as the job has ranks, every process runs the same sweep in lockstep (a barrier
before each point and around each timed block, layer_bench.measure_layer), so
the times include the contention of ranks that share the node's cores or memory
bandwidth. Rank 0's numbers are written, after taking
the median over ranks of each time.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Callable, Optional

import torch
import torch.distributed as dist

from ..specs.model import ModelSpec
from ..specs.profiles import LayerProfile, LayerTiming, ModelProfile
from .cluster_profile import init_from_env
from .layer_bench import LayerBenchSettings, measure_layer, optimizer_seconds_per_state_byte

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelSweep:
    """The grid to measure."""

    tp_degrees: tuple[int, ...]
    micro_batches: tuple[int, ...]
    seq_lengths: tuple[int, ...]
    settings: LayerBenchSettings = LayerBenchSettings()


def _median_over_ranks(timing: LayerTiming, device) -> LayerTiming:
    """Each time field replaced by its median over the ranks that measured it."""
    fields = ("forward_s", "backward_s", "attention_core_forward_s")
    values = torch.tensor([getattr(timing, f) for f in fields], dtype=torch.float64, device=device)
    gathered = [torch.empty_like(values) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, values)
    medians = torch.stack(gathered).median(dim=0).values.tolist()
    return replace(timing, **dict(zip(fields, medians)))


def _setup_megatron() -> torch.device:
    """torch.distributed plus Megatron's (trivial) model-parallel state and the CPU patches."""
    import patches
    from megatron.core import parallel_state, tensor_parallel

    patches.apply_all()
    device, _ = init_from_env()
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(1, 1)
    tensor_parallel.model_parallel_cuda_manual_seed(1234)
    return device


def valid_tp_degrees(model: ModelSpec, degrees: tuple[int, ...]) -> tuple[int, ...]:
    """The TP degrees that split every layer's heads and query groups evenly."""
    return tuple(t for t in degrees if all(l.tensor_parallel_error(t) is None and l.ffn_hidden_size % t == 0
                                            for l in model.layers))


def profile_model(model: ModelSpec, sweep: ModelSweep,
                  progress: Optional[Callable[[float], None]] = None) -> ModelProfile:
    """Measure every distinct layer type of `model` over the sweep."""
    device = _setup_megatron()
    settings = replace(sweep.settings, rotary_base=model.rotary_base if model.position_embedding_type == "rope" else None)
    # MoE layers stay analytic (cost/moe.py prices their routed experts on top of any layer time).
    layer_types = [layer for layer in dict.fromkeys(model.layers) if layer.moe is None]
    if len(layer_types) < len(set(model.layers)):
        logger.warning("the mixture-of-experts layers are not timed; the cost model prices them analytically")
    tps = valid_tp_degrees(model, sweep.tp_degrees)
    grid = [(t, b, s) for t in tps for b in sweep.micro_batches for s in sweep.seq_lengths]
    total, done = len(layer_types) * len(grid) + 1, 0
    entries = []
    for layer in layer_types:
        timings = []
        for tp, micro_batch, seq in grid:
            dist.barrier()
            timing = measure_layer(layer, tp, micro_batch, seq, settings, device, barrier=dist.barrier)
            timings.append(_median_over_ranks(timing, device))
            done += 1
            if progress:
                progress(done / total)
        entries.append(LayerProfile(layer=layer, timings=tuple(timings)))
    dist.barrier()
    optimizer_rate = optimizer_seconds_per_state_byte(layer_types[0], settings, device, barrier=dist.barrier)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    return ModelProfile(name=model.name, device=name, precision=settings.precision,
                        concurrent_processes=dist.get_world_size(), layers=tuple(entries),
                        optimizer_s_per_state_byte=optimizer_rate,
                        cpu_cores=0 if device.type == "cuda" else usable_cpu_cores())


def usable_cpu_cores() -> int:
    """Cores this process may run on (its affinity mask; the whole machine where that is unknown)."""
    import os

    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1
