"""Patch: the CUDA RNG tracker of tensor_parallel/random.py, backed by the CPU generator.

Why: `CudaRNGStatesTracker`, `model_parallel_cuda_manual_seed` and the
activation-checkpointing functions save and restore the CUDA generator
(`torch.cuda.get_rng_state`, `torch.cuda.default_generators`, `_C._cuda_setRNGState`).
On a CPU-only torch the generator that dropout actually draws from is the CPU
default generator, so the tracker must fork that one. The patch points the
module's "CUDA" generator calls at the CPU generator: forks (tensor-parallel
dropout regions) and recomputation then replay exactly as on GPUs. Because the
"CUDA" and CPU generators are now one, `fork()`'s warning "CPU RNG state changed
within GPU RNG context" would fire on every dropout; the patch filters exactly
that message from the module's logger.
Targets: megatron-core 0.16.1.
Removable when: megatron-core's RNG tracker takes a device (or a generator) instead of assuming CUDA.
Applied only when CUDA is absent (patches.apply_all).
"""
from __future__ import annotations

import importlib
import logging
from typing import Any

import torch

from . import _cpu_torch
from ._checks import require_text, require_version

NAME = "cuda_rng_tracker"
TARGET_VERSIONS = ("0.16.1",)
MODULE = "megatron.core.tensor_parallel.random"
MARKERS = ("def _get_cuda_rng_state(", "def _set_cuda_rng_state(", "torch.cuda.manual_seed(", "torch.cuda.get_rng_state()")


class CpuRngCuda(_cpu_torch.CpuCuda):
    """`torch.cuda`'s RNG entry points, answered by the CPU default generator."""

    @staticmethod
    def get_rng_state(device: Any = "cuda") -> torch.Tensor:
        return torch.get_rng_state()

    @staticmethod
    def set_rng_state(new_state: torch.Tensor, device: Any = "cuda") -> None:
        torch.set_rng_state(new_state)

    @staticmethod
    def manual_seed(seed: int) -> None:
        torch.manual_seed(seed)


def _get_cpu_rng_state(device: Any = "cuda", clone: bool = False, graph_safe: bool = False) -> torch.Tensor:
    """Drop-in for `_get_cuda_rng_state`: get_rng_state already returns a copy."""
    return torch.get_rng_state()


def _set_cpu_rng_state(new_state: torch.Tensor, device: int = -1, graph_safe: bool = False) -> None:
    """Drop-in for `_set_cuda_rng_state`."""
    torch.set_rng_state(new_state)


SPURIOUS_WARNING = "CPU RNG state changed within GPU RNG context"


class _SameGeneratorFilter(logging.Filter):
    """Drops fork()'s CPU-vs-GPU RNG warning, meaningless when both are the CPU generator."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.getMessage() != SPURIOUS_WARNING


def check():
    require_version(NAME, TARGET_VERSIONS)
    for marker in MARKERS + (SPURIOUS_WARNING,):
        module = require_text(MODULE, marker, NAME)
    return module


def apply() -> None:
    module = check()
    _cpu_torch.install(module, CpuRngCuda())
    module._get_cuda_rng_state = _get_cpu_rng_state
    module._set_cuda_rng_state = _set_cpu_rng_state
    log = logging.getLogger(MODULE)
    if not any(isinstance(f, _SameGeneratorFilter) for f in log.filters):
        log.addFilter(_SameGeneratorFilter())


def is_applied() -> bool:
    module = importlib.import_module(MODULE)
    return _cpu_torch.is_installed(module) and module._set_cuda_rng_state is _set_cpu_rng_state
