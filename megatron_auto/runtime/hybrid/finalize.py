"""What the schedule calls after the last backward: reduce, tie and scale every part's gradients.

Megatron's `finalize_model_grads` takes one TP and one DP group for the whole
model; here each part brings its own. Gradients are sums (per-token loss), so
after the DP reductions they are divided once by the global token count.
"""
from __future__ import annotations

import torch

from .sharded import ShardedPart


def finalize_grads(model, num_tokens=None, pg_collection=None, *, head_dp_group, **_) -> None:
    """DP reduce per part, SP layernorm all-reduce per part's TP group, tied embedding, token scaling."""
    from megatron.core import parallel_state
    from megatron.core.distributed.finalize_model_grads import (
        _allreduce_non_tensor_model_parallel_grads, _allreduce_word_embedding_grads)

    parts = [part for chunk in model for part in chunk.wrapped]
    for part in parts:
        part.finish_grad_sync()
    for part in parts:
        if isinstance(part, ShardedPart):
            part.allreduce_sequence_parallel_grads()
        else:
            _allreduce_non_tensor_model_parallel_grads([part], part.config, part.tp_group)
    # Under PP the shell is wrapped alone (build._group_key): Megatron's tie reads that DDP.
    shells = [part for chunk in model for part in chunk.wrapped
              if chunk.shell is not None and part.module is chunk.shell]
    pp_group = parallel_state.get_pipeline_model_parallel_group()
    if shells and parallel_state.get_pipeline_model_parallel_world_size() > 1:
        _allreduce_word_embedding_grads(shells, shells[0].config,
                                        parallel_state.get_embedding_group(check_initialized=False), pp_group)
    _update_expert_biases(model)
    if num_tokens is None:
        return
    last = torch.distributed.get_process_group_ranks(pp_group)[-1]
    if torch.distributed.get_rank() == last:
        # The head's DP ranks hold disjoint samples; its TP ranks count the same ones.
        torch.distributed.all_reduce(num_tokens, group=head_dp_group)
    torch.distributed.broadcast(num_tokens, src=last, group=pp_group)
    if num_tokens > 0:
        for part in parts:
            part.scale_gradients(1.0 / num_tokens)


def _update_expert_biases(model) -> None:
    """The routers' expert-bias step of Megatron's finalize_model_grads (--moe-router-enable-expert-bias).

    Megatron all-reduces the routers' token counts over parallel_state's TP x DP group. Here parallel_state
    has TP 1 (session.initialize_parallel), so that group is every rank of this pipeline stage, which is the
    TP x DP group of each of the stage's MoE layers, whatever their own TP and DP degrees."""
    from megatron.core.distributed.finalize_model_grads import (_update_router_expert_bias,
                                                                reset_model_temporary_tensors)

    biased = [m for chunk in model for m in chunk.modules() if getattr(m, "expert_bias", None) is not None]
    if biased:  # chunk.config is the schedule's (runtime/hybrid/configs.py); a router's has the MoE fields
        _update_router_expert_bias(model, biased[0].config)
        reset_model_temporary_tensors(biased[0].config, model)
