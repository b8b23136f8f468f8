"""Adam's states under Megatron-Core 0.16.1's precision-aware optimizer (--use-precision-aware-optimizer), the knob
NVIDIA's recipes turn for memory (Megatron-Bridge's DeepSeek-V3 recipe: bf16 main gradients and moments; its
performance scripts turn it on for every bf16 run).

Where the bytes come from (megatron/core/optimizer, 0.16.1):
- optimizer_config.py: the four dtype flags must stay fp32 without the switch, which needs the distributed
  optimizer and Transformer Engine's FusedAdam.
- __init__.py and distrib_optimizer.py: where the run is not FP8 with a non-delayed recipe (or the master weights
  are fp16), FusedAdam keeps the master weights itself (use_precision_aware_optimizer_no_fp8_or_ds_fp8); over bf16
  weights it stores only the 16 low bits of each fp32 master (store_param_remainders, on by default from TE 2.1),
  since the bf16 weight holds the high 16. Otherwise Megatron-Core keeps fp32 masters as without the switch.
- The moments are kept in their own dtype (fp8: one byte plus a scale per tensor).
- main_grads_dtype bf16 clears accumulate_allreduce_grads_in_fp32 (Megatron-LM arguments.py): the DDP gradient
  buffer, and so the reduction, is bf16, as with --grad-reduce-in-bf16.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

DTYPE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1}
MAIN_GRADS_DTYPES = ("fp32", "bf16")
MAIN_PARAMS_DTYPES = ("fp32", "fp16")
MOMENT_DTYPES = ("fp32", "fp16", "bf16", "fp8")
"""Megatron-LM's choices for --main-grads-dtype, --main-params-dtype and --exp-avg(-sq)-dtype."""
PARAM_REMAINDER_BYTES = 2
"""The low half of an fp32 master weight over a bf16 weight (TE FusedAdam's store_param_remainders)."""


@dataclass(frozen=True)
class OptimizerStates:
    """What --use-precision-aware-optimizer and its four dtype flags ask for."""

    precision_aware: bool = False
    main_grads_dtype: str = "fp32"
    main_params_dtype: str = "fp32"
    exp_avg_dtype: str = "fp32"
    exp_avg_sq_dtype: str = "fp32"

    def problem(self) -> Optional[str]:
        """Why Megatron-Core would refuse these settings (optimizer_config.py), or None."""
        for name, value, choices in (("main-grads", self.main_grads_dtype, MAIN_GRADS_DTYPES),
                                     ("main-params", self.main_params_dtype, MAIN_PARAMS_DTYPES),
                                     ("exp-avg", self.exp_avg_dtype, MOMENT_DTYPES),
                                     ("exp-avg-sq", self.exp_avg_sq_dtype, MOMENT_DTYPES)):
            if value not in choices:
                return f"--{name}-dtype must be one of {', '.join(choices)}, got {value!r}"
            if value != "fp32" and not self.precision_aware:
                return f"--{name}-dtype {value} needs --use-precision-aware-optimizer (as in Megatron-Core)"
        return None

    def master_bytes(self, precision: str, fp8_recipe: str) -> int:
        """Bytes per parameter of the master weight (module docstring)."""
        if not self.precision_aware:
            return DTYPE_BYTES["fp32"]
        kept_by_fused_adam = (self.main_params_dtype != "fp32" or precision != "fp8" or fp8_recipe == "delayed")
        if not kept_by_fused_adam:
            return DTYPE_BYTES["fp32"]
        if self.main_params_dtype == "fp32" and precision in ("bf16", "fp8"):
            return PARAM_REMAINDER_BYTES
        return DTYPE_BYTES[self.main_params_dtype]

    def adam_bytes(self, precision: str, fp8_recipe: str) -> int:
        """Bytes per parameter of the master weight and the two moments."""
        return (self.master_bytes(precision, fp8_recipe) + DTYPE_BYTES[self.exp_avg_dtype]
                + DTYPE_BYTES[self.exp_avg_sq_dtype])

    def flags(self) -> tuple[str, ...]:
        """Megatron-LM's flags for these settings (those left at fp32 are its defaults and not written)."""
        if not self.precision_aware:
            return ()
        flags = ["--use-precision-aware-optimizer"]
        for name, value in (("main-grads", self.main_grads_dtype), ("main-params", self.main_params_dtype),
                            ("exp-avg", self.exp_avg_dtype), ("exp-avg-sq", self.exp_avg_sq_dtype)):
            if value != "fp32":
                flags += [f"--{name}-dtype", value]
        return tuple(flags)
