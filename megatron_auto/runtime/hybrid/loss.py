"""Vocab-parallel cross entropy over an explicit TP group (the LM head's own layout).

Megatron-Core 0.16.1's unfused `vocab_parallel_cross_entropy` reduces over
parallel_state's global TP group, which the hybrid runtime keeps at size 1;
the fused "native" path takes a group but differs from the unfused one in the
last bits of the gradient. This is the unfused function with the group passed
in: the same helper steps, the same three all-reduces.
"""
from __future__ import annotations

import types

import torch


class _GroupVocabParallelCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, target, group):
        from megatron.core.tensor_parallel.cross_entropy import VocabParallelCrossEntropy as V
        from megatron.core.tensor_parallel.utils import VocabUtility

        logits, logits_max = V.calculate_logits_max(logits)
        torch.distributed.all_reduce(logits_max, op=torch.distributed.ReduceOp.MAX, group=group)
        rank, size = torch.distributed.get_rank(group), torch.distributed.get_world_size(group)
        start, end = VocabUtility.vocab_range_from_per_partition_vocab_size(logits.size()[-1], rank, size)
        target_mask, masked_target_1d, predicted, sum_exp, exp_logits = V.calculate_predicted_logits(
            logits, target, logits_max, start, end)
        torch.distributed.all_reduce(predicted, group=group)
        torch.distributed.all_reduce(sum_exp, group=group)
        exp_logits, loss = V.calculate_cross_entropy_loss(exp_logits, predicted, sum_exp)
        ctx.save_for_backward(exp_logits, target_mask, masked_target_1d)
        return loss

    @staticmethod
    def backward(ctx, grad_output):
        from megatron.core.tensor_parallel.cross_entropy import VocabParallelCrossEntropy as V

        softmax, target_mask, masked_target_1d = ctx.saved_tensors
        grad_2d, arange_1d, softmax_update, grad_input = V.prepare_gradient_calculation_operands(softmax, target_mask)
        grad_input = V.calculate_gradients(grad_2d, arange_1d, masked_target_1d, softmax_update, grad_input,
                                           grad_output)
        return grad_input, None, None


def _language_model_loss(self, labels, logits):
    """GPTModel.compute_language_model_loss with the shell's TP group: [b, s] losses."""
    labels = labels.transpose(0, 1).contiguous()
    loss = _GroupVocabParallelCrossEntropy.apply(logits.float(), labels, self.pg_collection.tp)
    return loss.transpose(0, 1).contiguous()


def use_group_cross_entropy(shell) -> None:
    """Make `shell` (a GPTModel) compute its loss over its own TP group."""
    shell.compute_language_model_loss = types.MethodType(_language_model_loss, shell)
