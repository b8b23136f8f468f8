"""The MoE routers' auxiliary losses as Megatron-LM logs them (load_balancing_loss, z_loss, ...).

The losses themselves reach the gradients inside megatron-core: each router attaches its
aux-loss / z-loss to the activations with MoEAuxLossAutoScaler, and the pipeline schedule
(schedules.forward_step) sets that scaler to 1 / num_micro_batches (x the fp16 loss scale),
as Megatron-LM's training does. Here they are only read back for the log line: megatron-core's
track_moe_metrics reduces the per-layer values over pipeline, tensor and data-parallel ranks
(Megatron-LM's training.py calls it with the same arguments) and clears them for the next step.
"""
from __future__ import annotations

TRACK_NAMES = {"aux_loss": "load_balancing_loss", "seq_aux_loss": "seq_load_balancing_loss",
               "global_aux_loss": "global_load_balancing_loss"}
"""--moe-router-load-balancing-type -> the name megatron-core's router tracks its loss under (router.py)."""


def track_names(config) -> list[str]:
    """The tracked losses of this config: its load-balancing loss, and z_loss with a z-loss coefficient."""
    kinds = config.moe_router_load_balancing_type
    kinds = kinds if isinstance(kinds, list) else [kinds]
    names = [TRACK_NAMES[kind] for kind in kinds if kind in TRACK_NAMES]
    if config.moe_z_loss_coeff is not None:
        names.append("z_loss")
    return names


def collect_aux_losses(config, num_micro_batches: int) -> tuple[tuple[str, float], ...]:
    """(name, value) of each auxiliary loss of the iteration just run, the mean over micro-batches and
    MoE layers (every rank must call it: it reduces over ranks); () for a dense model."""
    if getattr(config, "num_moe_experts", None) is None:
        return ()
    from megatron.core.transformer.moe.moe_utils import track_moe_metrics

    names = track_names(config)
    totals: dict = {}
    track_moe_metrics(loss_scale=1.0 / num_micro_batches, iteration=0, total_loss_dict=totals,
                      force_initialize=True, track_names=names, num_layers=config.num_layers,
                      moe_layer_freq=config.moe_layer_freq)
    return tuple((name, float(totals[name])) for name in names if name in totals)


def reset_aux_loss_tracker() -> None:
    """Forget megatron-core's per-layer loss tracker (a module global sized by the model's layer count), so
    a session built in a process that ran another model (a re-plan, a test) starts clean."""
    from megatron.core.transformer.moe.moe_utils import get_moe_layer_wise_logging_tracker

    get_moe_layer_wise_logging_tracker().clear()
