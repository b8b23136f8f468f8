"""Causal attention over a sequence split across a context-parallel group, on torch's SDPA.

Megatron-Core splits each sequence for context parallelism (CP) into 2 x cp chunks and gives rank r
chunks r and 2cp-1-r (megatron.core.utils.get_batch_on_this_cp_rank), so that under a causal mask
every rank attends to the same number of keys. Its own CP attention lives in Transformer Engine (a
ring of KV exchanges, or an all-gather of K and V). This module is the all-gather form, for the
local layer spec's SDPA core (runtime/attention.py):

- every rank all-gathers K and V of its two chunks over the CP group and puts them back in sequence
  order (K and V are the small operands under grouped-query attention: ng x hn per token);
- each of its two query chunks attends to the keys up to its own end, the last chunk's worth
  causally (query i of chunk c sees key j when j <= c x L + i, L the chunk length: torch's
  lower-right causal bias, which the flash kernel runs without a mask);
- the backward sums every rank's K/V gradient and keeps this rank's chunks: a reduce-scatter on
  NCCL, an all-reduce and a slice on gloo (which has no reduce-scatter).

The math is the single-device causal attention's, rank by rank; tests/runtime/test_kernels_runtime.py
compares values and gradients with Megatron's unfused attention over the whole sequence.
"""
from __future__ import annotations

from typing import Callable, Optional

import torch
from torch import Tensor


def chunk_indices(cp_rank: int, cp_size: int) -> tuple[int, int]:
    """The two of 2 x cp_size sequence chunks that rank `cp_rank` holds (Megatron-Core's split)."""
    return cp_rank, 2 * cp_size - 1 - cp_rank


def chunks_of_rank(sequence: Tensor, cp_rank: int, cp_size: int, seq_dim: int = 0) -> Tensor:
    """This rank's two chunks of a whole `sequence` along `seq_dim`, as get_batch_on_this_cp_rank cuts them."""
    chunks = sequence.chunk(2 * cp_size, dim=seq_dim)
    return torch.cat([chunks[i] for i in chunk_indices(cp_rank, cp_size)], dim=seq_dim)


def sequence_order(cp_size: int) -> list[int]:
    """Where each of the 2 x cp_size chunks sits in the ranks' gathered order [rank 0's two, rank 1's two, ...]:
    entry c is the gathered position of sequence chunk c."""
    position = {}
    for rank in range(cp_size):
        for half, chunk in enumerate(chunk_indices(rank, cp_size)):
            position[chunk] = 2 * rank + half
    return [position[c] for c in range(2 * cp_size)]


class _GatherSequence(torch.autograd.Function):
    """All-gather along dim 0 over `group` in rank order; backward: the sum of the ranks' gradients, own slice."""

    @staticmethod
    def forward(ctx, local: Tensor, group) -> Tensor:
        ctx.group = group
        parts = [torch.empty_like(local) for _ in range(group.size())]
        torch.distributed.all_gather(parts, local.contiguous(), group=group)
        return torch.cat(parts, dim=0)

    @staticmethod
    def backward(ctx, grad: Tensor):
        group, size = ctx.group, ctx.group.size()
        grad = grad.contiguous()
        if torch.distributed.get_backend(group) == "nccl":
            local = grad.new_empty((grad.size(0) // size,) + tuple(grad.shape[1:]))
            torch.distributed.reduce_scatter_tensor(local, grad, group=group)
            return local, None
        torch.distributed.all_reduce(grad, group=group)  # gloo: no reduce-scatter
        return grad.chunk(size, dim=0)[group.rank()].clone(), None


def gather_sequence(local: Tensor, group) -> Tensor:
    """[2L, ...] of this rank's chunks -> [2 cp L, ...] of the whole sequence, in order (differentiable)."""
    size = group.size()
    gathered = _GatherSequence.apply(local, group)
    chunks = gathered.chunk(2 * size, dim=0)
    return torch.cat([chunks[p] for p in sequence_order(size)], dim=0)


Attend = Callable[[Tensor, Tensor, Tensor, Optional[Tensor], bool], Tensor]
"""(q, k, v, attn_mask, is_causal) -> context, in SDPA's [b, n, s, hn] layout."""


def context_parallel_attention(q: Tensor, k: Tensor, v: Tensor, group, attend: Attend) -> Tensor:
    """Causal attention of this rank's two query chunks against the whole sequence's keys.

    q, k, v: [b, n, 2L, hn] (SDPA's layout) of this rank's chunks; returns [b, np, 2L, hn]. Query chunk c
    attends to keys [0, (c+1)L) under torch's lower-right causal bias (query i sees key j <= cL + i): on
    CUDA the flash kernel with its causal tile skipping, nothing materialised. Grouped K and V are expanded
    to the query heads first, since the lower-right flash path takes equal head counts.
    """
    from torch.nn.attention.bias import causal_lower_right

    size, rank = group.size(), group.rank()
    # Gather over the sequence: [b, n, s, hn] -> [s, b, n, hn] so that dim 0 is the sequence.
    whole_k, whole_v = (gather_sequence(t.permute(2, 0, 1, 3), group).permute(1, 2, 0, 3) for t in (k, v))
    if whole_k.size(1) != q.size(1):
        repeats = q.size(1) // whole_k.size(1)
        whole_k, whole_v = (t.repeat_interleave(repeats, dim=1) for t in (whole_k, whole_v))
    length = q.size(2) // 2
    outputs = []
    for half, chunk in enumerate(chunk_indices(rank, size)):
        end = (chunk + 1) * length
        query = q[:, :, half * length:(half + 1) * length]
        outputs.append(attend(query, whole_k[:, :, :end], whole_v[:, :, :end], causal_lower_right(length, end), False))
    return torch.cat(outputs, dim=2)
