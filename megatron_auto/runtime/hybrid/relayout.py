"""Moving one micro-batch's activations [s, b, h] between two layer layouts on one stage.

A layout (tp, dp, sp) puts sample chunk `local_rank // tp` of the micro-batch on
each rank; with SP each TP rank holds sequence shard `local_rank % tp`, without
it the TP ranks hold identical copies (whose incoming gradients are identical
and complete, as Megatron's column-parallel input all-reduce makes them).

The re-layout runs in up to three steps, each a collective whose backward is
its mirror image:
1. SP -> full sequence: all-gather over the old TP group (backward: slice);
2. batch re-split over the regroup group of k = dp_hi / dp_lo ranks:
   to more DP a local slice (backward: all-gather), to less DP an all-gather
   (backward: slice);
3. full sequence -> SP: slice to the new TP rank's shard (backward: all-gather
   over the new TP group).
`cost.communication.transition_time` charges exactly these all-gathers.
"""
from __future__ import annotations

import torch

from ...plan import LayerStrategy
from . import groups


def _all_gather_dim(tensor: torch.Tensor, dim: int, group) -> torch.Tensor:
    """Concatenate every group member's `tensor` along `dim`, in group-rank order."""
    size = torch.distributed.get_world_size(group)
    if size == 1:
        return tensor
    moved = tensor.movedim(dim, 0).contiguous()
    out = torch.empty((size * moved.shape[0],) + tuple(moved.shape[1:]), dtype=moved.dtype, device=moved.device)
    torch.distributed.all_gather_into_tensor(out, moved, group=group)
    return out.movedim(0, dim).contiguous()


def _slice_dim(tensor: torch.Tensor, dim: int, parts: int, index: int) -> torch.Tensor:
    return tensor.chunk(parts, dim=dim)[index].contiguous()


class _SliceForward(torch.autograd.Function):
    """Forward: keep part `index` of `parts` along `dim`; backward: all-gather along `dim`."""

    @staticmethod
    def forward(ctx, tensor, dim, parts, index, group):
        ctx.dim, ctx.group = dim, group
        return _slice_dim(tensor, dim, parts, index)

    @staticmethod
    def backward(ctx, grad):
        return _all_gather_dim(grad, ctx.dim, ctx.group), None, None, None, None


class _GatherForward(torch.autograd.Function):
    """Forward: all-gather along `dim`; backward: keep this rank's part of the gradient."""

    @staticmethod
    def forward(ctx, tensor, dim, group):
        ctx.dim, ctx.parts = dim, torch.distributed.get_world_size(group)
        ctx.index = torch.distributed.get_rank(group)
        return _all_gather_dim(tensor, dim, group)

    @staticmethod
    def backward(ctx, grad):
        return _slice_dim(grad, ctx.dim, ctx.parts, ctx.index), None, None


def relayout(hidden: torch.Tensor, before: LayerStrategy, after: LayerStrategy, pgs) -> torch.Tensor:
    """`hidden` ([s or s/tp, b/dp, h]) laid out for `after` instead of `before` on this rank."""
    if (before.tp, before.dp, before.sp) == (after.tp, after.dp, after.sp):
        return hidden
    if before.sp:
        hidden = _GatherForward.apply(hidden, 0, pgs.tp(before))
    if before.dp != after.dp:
        group = pgs.regroup(before.tp, after.tp)
        if after.dp > before.dp:
            k = after.dp // before.dp
            index = groups.regroup_index(pgs.local_rank, before.tp, after.tp)
            hidden = _SliceForward.apply(hidden, 1, k, index, group)
        else:
            hidden = _GatherForward.apply(hidden, 1, group)
    if after.sp:
        tp_rank = pgs.local_rank % after.tp
        hidden = _SliceForward.apply(hidden, 0, after.tp, tp_rank, pgs.tp(after))
    return hidden
