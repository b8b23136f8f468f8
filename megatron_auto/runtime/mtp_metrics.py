"""The multi-token prediction losses as Megatron-LM logs them ("mtp_1 loss", ... one per depth).

The losses reach the gradients inside megatron-core: GPTModel attaches each depth's loss x
mtp_loss_scaling_factor / D to the hidden states with MTPLossAutoScaler, whose backward scale the
pipeline schedule (schedules.forward_step_calc_loss) sets per micro-batch to 1 / num_micro_batches
x the fp16 loss scale (config.grad_scale_func), as Megatron-LM's training does. Here they are only
read back for the log line: GPTModel adds each micro-batch's per-token mean to MTPLossLoggingHelper's
tracker on the last pipeline stage; Megatron-LM's training_log averages it over the data-parallel
ranks (with context parallelism) and scales it by 1 / num_micro_batches (track_mtp_metrics).
"""
from __future__ import annotations

import torch


def collect_mtp_losses(config, num_micro_batches: int) -> tuple[tuple[str, float], ...]:
    """(name, value) of each MTP depth's loss in the iteration just run, the mean over micro-batches and
    data-parallel ranks; () without MTP or off the last pipeline stage (where the tracker stays empty)."""
    if getattr(config, "mtp_num_layers", None) is None:
        return ()
    from megatron.core.transformer.multi_token_prediction import MTPLossLoggingHelper

    tracker = MTPLossLoggingHelper.tracker
    if "values" not in tracker:
        return ()
    values = tracker["values"].clone()
    group = tracker.get("avg_group")
    if group is not None:  # Megatron's ReduceOp.AVG, which gloo lacks: a sum over the group / its size
        torch.distributed.all_reduce(values, group=group)
        values /= torch.distributed.get_world_size(group)
    MTPLossLoggingHelper.clean_loss_in_tracker()
    return tuple((f"mtp_{depth + 1} loss", float(value) / num_micro_batches) for depth, value in enumerate(values))


def reset_mtp_loss_tracker() -> None:
    """Forget megatron-core's MTP loss tracker (a class attribute sized by the model's depth count), so a
    session built in a process that ran another model starts clean."""
    from megatron.core.transformer.multi_token_prediction import MTPLossLoggingHelper

    MTPLossLoggingHelper.tracker.clear()
