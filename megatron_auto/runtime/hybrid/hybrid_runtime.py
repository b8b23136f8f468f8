"""Build and step a hybrid-space plan: the hybrid counterpart of runtime.session.build_session.

ZeRO choice: ZeRO-1 is Megatron's distributed optimizer on the segment's own DP
group (what stock Megatron runs). ZeRO-3 (and 2) segments are torch FSDP2 over
the segment's DP group (`sharded.ShardedPart`; why not Megatron-FSDP is said
there). The embedding/LM head shell stays at ZeRO 0/1 (its tied weight is
shared across stages), as the planner's hybrid space already keeps it.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from functools import partial

import torch

from ...errors import UserError
from ...plan import Plan
from ...specs.model import ModelSpec
from .. import data, distributed
from ..layout import MegatronLayout
from ...parallel_dims import ParallelDims
from ..settings import TrainSettings
from .build import build_model, pg_collection, BuildContext
from .finalize import finalize_grads
from .groups import boundary_strategy
from .optim import build_optimizer
from .process_groups import HybridProcessGroups
from .segments import chunk_segments, stage_chunk_indices
from .weights import load_full_state

logger = logging.getLogger(__name__)


@dataclass
class HybridRuntime:
    """Hybrid-only state a Session carries: groups, the head's DP group, the p2p shape."""

    pgs: HybridProcessGroups
    head_dp_group: object
    p2p_seq_length: int
    p2p_micro_batch: int
    moe_layers: object = None
    """moe_metrics.HybridLayers of a MoE model (its aux losses reduce per layer), else None."""


def check_supported(plan: Plan, model: ModelSpec) -> None:
    """UserError for what the hybrid runtime does not run yet."""
    if model.mtp_num_layers:
        raise UserError("the hybrid runtime does not build multi-token prediction modules yet (--mtp-num-layers): "
                        "run a megatron-space plan (--auto-parallel-space megatron, or the parallelism flags)")
    sharded_moe = next(((index, strategy.zero) for index, (layer, strategy)
                        in enumerate(zip(model.layers, plan.layer_strategies))
                        if layer.moe is not None and strategy.zero >= 2), None)
    if sharded_moe is not None:
        raise UserError(f"the hybrid runtime shards MoE layers with ZeRO 0 or 1 only (experts over their expert "
                        f"data-parallel group); layer {sharded_moe[0]} has ZeRO-{sharded_moe[1]}")
    if plan.embedding.zero >= 2:
        raise UserError("the hybrid runtime shards the embedding/LM head with ZeRO 0 or 1 only "
                        "(layers may use ZeRO-3)")


def initialize_parallel(plan: Plan, timeout_s: float) -> None:
    """Megatron's parallel_state with TP 1 and the plan's PP (pipeline/embedding groups, memory buffer)."""
    from megatron.core import parallel_state

    distributed.destroy_parallel_groups()  # the last layout's, Megatron's and ours (their threads too)
    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=1, pipeline_model_parallel_size=plan.pipeline_parallel,
        virtual_pipeline_model_parallel_size=plan.virtual_stages if plan.virtual_stages > 1 else None,
        distributed_timeout_minutes=timeout_s / 60, create_gloo_process_groups=False)  # a float: no rounding


def data_layout(plan: Plan) -> MegatronLayout:
    """Batch slicing of the embedding's layout (the ranks that read tokens and labels)."""
    per_micro_batch = plan.global_batch_size // plan.num_micro_batches
    dims = ParallelDims(tp=plan.embedding.tp, dp=plan.embedding.dp, pp=plan.pipeline_parallel, vp=plan.virtual_stages)
    return MegatronLayout(dims, micro_batch_size=per_micro_batch // plan.embedding.dp,
                          num_micro_batches=plan.num_micro_batches, global_batch_size=plan.global_batch_size)


def _p2p_shape(plan: Plan, seq_length: int) -> tuple[int, int]:
    """(sequence, batch) of the tensor crossing stage boundaries: 1/n of the micro-batch per GPU."""
    per_micro_batch = plan.global_batch_size // plan.num_micro_batches
    if plan.pipeline_parallel == 1:
        return seq_length, per_micro_batch // plan.embedding.dp
    boundary = boundary_strategy(plan, seq_length)
    return seq_length // (boundary.tp if boundary.sp else 1), per_micro_batch // boundary.dp


def build(plan: Plan, model_spec: ModelSpec, settings: TrainSettings, backend: str, device: torch.device,
          initial_state=None):
    """(layout, model chunks, optimizer, slicer, padded vocab, HybridRuntime) for this rank.

    `initial_state`: a single-process GPTModel state dict to start from (weights.load_full_state).
    """
    from .. import config as configs
    from ..model import set_random_seed

    check_supported(plan, model_spec)
    initialize_parallel(plan, settings.timeout_s)
    set_random_seed(settings.seed)
    pgs = HybridProcessGroups(plan, model_spec.seq_length, settings.timeout_s)
    chunks = build_model(plan, model_spec, settings, backend, device, pgs)
    if initial_state is not None:
        firsts = [[seg.first for seg in chunk_segments(plan, index)] for index in stage_chunk_indices(plan, pgs.stage)]
        load_full_state(chunks, initial_state, firsts)
    padded_vocab = configs.padded_vocab_size(settings.data.vocab_size, settings, plan.embedding.tp)
    ctx = BuildContext(plan, model_spec, settings, backend, device, pgs, padded_vocab)
    parts = [(part, strategy) for chunk in chunks for part, strategy in _parts(plan, chunk)]
    optimizer = build_optimizer(chunks, plan, settings, parts, partial(pg_collection, ctx))
    head_dp = pgs.dp(plan.embedding) if pgs.stage in (0, plan.pipeline_parallel - 1) else None
    schedule_config = chunks[0].config
    schedule_config.no_sync_func = [c.no_sync for c in chunks] if len(chunks) > 1 else chunks[0].no_sync
    schedule_config.finalize_model_grads_func = partial(finalize_grads, head_dp_group=head_dp)
    if settings.precision == "fp16":
        schedule_config.grad_scale_func = optimizer.scale_loss
    layout = data_layout(plan)
    slicer = data.BatchSlicer(layout, pgs.dp_rank(plan.embedding))
    seq, batch = _p2p_shape(plan, model_spec.seq_length)
    runtime = HybridRuntime(pgs, head_dp, seq, batch, moe_layers=_moe_layers(plan, model_spec, device))
    return layout, chunks, optimizer, slicer, padded_vocab, runtime


def _moe_layers(plan: Plan, model_spec: ModelSpec, device: torch.device):
    """How the routers' logged losses reduce under this plan (None for a dense model)."""
    if all(layer.moe is None for layer in model_spec.layers):
        return None
    from types import SimpleNamespace

    from megatron.core import parallel_state

    from ..moe_metrics import HybridLayers

    one_rank = parallel_state.get_tensor_model_parallel_group()  # TP 1: initialize_parallel
    return HybridLayers(tuple(s.dp for s in plan.layer_strategies), plan.gpus_per_stage, device,
                        no_more_reduction=SimpleNamespace(pp=one_rank, dp=one_rank))


def _parts(plan: Plan, chunk):
    yield from zip(chunk.wrapped, chunk.wrapped_strategies)
