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
Applied whenever Megatron-Core falls back to torch's Adam (its USING_PYTORCH_OPTIMIZER): on CPU
always, and on GPUs without apex or Transformer Engine too, where the same two faults hit a
distributed-optimizer resume (`applies_on_cuda`).
"""
from __future__ import annotations

from ._source import Replacement, source_rewrite_patch

NAME = "distrib_optimizer_torch_adam_step"
TARGET_VERSIONS = ("0.16.1",)
MODULE = "megatron.core.optimizer.distrib_optimizer"
TARGETS = (
    ("load_state_dict", (Replacement('s["step"] = step\n', 's["step"] = step.clone()\n'),)),
    ("_set_main_param_and_optimizer_states",
     (Replacement("dst_tensors[key].copy_(tensors[key])",
                  "dst_tensors[key].copy_(tensors[key]) if key in tensors else None"),)),
)


check, apply, is_applied = source_rewrite_patch(NAME, TARGET_VERSIONS, MODULE, "DistributedOptimizer", TARGETS)


def applies_on_cuda() -> bool:
    """True when Megatron-Core's optimizer is torch's Adam (neither TE's nor apex's FusedAdam imported)."""
    from megatron.core import optimizer

    return bool(getattr(optimizer, "USING_PYTORCH_OPTIMIZER", False))
