"""Patch: distributed-optimizer checkpoint loads mishandle torch Adam's per-parameter `step`.

Why: without apex/TE, Megatron-Core falls back to `torch.optim.Adam`, which keeps
a `step` tensor in every parameter's state. Two things go wrong on load:
1. `load_state_dict` gives every parameter the *same* `step` tensor; torch Adam
   increments it in place once per parameter, so after one step the bias
   correction uses a step count inflated by the number of parameters and the
   resumed losses drift from the uninterrupted run. The patch gives each
   parameter its own copy (as the apex/TE branch already does).
2. `_set_main_param_and_optimizer_states` copies every key of the live state
   from the checkpoint's (param, exp_avg, exp_avg_sq) tensors and fails with
   `KeyError: 'step'`. The patch copies only the keys the checkpoint carries.
Targets: megatron-core 0.16.1.
Removable when: upstream skips `step` there (or when apex/TE's fused Adam is installed).
Applied only when CUDA is absent (patches.apply_all).
"""
from __future__ import annotations

import importlib

from ._checks import require_version
from ._source import Replacement, patched_source, rewrite_function

NAME = "distrib_optimizer_torch_adam_step"
TARGET_VERSIONS = ("0.16.1",)
MODULE = "megatron.core.optimizer.distrib_optimizer"
TARGETS = (
    ("load_state_dict", (Replacement('s["step"] = step\n', 's["step"] = step.clone()\n'),)),
    ("_set_main_param_and_optimizer_states",
     (Replacement("dst_tensors[key].copy_(tensors[key])",
                  "dst_tensors[key].copy_(tensors[key]) if key in tensors else None"),)),
)


def _owner():
    return importlib.import_module(MODULE).DistributedOptimizer


def _patched(function: str) -> bool:
    return getattr(_owner().__dict__[function], "__megatron_auto_patched__", False)


def check() -> None:
    require_version(NAME, TARGET_VERSIONS)
    for function, replacements in TARGETS:
        patched_source(_owner(), function, replacements)


def apply() -> None:
    check()
    for function, replacements in TARGETS:
        rewrite_function(_owner(), function, replacements)


def is_applied() -> bool:
    return all(_patched(function) for function, _ in TARGETS)
