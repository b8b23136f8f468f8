"""One training or evaluation iteration through Megatron-Core's pipeline schedules."""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Optional

import torch

from .layout import MegatronLayout


@dataclass(frozen=True)
class StepResult:
    """What one iteration reports (loss is the token-weighted mean over the global batch)."""

    loss: float
    grad_norm: float
    skipped: bool = False
    loss_scale: Optional[float] = None
    """fp16: the loss scale after this iteration's update (None without loss scaling)."""
    has_loss: bool = True
    """Whether this rank computed the loss (the last pipeline stage); elsewhere `loss` is NaN."""
    has_grad_norm: bool = True
    """Whether the optimizer measured the gradient norm (not with --clip-grad 0 or a skipped fp16 step)."""
    moe_losses: tuple[tuple[str, float], ...] = ()
    """MoE models: (name, value) of the routers' auxiliary losses (runtime/moe_metrics.py), logged as Megatron-LM."""
    mtp_losses: tuple[tuple[str, float], ...] = ()
    """Multi-token prediction: ("mtp_1 loss", value), ... per depth (runtime/mtp_metrics.py), on the last stage."""

    @property
    def extra_losses(self) -> tuple[tuple[str, float], ...]:
        """The losses logged after the lm loss, in Megatron-LM's order: the MoE losses, then the MTP ones."""
        return self.moe_losses + self.mtp_losses


def loss_func(loss_mask: torch.Tensor, output_tensor: torch.Tensor):
    """Megatron-LM's GPT loss: summed token loss, token count, and a [sum, count] pair to report."""
    losses = output_tensor.float().view(-1)
    mask = loss_mask.view(-1).float()
    loss = torch.sum(losses * mask)
    num_tokens = mask.sum().clone().detach().to(torch.int)
    report = torch.cat([loss.clone().detach().view(1), num_tokens.float().view(1)])
    return loss, num_tokens, {"lm loss": report}


def forward_step(data_iterator, model):
    """The schedule's forward step: run one micro-batch through this chunk (under context parallelism, this
    rank's two chunks of every sequence: Megatron-Core's get_batch_on_this_cp_rank)."""
    from megatron.core import parallel_state
    from megatron.core.utils import get_batch_on_this_cp_rank

    batch = next(data_iterator)
    if parallel_state.get_context_parallel_world_size() > 1:
        batch = get_batch_on_this_cp_rank(dict(batch))
    # Megatron-LM's forward step hands GPTModel the loss mask, which only the MTP losses read.
    masks = {"loss_mask": batch["loss_mask"]} if getattr(getattr(model, "config", None), "mtp_num_layers", None) \
        else {}
    output = model(batch["tokens"], batch["position_ids"], None, labels=batch["labels"], **masks)
    return output, partial(loss_func, batch["loss_mask"])


def reduce_reported_loss(losses: list[dict], device: torch.device, group=None) -> float:
    """Token-weighted mean of the last stage's micro-batch losses over the data-parallel group with the
    context-parallel ranks, which each hold a part of every sequence (`group`: the LM head's DP group of a
    hybrid plan)."""
    from megatron.core import parallel_state

    if not losses:
        return float("nan")
    total = torch.stack([entry["lm loss"] for entry in losses]).sum(dim=0).to(device)
    torch.distributed.all_reduce(total, group=group or parallel_state.get_data_parallel_group(
        with_context_parallel=True))
    return float(total[0] / total[1])


def run_schedule(model: list, iterators, layout: MegatronLayout, seq_length: int, forward_only: bool,
                 hybrid=None):
    """Megatron's forward-backward function for this layout (1F1B, interleaved or none).

    `hybrid` (a hybrid.hybrid_runtime.HybridRuntime) gives the p2p tensor's shape of a hybrid plan.
    """
    from megatron.core.pipeline_parallel import get_forward_backward_func

    return get_forward_backward_func()(
        forward_step_func=forward_step,
        data_iterator=iterators,
        model=model,
        num_microbatches=layout.num_micro_batches,
        seq_length=hybrid.p2p_seq_length if hybrid else seq_length,
        micro_batch_size=hybrid.p2p_micro_batch if hybrid else layout.micro_batch_size,
        decoder_seq_length=hybrid.p2p_seq_length if hybrid else seq_length,
        forward_only=forward_only,
    )


def train_step(model: list, optimizer, scheduler, iterators, layout: MegatronLayout,
               seq_length: int, device: torch.device, hybrid=None) -> StepResult:
    """Zero grads, run the schedule, step the optimizer and the learning-rate schedule."""
    for chunk in model:
        chunk.train()
        chunk.zero_grad_buffer()
    optimizer.zero_grad()
    losses = run_schedule(model, iterators, layout, seq_length, forward_only=False, hybrid=hybrid)
    update_successful, grad_norm, _ = optimizer.step()
    if update_successful:
        scheduler.step(increment=layout.global_batch_size)
    group = hybrid.head_dp_group if hybrid else None
    from .moe_metrics import collect_aux_losses
    from .mtp_metrics import collect_mtp_losses

    config = getattr(model[0], "config", None)
    return StepResult(loss=reduce_reported_loss(losses, device, group),
                      grad_norm=float(grad_norm) if grad_norm is not None else float("nan"),
                      skipped=not update_successful, loss_scale=current_loss_scale(optimizer),
                      has_loss=bool(losses), has_grad_norm=grad_norm is not None,
                      moe_losses=collect_aux_losses(config, layout.num_micro_batches,
                                                    hybrid.moe_layers if hybrid else None),
                      mtp_losses=collect_mtp_losses(config, layout.num_micro_batches))


def sync_parameters(model: list) -> None:
    """All-gather the weights that the distributed optimizer's last step left on their owning ranks.

    With --overlap-param-gather the step updates only each rank's shard of the weights, and Megatron DDP's
    forward pre-hooks all-gather the rest during the next forward. Anything that reads the weights outside a
    forward (a checkpoint, whatever follows the training loop) must gather them first, as Megatron-LM does
    before it saves; a resume from un-gathered weights would run its first iteration on stale ones."""
    for chunk in model:
        for part in getattr(chunk, "wrapped", [chunk]):  # a hybrid chunk's DDP-wrapped parts
            if getattr(part, "use_forward_hook", False):
                part.start_param_sync(force_sync=True)


def current_loss_scale(optimizer) -> Optional[float]:
    """The fp16 loss scale the next iteration uses; None in fp32 and bf16 (no scaling)."""
    if not optimizer.config.fp16:
        return None
    return float(optimizer.get_loss_scale())


def eval_step(model: list, iterators, layout: MegatronLayout, seq_length: int, device: torch.device,
              hybrid=None) -> float:
    """Forward-only loss of one global batch."""
    for chunk in model:
        chunk.eval()
    with torch.no_grad():
        losses = run_schedule(model, iterators, layout, seq_length, forward_only=True, hybrid=hybrid)
    for chunk in model:
        chunk.train()
    return reduce_reported_loss(losses, device, hybrid.head_dp_group if hybrid else None)
