"""Multi-token prediction (DeepSeek-V3, arXiv 2412.19437, Sec. 2.2) as Megatron-Core 0.16.1 runs it.

After the decoder's last layer, on the last pipeline stage, each of the D depths
(megatron/core/transformer/multi_token_prediction.py, MultiTokenPredictionLayer) embeds the input
tokens shifted by one more position, normalises them (enorm) and the previous depth's hidden states
(hnorm), concatenates the two (2h wide) and projects them back to h (eh_proj, a column-parallel
linear whose h/t output is all-gathered over TP and, under SP, split along the sequence again), runs
one transformer layer shaped like the decoder's last, normalises, and passes the shared output layer
and the vocab-parallel cross entropy (gpt_model.py, _postprocess). Its loss joins the main one
through MTPLossAutoScaler, which adds nothing to the step's time.

Here: everything of the D modules but their transformer layers, which estimate.stage_costs prices as
layers (layer_cost of ModelSpec.mtp_layer, with the strategy `mtp_layer_strategy` gives).
"""
from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

from ..plan import LayerStrategy, Plan
from ..specs.cluster import ClusterSpec
from ..specs.model import ModelSpec
from ..specs.training import TrainingSpec
from .communication import dp_cost_fields
from .embedding import PartCost, embedding_cost
from .flops import Gemm
from .kernel_rates import elementwise_bandwidth
from .memory import (FP32_BYTES, embedding_activation_bytes, kept_logit_bytes, logits_activation_bytes,
                     model_state_bytes, optimizer_temporary_bytes)
from .models import comm_model, compute_model

PER_TOKEN_BYTES = 8 + 8 + 1 + 4 + 4
"""Per token and depth, whole on every TP rank: the shifted ids the embedding keeps (int64), the cross
entropy's targets (int64) and target mask (bool), the shifted loss mask and the per-token MTP loss
MTPLossAutoScaler keeps (fp32 each); measured with the rest (tests/runtime/test_mtp_saved.py)."""

NO_MTP = PartCost(micro_batch_s=0.0, backward_s=0.0, tp_comm_s=0.0, dp_comm_per_iteration_s=0.0,
                  state_bytes=0.0, activation_bytes=0.0)


def mtp_layer_strategy(plan: Plan) -> LayerStrategy:
    """The strategy the MTP modules' transformer layers run with: the last layer's layout. Full
    recomputation reaches them only through --recompute-method uniform (every layer full, what
    megatron_flags writes then); the block method skips them (MultiTokenPredictionLayer._checkpointed_forward)."""
    last = plan.layer_strategies[-1]
    if last.recompute == "full" and any(s.recompute != "full" for s in plan.layer_strategies):
        return replace(last, recompute="none")
    return last


def mtp_parameters_beside_layers(model: ModelSpec, pipeline_parallel: int, standalone: bool = False) -> int:
    """Weights of the D modules outside their transformer layers (eh_proj and three norms each), plus
    the word embedding the MTP stage builds for itself when the embedding lives on another stage
    (GPTModel builds `embedding` wherever `pre_process or mtp_process`; MTP takes no learned positions)
    beside an untied output layer. Tied, that copy is the output layer's weight, which the LM head's
    part already holds (patches/mtp_tied_output_weight.py drops the unused second one). A chunk of their own
    (standalone, Plan.mtp_chunk) builds no output layer (GPTModel builds it where `post_process`): its
    embedding is a copy, tied or not."""
    per_module = model.mtp_module_parameters - model.mtp_layer.num_parameters
    untied = model.untie_embeddings_and_output_weights
    copy = model.embedding_parameters if standalone or (pipeline_parallel > 1 and untied) else 0
    return model.mtp_num_layers * per_module + copy


@lru_cache(maxsize=4096)
def mtp_cost(model: ModelSpec, strategy: LayerStrategy, samples: int, cluster: ClusterSpec,
             training: TrainingSpec, pipeline_parallel: int) -> PartCost:
    """The D modules beside their transformer layers, on one GPU of the last stage, per micro-batch of
    `samples` sequences; `strategy` is the embedding and LM head's (they share the output layer).
    `loss_bytes` holds the D fp32 softmaxes the cross entropies keep until the backward, alive beside the
    main loss's (`activation_bytes` is what the modules keep per micro-batch in flight)."""
    modules, heads = mtp_parts(model, strategy, samples, cluster, training, pipeline_parallel, standalone=False)
    return _joined(modules, heads)


@lru_cache(maxsize=4096)
def mtp_parts(model: ModelSpec, strategy: LayerStrategy, samples: int, cluster: ClusterSpec,
              training: TrainingSpec, pipeline_parallel: int, standalone: bool) -> tuple[PartCost, PartCost]:
    """(modules, heads): what the MTP chunk runs beside its transformer layers (the shifted tokens' embedding,
    enorm, hnorm, eh_proj and its TP traffic, their weights) and what the loss's chunk runs for the D depths
    (the shared output layer's GEMMs and the cross entropies, their kept softmaxes as `loss_bytes`). Without a
    layout both sit on the last stage; a standalone MTP chunk hands its (1 + D) x s hidden states to the loss's
    chunk, which computes every depth's logits (gpt_model.py: the MTP block runs where `mtp_process`, the output
    layer where `post_process`)."""
    depths = model.mtp_num_layers
    if depths == 0:
        return NO_MTP, NO_MTP
    parts = embedding_cost(model, strategy, samples, cluster, training, pipeline_parallel)
    forward, backward = _projection_times(model, strategy, samples, cluster, training.activation_bytes)
    comm = projection_comm_time(model, strategy, samples, cluster, training.activation_bytes)
    params = mtp_parameters_beside_layers(model, pipeline_parallel, standalone)
    embed, head = parts.embedding, parts.head
    modules = PartCost(
        micro_batch_s=depths * (embed.micro_batch_s + forward + backward + comm),
        backward_s=depths * (embed.backward_s + backward),
        tp_comm_s=depths * (embed.tp_comm_s + comm),
        **dp_cost_fields(params, strategy, cluster, training),
        state_bytes=model_state_bytes(params, strategy, training),
        activation_bytes=depths * mtp_kept_bytes(model, samples, strategy, training.activation_bytes,
                                                 cluster.dropout_mask_bytes),
        optimizer_temporary_bytes=optimizer_temporary_bytes(params, strategy, training),
    )
    heads = replace(NO_MTP, micro_batch_s=depths * head.micro_batch_s, backward_s=depths * head.backward_s,
                    tp_comm_s=depths * head.tp_comm_s,
                    loss_bytes=depths * logits_activation_bytes(model, samples, strategy,
                                                                kept_logit_bytes(training.cross_entropy_fusion,
                                                                                 training.activation_bytes)))
    return modules, heads


def _joined(one: PartCost, other: PartCost) -> PartCost:
    """Two parts on one stage as one: their times, bytes and traffic added."""
    return PartCost(**{name: getattr(one, name) + getattr(other, name) for name in PartCost.__dataclass_fields__})


def mtp_kept_bytes(model: ModelSpec, samples: int, strategy: LayerStrategy, word: int, mask_bytes: int) -> float:
    """What one depth keeps for its backward beside its transformer layer and its softmax: the shifted
    tokens' embedding and dropout mask (as the first stage's), hnorm's input, eh_proj's 2h-wide input
    (the concatenation; under SP its sequence shard, re-gathered in backward), the final norm's input,
    the depth's share of the (1 + D) x s hidden states the block concatenates for the output layer, and the
    three norms' fp32 statistics, all split over TP only under SP; the per-token integer and loss tensors
    (PER_TOKEN_BYTES, and at TP > 1 the vocab-parallel embedding's bool mask of ids outside its shard) and the
    token count (one fp32 scalar). Under SP the layer's input is a sequence slice of eh_proj's all-gathered
    output, a view (a dim-0 slice is contiguous, so mappings._split_along_first_dim copies nothing) that keeps
    the whole gathered tensor alive where the layer's formula counts its shard: (1 - 1/t) of it more."""
    s, b, h = model.seq_length, samples, model.hidden_size
    split = strategy.tp if strategy.sp else 1
    stats = 1 if model.mtp_layer.normalization == "RMSNorm" else 2
    hidden = (1 + 2 + 1 + 1) * word * s * b * h + 3 * stats * FP32_BYTES * s * b
    gathered_input = word * s * b * h * (1 - 1 / split)
    small = (PER_TOKEN_BYTES + (1 if strategy.tp > 1 else 0)) * s * b + FP32_BYTES
    return (embedding_activation_bytes(model, samples, strategy, word, mask_bytes) + hidden / split
            + gathered_input + small)


def projection_comm_time(model: ModelSpec, strategy: LayerStrategy, samples: int, cluster: ClusterSpec,
                         word: int) -> float:
    """One depth's TP traffic around eh_proj, forward plus backward (tensor_parallel/layers.py and
    mappings.py): without SP, the h/t outputs' all-gather and the 2h-wide input gradient's all-reduce;
    with SP, the 2h-wide input's all-gather (and its re-gather for the weight gradient, exposed as
    communication.tp_comm_time's are), the outputs' all-gather, and in backward the sequence split's
    all-gather and the input gradient's reduce-scatter."""
    t = strategy.tp
    if t == 1:
        return 0.0
    comm = comm_model(cluster)
    one = model.seq_length * samples * model.hidden_size * word

    def collective(op: str, bytes_: float) -> float:
        return comm.collective_time(op, bytes_, t, 1, cluster)

    if not strategy.sp:
        return collective("all_gather", one) + collective("all_reduce", 2 * one)
    wide_gather = collective("all_gather", 2 * one)
    return (wide_gather * (2 - comm.grad_overlap) + 2 * collective("all_gather", one)
            + collective("reduce_scatter", 2 * one))


def _projection_times(model: ModelSpec, strategy: LayerStrategy, samples: int, cluster: ClusterSpec,
                      word: int) -> tuple[float, float]:
    """(forward, backward) seconds of one depth's eh_proj GEMMs (tokens x 2h x h/t; backward twice the
    forward) and, on kernel-level clusters, its element-wise work: enorm and hnorm (read and write h,
    backward 3h, as cost/layer_kernels.head_memory_times prices the final norm) and the concatenation's
    copy (read and write 2h)."""
    tokens, h = model.seq_length * samples, model.hidden_size
    gemm = compute_model(cluster).gemm_time(Gemm(tokens, 2 * h, h // strategy.tp), cluster)
    if not cluster.compute.kernel_level or cluster.measured is not None:
        return gemm, 2 * gemm
    split = strategy.tp if strategy.sp else 1
    forward_bytes = (2 * 2 + 4) * tokens * h * word / split
    backward_bytes = 2 * 3 * tokens * h * word / split
    bandwidth = elementwise_bandwidth(cluster)
    return gemm + forward_bytes / bandwidth, 2 * gemm + backward_bytes / bandwidth
