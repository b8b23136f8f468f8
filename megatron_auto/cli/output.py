"""What the commands print and write: JSON summaries and plan files."""
from __future__ import annotations

import json
import math
import sys
from typing import Any, Optional

from .. import serde
from ..errors import UserError
from ..megatron_flags import expert_degrees, megatron_flags
from ..plan import Plan, save_plan


def flags_or_none(plan: Plan) -> Optional[list[str]]:
    """Megatron-LM flags for a megatron-space plan, None when stock Megatron cannot run it."""
    if plan.space != "megatron":
        return None
    try:
        return megatron_flags(plan)
    except UserError:
        return None


def summary(plan: Plan) -> dict[str, Any]:
    """The contract's keys (iteration_time_s, tflops_per_gpu, peak_memory_gib, fits) and the layout."""
    prediction = plan.prediction
    if prediction is None:
        raise ValueError("summary() needs a plan with a prediction")
    return {
        "iteration_time_s": prediction.iteration_time_s,
        "tflops_per_gpu": prediction.tflops_per_gpu,
        "peak_memory_gib": prediction.peak_memory_gib,
        "memory_budget_gib": prediction.memory_budget_gib,
        "peak_reserved_gib": prediction.peak_reserved_gib,
        "device_memory_gib": prediction.device_memory_gib,
        "memory_breakdown": serde.to_dict(prediction.memory_breakdown) if prediction.memory_breakdown else None,
        "attention_backend": prediction.attention_backend,
        "optimizer_impl": prediction.optimizer_impl,
        "recompute_modules": list(prediction.recompute_modules),
        "fits": prediction.fits,
        "stage_memory_gib": list(prediction.stage_memory_gib),
        "stage_time_s": list(prediction.stage_time_s),
        "breakdown": serde.to_dict(prediction.breakdown),
        "space": plan.space,
        "world_size": plan.world_size,
        "pipeline_parallel": plan.pipeline_parallel,
        # What the layers' ranks run (the largest, for per-layer layouts); the embedding's may differ.
        "micro_batch_size": max(plan.local_micro_batch(s) for s in plan.distinct_strategies),
        "embedding_micro_batch_size": plan.local_micro_batch(plan.embedding),
        "num_micro_batches": plan.num_micro_batches,
        # The MoE layers' expert-parallel and expert tensor-parallel degrees (1, None without MoE layers).
        "ep": (expert_degrees(plan) or (1, None))[0],
        "etp": (expert_degrees(plan) or (1, None))[1],
        "virtual_stages": plan.virtual_stages,
        "megatron_flags": flags_or_none(plan),
        "plan": serde.to_dict(plan),
    }


def print_json(data: dict[str, Any]) -> None:
    """One JSON object on stdout, keys sorted so equal results print equal bytes."""
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=True) + "\n")


def check_prediction(plan: Plan) -> None:
    """Every predicted number is finite: NaN or inf means inputs outside any real range (every value
    was checked on load, but a speed of 1e-300 FLOP/s is positive and still gives inf x 0)."""
    prediction = plan.prediction
    if prediction is None:
        return
    values = [prediction.iteration_time_s, prediction.tflops_per_gpu, prediction.peak_memory_gib,
              *prediction.stage_time_s, *prediction.stage_memory_gib, *serde.to_dict(prediction.breakdown).values()]
    if not all(math.isfinite(value) for value in values):
        raise UserError(f"the predicted iteration time is {prediction.iteration_time_s}: a value of the model or "
                        f"cluster is outside any real range (a speed or size near zero or overflowing)")


def write_plan(plan: Plan, path: Optional[str]) -> None:
    """Write the plan atomically (after checking its prediction), or do nothing when no --out was given."""
    check_prediction(plan)
    if path is None:
        return
    try:
        save_plan(plan, path)
    except OSError as error:
        raise UserError(f"cannot write plan file '{path}': {error.strerror or error}") from None
