"""The MoE routers' auxiliary losses as Megatron-LM logs them (load_balancing_loss, z_loss, ...).

The losses themselves reach the gradients inside megatron-core: each router attaches its
aux-loss / z-loss to the activations with MoEAuxLossAutoScaler, and the pipeline schedule
(schedules.forward_step) sets that scaler to 1 / num_micro_batches (x the fp16 loss scale),
as Megatron-LM's training does. Here they are only read back for the log line: megatron-core's
track_moe_metrics reduces the per-layer values over pipeline, tensor and data-parallel ranks
(Megatron-LM's training.py calls it with the same arguments) and clears them for the next step.
"""
from __future__ import annotations

from dataclasses import dataclass

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


def collect_aux_losses(config, num_micro_batches: int, hybrid_layers=None) -> tuple[tuple[str, float], ...]:
    """(name, value) of each auxiliary loss of the iteration just run, the mean over micro-batches and
    MoE layers (every rank must call it: it reduces over ranks); () for a dense model. `hybrid_layers`:
    a hybrid plan's HybridLayers, whose layers each reduce over their own layout (reduce_per_layer)."""
    if getattr(config, "num_moe_experts", None) is None:
        return ()
    from megatron.core.transformer.moe.moe_utils import track_moe_metrics

    names = track_names(config)
    # An MTP module's layer routes too (as the last decoder layer): the routers size the tracker for it
    # (router.py), and Megatron-LM's training_log counts it among the MoE layers (mtp_num_layers below).
    mtp_layers = getattr(config, "mtp_num_layers", None)
    groups, num_layers = None, config.num_layers + (mtp_layers or 0)
    if hybrid_layers is not None:  # (a hybrid chunk's config is its schedule's, one "layer" per stage)
        num_layers = len(hybrid_layers.data_parallel)
        reduce_per_layer(names, num_layers, hybrid_layers)
        groups = hybrid_layers.no_more_reduction
    totals: dict = {}
    track_moe_metrics(loss_scale=1.0 / num_micro_batches, iteration=0, total_loss_dict=totals,
                      force_initialize=True, track_names=names, num_layers=num_layers,
                      moe_layer_freq=config.moe_layer_freq, mtp_num_layers=mtp_layers, pg_collection=groups)
    return tuple((name, float(totals[name])) for name in names if name in totals)


@dataclass
class HybridLayers:
    """What the per-layer reduction of a hybrid plan needs: each layer's DP degree and a stage's GPUs."""

    data_parallel: tuple[int, ...]
    stage_gpus: int
    device: object
    no_more_reduction: object
    """A group collection whose pp is a one-rank group and whose losses carry no reduce group:
    track_moe_metrics then only sums the layers that reduce_per_layer has already reduced."""


def reduce_per_layer(names: list[str], num_layers: int, layers: HybridLayers) -> None:
    """Every rank's per-layer losses summed over the job, then each layer's divided by its replicas.

    A router's load-balancing loss on one rank is its TP group's partial sum (router.py reduces the
    token counts over tp_cp and sums the local probabilities), so a layer's value is the sum over its
    stage's ranks / the layer's DP degree: the mean over its data-parallel replicas, as Megatron-Core's
    reduction over tp_cp then the DP group gives for one layout. The z-loss is each rank's mean over its
    own tokens: the sum over the stage / its GPUs. Layers live on one stage, so the sum over the world
    is the sum over their stage."""
    import torch
    from megatron.core.transformer.moe.moe_utils import get_moe_layer_wise_logging_tracker

    tracker = get_moe_layer_wise_logging_tracker()
    for name in names:
        entry = tracker.setdefault(name, {"values": torch.zeros(num_layers, device=layers.device)})
        values = entry["values"]
        torch.distributed.all_reduce(values)
        replicas = [layers.stage_gpus] * num_layers if name == "z_loss" else list(layers.data_parallel)
        values.div_(torch.tensor(replicas, dtype=values.dtype, device=values.device))
        entry.update(reduce_group=None, avg_group=None, reduce_group_has_dp=False)


def reset_aux_loss_tracker() -> None:
    """Forget megatron-core's per-layer loss tracker (a module global sized by the model's layer count), so
    a session built in a process that ran another model (a re-plan, a test) starts clean."""
    from megatron.core.transformer.moe.moe_utils import get_moe_layer_wise_logging_tracker

    get_moe_layer_wise_logging_tracker().clear()
