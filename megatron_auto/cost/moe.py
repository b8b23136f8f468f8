"""The routed experts of a MoE layer under a LayerStrategy with ep/etp.

What runs is Megatron-Core 0.16.1's MoELayer (megatron/core/transformer/moe/): the TopKRouter, a token
dispatcher (token_dispatcher.py) and the experts (experts.py: SequentialMLP, one GEMM per local expert, or
a grouped GEMM with --moe-grouped-gemm). The attention, norms, router weights and shared expert form the
layer's dense part, priced as a dense layer whose MLP is the shared expert (cost/layer_cost.py).

Ranks: Megatron-Core orders a stage's tp*dp ranks for the experts as etp-ep-edp (parallel_state.py, the
expert RankGenerator), so an expert-TP group is etp adjacent ranks, an EP group's ranks are etp apart and
an expert-DP group's ep*etp apart. With TP, MoELayer requires SP: each rank routes its own 1/tp of the
sequence, so every rank of an EP x ETP block starts from distinct tokens.

Token counts: with top-k routing each rank sends k copies of each of its T tokens; balanced, an EP rank
(E/ep experts) receives 1/ep of the k x T copies of each of its ep senders, k x T in all, and its ETP group
all-gathers them: k x T x etp per GPU (Megatron-Core MoE docs, "expert parallelism"; Gale et al. 2023,
MegaBlocks, arXiv 2211.15841, Sec. 2). The busiest rank gets TrainingSpec.moe_load_imbalance times the mean,
and sets the pace of the experts and of the dispatch (docs/cost_model.md, "MoE").
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from ..plan import LayerStrategy
from ..serde import memoised_on
from ..specs.cluster import ClusterSpec
from ..specs.model import LayerSpec
from ..specs.training import TrainingSpec
from .communication import dp_cost_fields, group_all_to_all_time, zero3_comm_time
from .cuda_graphs import graphs_apply, routed_side_graphed
from .flex_dispatch import flex_all_to_all_time
from .flops import Gemm
from .fp8 import CAST_BYTES, fp8_gemm_time, fp8_weight_copy_bytes
from .kernel_rates import elementwise_bandwidth, gemm_compute_time
from .layer_kernels import MAIN_GRAD_BYTES
from .memory import FP32_BYTES, mlp_saved_width, model_state_bytes, optimizer_temporary_bytes, zero3_gathered_bytes
from .models import comm_model

INDEX_BYTES = 8  # the router's top-k indices and the permutation's sorted indices are int64


@dataclass(frozen=True)
class ExpertCost:
    """The routed experts of one MoE layer on one GPU. Times per micro-batch unless named per iteration."""

    forward_s: float
    """Router GEMM, expert GEMMs and the permutation and activation passes, forward."""
    backward_s: float
    """The same, backward (2x the GEMMs: dgrad and wgrad), and the expert weight-gradient accumulation."""
    recompute_s: float
    """The second forward of the router and experts under full recompute or selective `moe`."""
    comm_s: float
    """Dispatch and combine (all-to-all, or all-gather and reduce-scatter) and expert-TP collectives."""
    zero3_s: float
    """ZeRO-3 gathers and scatters of the expert weights (before overlap)."""
    dp_comm_per_iteration_s: float
    """Expert gradient (and ZeRO-1/2 weight) traffic over the expert-DP group, once per iteration."""
    dp_gather_per_iteration_s: float
    """Of it, the ZeRO-1/2 weight all-gather, beside the forward (communication.dp_comm_times)."""
    state_bytes: float
    """Expert weights, gradients and optimizer states on this GPU."""
    activation_bytes: float
    """Dispatched tokens and expert activations kept per micro-batch."""
    rematerialised_bytes: float
    """What recomputation brings back while the layer runs its backward (and ZeRO-3's gathered experts)."""
    optimizer_temporary_bytes: float
    """The optimizer step's temporaries over this GPU's expert shard."""


@lru_cache(maxsize=4096)
def expert_view(strategy: LayerStrategy) -> LayerStrategy:
    """The experts' weights laid out as a dense layer's: split ep*etp ways (adjacent ranks), replicated
    over the expert-DP group with the layer's ZeRO level (Megatron's distributed optimizer shards the
    expert states over expert DP: distributed optimizer over the expert data-parallel group)."""
    return LayerStrategy(tp=strategy.ep * strategy.expert_tp, dp=strategy.expert_dp, zero=strategy.zero)


def local_tokens(seq: int, samples: int, strategy: LayerStrategy) -> float:
    """Tokens entering the MoE layer on one GPU: b x s, of which 1/tp under SP."""
    return seq * samples / (strategy.tp if strategy.sp else 1)


def expert_tokens(layer: LayerSpec, seq: int, samples: int, strategy: LayerStrategy, imbalance: float) -> float:
    """Token copies the busiest GPU's experts process per micro-batch: k x T x etp x imbalance."""
    return layer.moe.router_topk * local_tokens(seq, samples, strategy) * strategy.expert_tp * imbalance


def expert_gemms(layer: LayerSpec, tokens: float, strategy: LayerStrategy) -> tuple[Gemm, Gemm]:
    """fc1 and fc2 of the E/ep local experts, each on its share of `tokens`, split etp ways
    (column- then row-parallel, as the dense MLP under TP)."""
    local = layer.moe.num_experts // strategy.ep
    f = layer.moe.expert_ffn_hidden_size / strategy.expert_tp
    m = tokens / local
    return (Gemm(m, layer.hidden_size, f * (2 if layer.swiglu else 1), batch=local),
            Gemm(m, f, layer.hidden_size, batch=local))


def router_gemm(layer: LayerSpec, seq: int, samples: int, strategy: LayerStrategy) -> Gemm:
    """The router's logits: T x h @ h x E (the router is not split by TP)."""
    return Gemm(local_tokens(seq, samples, strategy), layer.hidden_size, layer.moe.num_experts)


def expert_gemm_time(gemms: tuple[Gemm, ...], grouped: bool, cluster: ClusterSpec, fp8: bool = False) -> float:
    """Forward seconds of the expert GEMMs: one kernel per local expert (SequentialMLP), each at least the
    GEMM law's latency_s, or one grouped kernel (--moe-grouped-gemm) for all of them; under FP8 at its rates
    (TE's grouped linear layers run FP8 like the dense ones: cost/fp8.py)."""
    time_of = fp8_gemm_time if fp8 else gemm_compute_time
    total = 0.0
    for gemm in gemms:
        kernels = 1 if grouped else gemm.batch
        one = time_of(gemm, cluster) / kernels
        total += kernels * max(cluster.compute.latency_s, one)
    return total


def expert_memory_bytes(layer: LayerSpec, seq: int, samples: int, strategy: LayerStrategy, word: int,
                        imbalance: float) -> tuple[float, float]:
    """(forward, backward) bytes of the memory-bound passes beside the GEMMs.

    Source side, per routed copy (k x T): permute before dispatch (read + write h, moe_utils.permute's
    index_select) and the unpermute's scatter-add (read + write h). Expert side, per copy it processes
    (expert_tokens): the sort by local expert and its inverse (read + write h each,
    moe_utils.sort_chunks_by_idxs), the activation as the dense MLP's (cost/layer_kernels.py: 5f SwiGLU or 2f
    GeLU forward, 5f or 3f backward, over the f/etp shard) and the routing-probability scaling of its output,
    which SequentialMLP passes to MLP.forward as per_token_scale (read + write f; backward the input's
    gradient, read + write f, and the probability's, two reads of f). Router: softmax and top-k over the
    T x E fp32 logits (three passes). Gradients of permutations are permutations: backward moves the same
    h-wide bytes. The expert weight gradients are added into their fp32 main_grad (read new, read+write old).
    """
    tokens = local_tokens(seq, samples, strategy)
    copies = layer.moe.router_topk * tokens
    processed = expert_tokens(layer, seq, samples, strategy, imbalance)
    f = layer.moe.expert_ffn_hidden_size / strategy.expert_tp
    h = layer.hidden_size
    router = 3 * FP32_BYTES * tokens * layer.moe.num_experts
    moved = word * (4 * h * copies + 4 * h * processed)
    forward = moved + word * processed * ((5 if layer.swiglu else 2) + 2) * f + router
    backward = moved + word * processed * ((5 if layer.swiglu else 3) + 4) * f + router
    grads = layer.expert_parameters / (strategy.ep * strategy.expert_tp) * (word + 2 * MAIN_GRAD_BYTES)
    return forward, backward + grads


def expert_compute_times(layer: LayerSpec, seq: int, samples: int, strategy: LayerStrategy,
                         cluster: ClusterSpec, training: TrainingSpec) -> tuple[float, float]:
    """(forward, backward) seconds of the router and the experts on the busiest GPU: GEMMs by the GEMM law
    (cost/kernel_rates.py), backward 2x the forward GEMMs (dgrad + wgrad, SC21 Sec. 5.1), and the memory-bound
    passes at ELEMENTWISE_BANDWIDTH_FRACTION of HBM bandwidth (cost/kernel_rates.py)."""
    tokens = expert_tokens(layer, seq, samples, strategy, training.moe_load_imbalance)
    gemms = expert_gemm_time(expert_gemms(layer, tokens, strategy), training.moe_grouped_gemm, cluster, training.fp8)
    gemms += gemm_compute_time(router_gemm(layer, seq, samples, strategy), cluster)
    forward_bytes, backward_bytes = expert_memory_bytes(layer, seq, samples, strategy, training.activation_bytes,
                                                        training.moe_load_imbalance)
    if training.fp8:
        forward_cast, backward_cast = expert_cast_bytes(layer, tokens, strategy)
        forward_bytes, backward_bytes = forward_bytes + forward_cast, backward_bytes + backward_cast
    if training.moe_grouped_gemm and layer.add_bias_linear:
        forward_bias, backward_bias = grouped_fc2_bias_bytes(layer, tokens, training.activation_bytes)
        forward_bytes, backward_bytes = forward_bytes + forward_bias, backward_bytes + backward_bias
    bandwidth = elementwise_bandwidth(cluster)
    floor_forward, floor_backward = expert_host_seconds(layer, strategy, cluster, training)
    return (max(floor_forward, gemms + forward_bytes / bandwidth),
            max(floor_backward, 2 * gemms + backward_bytes / bandwidth))


HOST_OPS_ROUTED = {"alltoall": (51, 11, 35, 20), "allgather": (42, 11, 29, 17)}
"""Aten ops of a MoE layer's routed side (router, dispatch, experts, combine) per pass on Megatron-Core 0.16.1's
local spec with SequentialMLP, by dispatcher: (forward, forward per local expert, backward, backward per local
expert), counted with a TorchDispatchMode (`.venv/bin/python -m validation.count_moe_host_ops`; the shared expert
is the dense part's MLP, under its own floor). The backward counts include the gradient's ones_like, as
HOST_OPS_BACKWARD does. Counted at EP1; an EP group adds its few collectives."""
HOST_OPS_GROUPED_FC2_BIAS = (5, 2, 6, 7)
"""The same four numbers for TEGroupedMLP._apply_bias (grouped_fc2_bias_bytes), counted alike."""
HOST_OPS_ROUTER = (17, 16)
"""(forward, backward) of those ops that are the router's (TopKRouter: gating, top-k, probabilities)."""
HOST_OPS_PREPROCESS = {"alltoall": 14, "allgather": 1}
"""Forward ops of the dispatcher's preprocess (token counts and splits; no backward), by dispatcher."""


def expert_host_ops(layer: LayerSpec, strategy: LayerStrategy, training: TrainingSpec) -> tuple[int, int]:
    """(forward, backward) host ops of the routed side on one GPU (HOST_OPS_ROUTED): SequentialMLP's ops repeat
    for each of the E/ep local experts; a grouped GEMM runs all of them as one expert's. The flex dispatcher is
    counted as alltoall, the Python it shares (_counted_dispatcher). The fc2 bias of grouped experts adds its
    per-expert ops."""
    local = layer.moe.num_experts // strategy.ep
    forward, per_forward, backward, per_backward = HOST_OPS_ROUTED[_counted_dispatcher(training)]
    kernels = 1 if training.moe_grouped_gemm else local
    captured_forward, captured_backward = _graphed_routed_ops(strategy, training)
    forward = forward + per_forward * kernels - captured_forward
    backward = backward + per_backward * kernels - captured_backward
    if training.moe_grouped_gemm and layer.add_bias_linear:
        bias_forward, bias_per_forward, bias_backward, bias_per_backward = HOST_OPS_GROUPED_FC2_BIAS
        forward += bias_forward + bias_per_forward * local
        backward += bias_backward + bias_per_backward * local
    return forward, backward


def _graphed_routed_ops(strategy: LayerStrategy, training: TrainingSpec) -> tuple[int, int]:
    """(forward, backward) routed-side ops that the graphs of the `moe_router` and `moe_preprocess` scopes replay
    with one launch each (the router forward and backward; the preprocess, forward only) and so take off the host
    (cost/cuda_graphs.py)."""
    if not graphs_apply(strategy, training):
        return 0, 0
    scopes = training.cuda_graph_scope
    forward, backward = 0, 0
    if "moe_router" in scopes:
        forward, backward = HOST_OPS_ROUTER[0] - 1, HOST_OPS_ROUTER[1] - 1
        if "moe_preprocess" in scopes:
            forward += HOST_OPS_PREPROCESS[_counted_dispatcher(training)] - 1
    return forward, backward


def _counted_dispatcher(training: TrainingSpec) -> str:
    """The dispatcher whose counts stand for training's: allgather's own, alltoall's for alltoall and flex."""
    return "allgather" if training.moe_token_dispatcher == "allgather" else "alltoall"


def expert_host_seconds(layer: LayerSpec, strategy: LayerStrategy, cluster: ClusterSpec,
                        training: TrainingSpec) -> tuple[float, float]:
    """(forward, backward) floor of the routed side: its host ops x GpuSpec.kernel_launch_s, as the dense part's
    (cost/layer_kernels.py); none where the cluster has no host term or a CUDA graph captures the routed side
    (full_iteration, or the `moe` scope: cost/cuda_graphs.py)."""
    launch = cluster.gpu.kernel_launch_s
    if launch <= 0 or routed_side_graphed(strategy, training):
        return 0.0, 0.0
    forward, backward = expert_host_ops(layer, strategy, training)
    return forward * launch, backward * launch


GROUPED_FC2_BIAS_WORDS = (6, 8)
"""(forward, backward) h-wide words per processed copy of TEGroupedMLP._apply_bias (grouped_fc2_bias_bytes)."""


def grouped_fc2_bias_bytes(layer: LayerSpec, tokens: float, word: int) -> tuple[float, float]:
    """(forward, backward) bytes of the experts' fc2 bias under --moe-grouped-gemm with linear biases (GPT-OSS).

    Transformer Engine's grouped fc2 hands its biases back (skip_bias_add) and Megatron-Core's
    TEGroupedMLP._apply_bias adds them expert by expert, each scaled by the routing probability: per expert
    `t + b * p` over its slice of the output, then one torch.cat (experts.py; added with GPT-OSS's expert biases
    in a329dd6, 2025-09-22, and the only path until the packed bias of 883533e, 2026-08-14). Per processed copy,
    forward: the product written (h), the sum read twice and written (3h), the cat read and written (2h).
    Backward: each broadcast factor's gradient is a product of the output gradient (read + write h) and a
    reduction of it (read h), for b and for p, and the split's gradient is concatenated (read + write h).
    Probabilities in the activations' type (the router's default); an fp32 router would promote the pass.
    Its 2 E/ep small ops forward and 7 E/ep backward are on the host's count (HOST_OPS_GROUPED_FC2_BIAS)."""
    forward, backward = GROUPED_FC2_BIAS_WORDS
    per_copy = word * tokens * layer.hidden_size
    return forward * per_copy, backward * per_copy


def expert_cast_bytes(layer: LayerSpec, tokens: float, strategy: LayerStrategy) -> tuple[float, float]:
    """(forward, backward) bytes of casting the expert GEMMs' inputs and output gradients to FP8 with their
    transposes (cost/fp8.py CAST_BYTES): per processed token the fc1 input h and fc2 input f/etp forward, the
    fc1 output gradient (2)f/etp and the fc2 output gradient h backward."""
    f = layer.moe.expert_ffn_hidden_size / strategy.expert_tp
    fc1_out = f * (2 if layer.swiglu else 1)
    return tokens * CAST_BYTES * (layer.hidden_size + f), tokens * CAST_BYTES * (fc1_out + layer.hidden_size)


def dispatch_time(layer: LayerSpec, seq: int, samples: int, strategy: LayerStrategy, cluster: ClusterSpec,
                  training: TrainingSpec) -> float:
    """One pass (forward, or backward) of token dispatch and combine.

    alltoall (MoEAlltoAllTokenDispatcher): an all-to-all of the k x T routed copies over the EP group (ranks
    etp apart), then an all-gather over the expert-TP group; combine: a reduce-scatter over expert TP and
    the all-to-all back. The busiest receiver gets imbalance x the mean. flex (DeepEP, HybridEP): the same,
    with each token crossing the network once per node it reaches (cost/flex_dispatch.py). allgather
    (MoEAllGatherTokenDispatcher): all-gather of all tokens over the tp_ep group (ep*etp adjacent ranks),
    and a reduce-scatter of the same size to combine. The backward pass mirrors the forward's collectives.
    Routing probabilities and maps (k or E numbers per token against h) are left out.
    """
    word, h, comm = training.activation_bytes, layer.hidden_size, comm_model(cluster)
    tokens = local_tokens(seq, samples, strategy)
    if training.moe_token_dispatcher == "allgather":
        group = strategy.ep * strategy.expert_tp
        gathered = group * tokens * h * word
        return (comm.collective_time("all_gather", gathered, group, 1, cluster)
                + comm.collective_time("reduce_scatter", gathered, group, 1, cluster))
    received = layer.moe.router_topk * tokens * h * word * training.moe_load_imbalance
    if training.moe_token_dispatcher == "flex":
        a2a = flex_all_to_all_time(received / layer.moe.router_topk, layer.moe, strategy.ep, strategy.expert_tp,
                                   cluster)
    else:
        a2a = group_all_to_all_time(received, strategy.ep, strategy.expert_tp, cluster)
    etp, gathered = strategy.expert_tp, strategy.expert_tp * received
    expert_tp = (comm.collective_time("all_gather", gathered, etp, 1, cluster)
                 + comm.collective_time("reduce_scatter", gathered, etp, 1, cluster))
    return 2 * a2a + expert_tp


def expert_activation_bytes(layer: LayerSpec, seq: int, samples: int, strategy: LayerStrategy,
                            training: TrainingSpec, recomputed: bool) -> float:
    """Bytes the router and the experts keep for backward per micro-batch on the busiest GPU (none when
    `recomputed`, by full recompute or selective `moe`: the layer's input, counted in its dense part, is all
    the checkpoint keeps).

    Per processed copy: the expert's fc1 input (the dispatched token, h), its fp32-or-activation-typed
    routing probability, and the expert MLP's inner activations over the f/etp shard: the dense MLP's
    (mlp_saved_width) plus the probability-scaled activation that is fc2's input (SequentialMLP passes the
    probabilities to MLP.forward as per_token_scale): 5f with SwiGLU, 3f with GeLU. Per routed copy on the
    source side: the top-k index (int64) and its probability; per token and expert: the routing map (bool)
    and the probabilities scattered over it. The allgather dispatcher permutes the tokens it gathered over
    the ep x etp block for its E/ep local experts instead: it keeps the permutation's sorted index (int64)
    per processed copy, where alltoall keeps it per routed copy, and the gathered map and probabilities for
    its local experts, (ep etp T) x (E/ep), that is etp times the source's. Measured exactly on the runtime's
    layer in fp32 at EP1 and, on the busiest rank, at EP2, at expert-TP 2 and at TP2 with SP, with either
    dispatcher (tests/runtime/test_recompute_modules.py).
    """
    if recomputed:
        return 0.0
    word, h = training.activation_bytes, layer.hidden_size
    processed = expert_tokens(layer, seq, samples, strategy, training.moe_load_imbalance)
    f = layer.moe.expert_ffn_hidden_size / strategy.expert_tp
    inner = expert_saved_width(layer.swiglu, training.bias_activation_fusion) * f
    # In FP8, TE's grouped linear layers keep their inputs (fc1's h, fc2's f) as FP8 copies, 1 byte each.
    fp8_saved = (word - 1) * processed * (h + f) if training.fp8 else 0.0
    if activation_recomputed(layer, strategy, training):
        # The activation's checkpoint keeps its input, fc1's output, and discards what it computes: fc2's input
        # is re-made in backward (experts.py, CheckpointWithoutOutput); in FP8, fc2's own FP8 copy stays.
        inner = (2 if layer.swiglu else 1) * f
        fp8_saved = (word - 1) * processed * h - processed * f if training.fp8 else 0.0
    tokens = local_tokens(seq, samples, strategy)
    k, experts = layer.moe.router_topk, layer.moe.num_experts
    allgather = training.moe_token_dispatcher == "allgather"
    sorted_index = INDEX_BYTES * (processed if allgather else k * tokens)
    map_columns = experts * (strategy.expert_tp if allgather else 1)
    source = tokens * (k * (INDEX_BYTES + word) + map_columns * (1 + word)) + sorted_index
    return word * processed * (h + inner + 1) + source - fp8_saved


def activation_recomputed(layer: LayerSpec, strategy: LayerStrategy, training: TrainingSpec) -> bool:
    """Whether the backward re-runs the experts' activation alone: selective recompute with moe_act."""
    return strategy.recompute == "selective" and "moe_act" in training.selective_modules(layer)


def activation_recompute_seconds(layer: LayerSpec, seq: int, samples: int, strategy: LayerStrategy,
                                 cluster: ClusterSpec, training: TrainingSpec) -> float:
    """The experts' activation run again in backward under selective moe_act: the activation pass of the
    forward's memory-bound bytes (expert_memory_bytes: (5 with SwiGLU, else 2) f per processed copy)."""
    if not activation_recomputed(layer, strategy, training):
        return 0.0
    processed = expert_tokens(layer, seq, samples, strategy, training.moe_load_imbalance)
    f = layer.moe.expert_ffn_hidden_size / strategy.expert_tp
    return training.activation_bytes * processed * (5 if layer.swiglu else 2) * f / elementwise_bandwidth(cluster)


def expert_saved_width(swiglu: bool, bias_activation_fusion: bool) -> int:
    """An expert's inner activations per processed copy in units of its ffn width: the dense MLP's plus the
    probability-scaled fc2 input; fused, megatron-core's weighted_bias_swiglu applies the probabilities inside
    the kernel that keeps only its 2f input (experts.py), so fc2's f input is all that follows: 3f."""
    if swiglu and bias_activation_fusion:
        return 3
    return mlp_saved_width(swiglu) + 1


def _fp8_expert_weight_copies(params: float, view: LayerStrategy, training: TrainingSpec) -> float:
    """TE's FP8 copy and transpose of this GPU's expert weights, as of the dense layers' (cost/fp8.py)."""
    return fp8_weight_copy_bytes(params, view.tp, training.fp8_param_gather) if training.fp8 else 0.0


def experts_recomputed(layer: LayerSpec, strategy: LayerStrategy, training: TrainingSpec) -> bool:
    """Whether the backward re-runs the router and experts: full recompute, or selective with `moe`."""
    return strategy.recompute == "full" or (strategy.recompute == "selective"
                                            and "moe" in training.selective_modules(layer))


@memoised_on(lambda layer, strategy, samples, seq, cluster, training:
             (layer, samples, seq, cluster, training, strategy.per_micro_batch_key), 1 << 16)
def _per_micro_batch_terms(layer: LayerSpec, strategy: LayerStrategy, samples: int, seq: int, cluster: ClusterSpec,
                           training: TrainingSpec) -> tuple[float, ...]:
    """(forward, backward, recompute and dispatch seconds, activation bytes kept, and kept without recomputation)
    of expert_cost, memoised on LayerStrategy.per_micro_batch_key: one pricing serves every pipeline depth a search
    weighs at one (tp, ep, etp) (issue 37: a third of DeepSeek-V3's expert costs)."""
    forward, backward = expert_compute_times(layer, seq, samples, strategy, cluster, training)
    replayed = experts_recomputed(layer, strategy, training)
    recompute = forward if replayed else activation_recompute_seconds(layer, seq, samples, strategy, cluster, training)
    return (forward, backward, recompute,
            (3 if replayed else 2) * dispatch_time(layer, seq, samples, strategy, cluster, training),
            expert_activation_bytes(layer, seq, samples, strategy, training, replayed),
            expert_activation_bytes(layer, seq, samples, strategy, training, False))


def expert_cost(layer: LayerSpec, strategy: LayerStrategy, samples: int, seq: int, cluster: ClusterSpec,
                training: TrainingSpec) -> ExpertCost:
    """All expert terms of one MoE layer on one GPU. Full recompute, and selective recompute of `moe`,
    replay the router, dispatch, experts and combine in backward (a third dispatch pass, and under ZeRO-3 a
    third gather of the expert weights); other selective modules leave the experts alone."""
    forward, backward, recompute, comm, kept, kept_without = _per_micro_batch_terms(layer, strategy, samples, seq,
                                                                                     cluster, training)
    replayed = experts_recomputed(layer, strategy, training)
    view, params = expert_view(strategy), layer.expert_parameters
    return ExpertCost(
        forward_s=forward,
        backward_s=backward,
        recompute_s=recompute,
        comm_s=comm,
        zero3_s=zero3_comm_time(params, view, cluster, training, replayed),
        **dp_cost_fields(params, view, cluster, training),
        state_bytes=model_state_bytes(params, view, training) + _fp8_expert_weight_copies(params, view, training),
        activation_bytes=kept,
        rematerialised_bytes=kept_without - kept + zero3_gathered_bytes(params, view, training),
        optimizer_temporary_bytes=optimizer_temporary_bytes(params, view, training),
    )
