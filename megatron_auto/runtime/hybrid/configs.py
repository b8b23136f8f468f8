"""Per-strategy Megatron configs: each segment's TransformerConfig carries its own TP/SP/recompute."""
from __future__ import annotations

import dataclasses

from ...plan import LayerStrategy, Plan
from ...specs.model import ModelSpec
from .. import config as configs
from ..layout import MegatronLayout
from ...parallel_dims import ParallelDims
from ..settings import TrainSettings

RECOMPUTE = {"none": (None, None, None), "selective": ("selective", None, None), "full": ("full", "uniform", 1)}


def strategy_layout(plan: Plan, strategy: LayerStrategy) -> MegatronLayout:
    """A one-stage Megatron layout with this strategy's TP, SP, recompute, optimizer sharding and experts."""
    granularity, method, num_layers = RECOMPUTE[strategy.recompute]
    per_micro_batch = plan.global_batch_size // plan.num_micro_batches
    return MegatronLayout(ParallelDims(tp=strategy.tp, dp=strategy.dp, ep=strategy.ep, etp=strategy.etp),
                          micro_batch_size=per_micro_batch // strategy.dp, num_micro_batches=plan.num_micro_batches,
                          global_batch_size=plan.global_batch_size, recompute_granularity=granularity,
                          recompute_method=method, recompute_num_layers=num_layers, sequence_parallel=strategy.sp,
                          distributed_optimizer=strategy.zero == 1)


def needs_per_token_loss(plan: Plan) -> bool:
    """Whether gradients must be summed and divided once by the global token count.

    Needed when a layer's DP degree differs from the LM head's (its DDP's own 1/dp
    average would be wrong) or a layer is ZeRO-3 (FSDP2 sums). Otherwise every
    DDP averages over its DP group exactly as the stock runtime does, and the
    token count's all-reduce is saved.
    """
    return any(s.dp != plan.embedding.dp or s.zero >= 2 for s in plan.layer_strategies)


def segment_config(model: ModelSpec, plan: Plan, strategy: LayerStrategy, settings: TrainSettings, backend: str):
    """TransformerConfig of one segment (or of the embedding/LM head with `plan.embedding`).

    With per-token loss (`needs_per_token_loss`) every DDP sums its gradients and
    `finalize.finalize_grads` divides by the global token count once, whatever
    each segment's DP degree. ZeRO-3 segments run without Megatron's weight-gradient
    accumulation fusion.
    """
    config = configs.transformer_config(model, strategy_layout(plan, strategy), settings, backend)
    config.calculate_per_token_loss = settings.calculate_per_token_loss or needs_per_token_loss(plan)
    # FSDP2 parameters have no main_grad to accumulate into (runtime/kernels.py).
    config.gradient_accumulation_fusion = config.gradient_accumulation_fusion and strategy.zero < 2
    return config


def schedule_config(base, plan: Plan, backend: str):
    """The config the pipeline schedule reads (chunk.config): p2p shape and pipeline fields only."""
    return dataclasses.replace(
        base, tensor_model_parallel_size=1, sequence_parallel=False,
        pipeline_model_parallel_size=plan.pipeline_parallel,
        virtual_pipeline_model_parallel_size=plan.virtual_stages if plan.virtual_stages > 1 else None,
        num_layers=plan.pipeline_parallel * plan.virtual_stages,
        microbatch_group_size_per_vp_stage=plan.pipeline_parallel,  # Megatron's default, base had pp 1
        recompute_granularity=None, recompute_method=None, recompute_num_layers=None,
        num_layers_in_first_pipeline_stage=None, num_layers_in_last_pipeline_stage=None,
        batch_p2p_comm=backend != "gloo")
