"""Communication time of each parallel dimension, in seconds.

Rank order inside a stage is Megatron's: TP ranks are adjacent, DP ranks are
`tp` apart, pipeline stages are `world / pp` apart (Megatron-Core RankGenerator
order tp-cp-dp-pp), so each group's slowest link follows from its span.
"""
from __future__ import annotations

from ..plan import LayerStrategy
from ..specs.cluster import ClusterSpec
from ..specs.training import TrainingSpec
from .collectives import all_to_all_time
from .models import comm_model


def tp_comm_time(hidden: int, seq: int, samples: int, strategy: LayerStrategy,
                 cluster: ClusterSpec, activation_bytes: int) -> float:
    """TP traffic of one layer, one micro-batch, forward plus backward.

    Two all-reduces of the bsh activation in forward and two in backward
    (Narayanan et al. SC21, Sec. 3.3); SP swaps each for an all-gather plus a
    reduce-scatter of the same volume (Korthikanti et al., Sec. 4.2.2). Full
    recompute replays the forward's two. With SP, Megatron-Core keeps only the
    sequence shard of each column-parallel input and all-gathers it again in
    backward for the weight gradient (tensor_parallel/layers.py,
    LinearWithGradAccumulationAndAsyncCommunication.backward): two more
    all-gathers, issued async beside the input-gradient GEMM, so exposed by
    the share the overlap model cannot hide (1 - CommModel.grad_overlap).
    """
    t = strategy.tp
    if t == 1:
        return 0.0
    comm = comm_model(cluster)
    bytes_ = seq * samples * hidden * activation_bytes
    gather = comm.collective_time("all_gather", bytes_, t, 1, cluster)
    one = (gather + comm.collective_time("reduce_scatter", bytes_, t, 1, cluster)) if strategy.sp \
        else comm.collective_time("all_reduce", bytes_, t, 1, cluster)
    collectives = 4 + (2 if strategy.recompute == "full" else 0)
    regathers = 2 * gather * (1.0 - comm.grad_overlap) if strategy.sp else 0.0
    return collectives * one + regathers


def group_all_to_all_time(bytes_: float, group_size: int, stride: int, cluster: ClusterSpec) -> float:
    """An all-to-all over a group of `group_size` ranks `stride` apart (an EP group, a CP group), each rank holding
    `bytes_` (1/n per peer). NCCL sends to each peer over its own path at once, so across nodes the share for
    the peers in the rank's node crosses NVLink while the rest crosses the network, and the slower of the two
    sets the time. A group inside one node, or one that straddles nodes unevenly (ClusterSpec.link_for_group),
    is a plain all-to-all over its slowest link (collectives.all_to_all_time)."""
    link = cluster.link_for_group(group_size, stride)
    per_node = cluster.gpus_per_node // stride if cluster.gpus_per_node % stride == 0 else 0
    if link is cluster.intra_node or per_node < 1 or group_size % per_node:
        return all_to_all_time(bytes_, group_size, link)
    intra, inter = cluster.intra_node, cluster.inter_node
    local = (bytes_ * (per_node - 1) / group_size / intra.effective_bandwidth + intra.latency_s
             if per_node > 1 else 0.0)
    remote = bytes_ * (group_size - per_node) / group_size / inter.effective_bandwidth + inter.latency_s
    return max(local, remote)


def dp_comm_time(num_params: float, strategy: LayerStrategy, cluster: ClusterSpec,
                 training: TrainingSpec) -> float:
    """Once-per-iteration gradient traffic of ZeRO 0-2 for `num_params` weights (dp_comm_times)."""
    return dp_comm_times(num_params, strategy, cluster, training)[0]


def dp_comm_times(num_params: float, strategy: LayerStrategy, cluster: ClusterSpec,
                  training: TrainingSpec) -> tuple[float, float]:
    """(all of it, the weight all-gather's share) of the once-per-iteration gradient traffic of ZeRO 0-2 for
    `num_params` weights.

    ZeRO 0: all-reduce of the gradients; ZeRO 1-2 (Megatron's distributed
    optimizer): reduce-scatter of the gradients and all-gather of the updated
    weights. Gradients travel in their own type (Megatron-LM reduces in fp32
    under bf16: arguments.py, "bfloat16 requires gradient accumulation and
    all-reduce to be done in fp32"); weights in theirs. ZeRO 3 pays per micro-batch.
    With --overlap-param-gather Megatron-Core's DDP runs the all-gather beside the next iteration's forward,
    bucket by bucket, each module's forward pre-hook waiting for its own bucket and dispatching the next
    (distributed/distributed_data_parallel.py, _make_forward_pre_hook; param_and_grad_buffer.py,
    finish_param_sync), where the reduce-scatter runs beside the backward: hence its share apart.
    """
    d = strategy.dp
    if d == 1 or strategy.zero >= 3:
        return 0.0, 0.0
    comm, tp = comm_model(cluster), strategy.tp
    local = num_params / tp
    if strategy.zero == 0:
        return comm.collective_time("all_reduce", local * training.grad_bytes, d, tp, cluster), 0.0
    gather = comm.collective_time("all_gather", local * training.param_bytes, d, tp, cluster)
    return comm.collective_time("reduce_scatter", local * training.grad_bytes, d, tp, cluster) + gather, gather


def dp_cost_fields(num_params: float, strategy: LayerStrategy, cluster: ClusterSpec,
                   training: TrainingSpec) -> dict:
    """The data-parallel fields of a layer's, experts' or part's cost record: dp_comm_times as
    dp_comm_per_iteration_s and dp_gather_per_iteration_s."""
    total, gather = dp_comm_times(num_params, strategy, cluster, training)
    return dict(dp_comm_per_iteration_s=total, dp_gather_per_iteration_s=gather)


def zero3_comm_time(num_params: float, strategy: LayerStrategy, cluster: ClusterSpec,
                    training: TrainingSpec, recompute_full: bool) -> float:
    """Per-micro-batch ZeRO-3 traffic: all-gather the weights for forward and again for
    backward (and for the recompute pass), reduce-scatter the gradients
    (Rajbhandari et al. 2020, Sec. 7.2.2: 1.5x the all-reduce volume)."""
    d = strategy.dp
    if d == 1 or strategy.zero < 3:
        return 0.0
    comm, tp = comm_model(cluster), strategy.tp
    bytes_ = num_params / tp * training.param_bytes
    gathers = 3 if recompute_full else 2
    return (gathers * comm.collective_time("all_gather", bytes_, d, tp, cluster)
            + comm.collective_time("reduce_scatter", bytes_, d, tp, cluster))


def transition_time(before: LayerStrategy, after: LayerStrategy, hidden: int, seq: int,
                    micro_batch_samples: int, cluster: ClusterSpec, activation_bytes: int) -> float:
    """Redistributing one micro-batch's activations between two layouts, forward plus backward.

    What runtime/hybrid/relayout.py does: an SP layout first all-gathers the
    sequence over its TP group (backward: a slice), the batch is re-split over
    the dp_max / dp_min ranks that hold one coarse chunk (to more DP a slice,
    backward an all-gather; to less DP an all-gather, backward a slice), and an
    SP target slices its sequence shard (backward: an all-gather over its TP
    group). Each all-gather moves the narrower side's full-sequence activation.
    """
    if (before.tp, before.dp, before.sp) == (after.tp, after.dp, after.sp):
        return 0.0
    bytes_per_sample = seq * hidden * activation_bytes
    model = comm_model(cluster)
    time = 0.0
    for side in (before, after):
        if side.sp:
            samples = micro_batch_samples // side.dp
            time += model.collective_time("all_gather", bytes_per_sample * samples, side.tp, 1, cluster)
    lo, hi = sorted((before.dp, after.dp))
    if lo != hi:
        time += model.collective_time("all_gather", bytes_per_sample * (micro_batch_samples // lo), hi // lo,
                                      min(before.tp, after.tp), cluster)
    return time


def pipeline_p2p_time(hidden: int, seq: int, micro_batch_samples: int, gpus_per_stage: int,
                      pipeline_parallel: int, cluster: ClusterSpec, activation_bytes: int) -> float:
    """One stage boundary, one micro-batch: activation forward plus gradient backward.

    Each GPU of the sender holds b/dp samples split 1/t over TP (SC21's
    scatter/gather optimisation; Megatron-Core sends SP-sharded tensors), so each
    sends 1/n of the micro-batch's bsh activation whatever its layout.
    """
    if pipeline_parallel == 1:
        return 0.0
    # With more than one node some stage boundary crosses nodes, and the
    # steady state runs at the pace of the slowest boundary.
    bytes_ = seq * micro_batch_samples * hidden * activation_bytes / gpus_per_stage
    return 2 * comm_model(cluster).p2p_time(bytes_, cluster.num_nodes > 1, cluster)
