"""estimate_plan: the cost model's prediction for a whole Plan."""
from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import UserError
from ..plan import (Chunk, LayerStrategy, Plan, Prediction, TimeBreakdown, check_expert_strategy,
                    context_parallel_problem)
from ..specs.cluster import ClusterSpec
from ..specs.model import ModelSpec
from ..specs.training import FLEX_BACKEND_SMS, GIB, TrainingSpec
from .comm_interference import interference_share
from .communication import pipeline_p2p_time, transition_time
from .context_parallel import cp_comm_problem, gradient_strategy, local_model
from .embedding import EmbeddingCost, PartCost, embedding_cost
from .flops import model_flops_per_iteration
from .fp8 import fp8_problem
from .layer_cost import LayerCost, layer_cost
from .ep_overlap import ep_overlap_runs
from .activation_offload import offload_flags
from .cuda_graphs import cuda_graph_flags
from .memory import in_flight_micro_batches, tied_embedding_grad_bytes
from .peak_memory import (StageMemory, communicator_count, device_budget_bytes, device_bytes, memory_breakdown,
                          reserved_bytes)
from .models import comm_model, compute_model, core_share, profiled_cpu_cores, runtime_overhead
from .mtp import NO_MTP, mtp_cost, mtp_layer_strategy, mtp_parts
from .pipeline import (bubble_time, chunked_pipeline_time, exposed_dp_split, exposed_dp_time, exposed_p2p_time,
                       pipeline_time, warmup_chunk_forwards)
from .timeslice import StageLoad, simulate_iteration

__all__ = ["estimate_plan", "model_flops_per_iteration", "StageCost", "stage_costs"]


@dataclass
class StageCost:
    """Sums over one pipeline stage's chunks, per micro-batch unless noted."""

    micro_batch_s: float = 0.0
    compute_s: float = 0.0
    backward_s: float = 0.0
    """The part of compute_s that runs in the backward pass (recompute_s not included)."""
    recompute_s: float = 0.0
    tp_comm_s: float = 0.0
    ep_comm_s: float = 0.0
    """MoE layers' token dispatch and combine and expert-TP collectives (cost/moe.py)."""
    cp_comm_s: float = 0.0
    """Context parallelism's K/V exchange (cost/context_parallel.py)."""
    pp_comm_s: float = 0.0
    chain_p2p_s: float = 0.0
    """Per iteration: the p2p latency the interleaved schedule's fill and drain wait on (interleaved_chain_p2p)."""
    transition_s: float = 0.0
    exposed_dp_s: float = 0.0
    """Per iteration: gradient traffic not hidden behind the last micro-batch's backward."""
    ep_hidden_s: float = 0.0
    """Per micro-batch: dispatch time EP overlap hides in merged steps (LayerCost.ep_hidden_s)."""
    exposed_ep_s: float = 0.0
    """Per iteration: that time shown again by the steps that run unmerged (unmerged_ep_seconds)."""
    optimizer_s: float = 0.0
    """Per iteration: the Adam step over this stage's model states."""
    runtime_s: float = 0.0
    """The runtime's own work per micro-batch (cost.models.runtime_overhead, per chunk)."""
    step_overhead_s: float = 0.0
    """Per iteration: the runtime's own per-step work (cost.models.runtime_overhead)."""
    state_bytes: float = 0.0
    activation_bytes: float = 0.0
    largest_layer_activation_bytes: float = 0.0
    """What the stage's largest layer keeps per micro-batch (the combined 1F1B schedule's merged step holds one
    such layer more: stage_memory)."""
    transient_bytes: float = 0.0
    workspace_bytes: float = 0.0
    """Run-long kernel buffers (max over the stage's layers: one per process)."""
    optimizer_temporary_bytes: float = 0.0
    """The optimizer step's temporaries over the stage's weights."""
    units: int = 0
    """Layers (and embedding/head parts) added so far."""
    parts: EmbeddingCost | None = None
    """The plan's embedding and LM-head costs (for the memory of the first and last stages)."""
    mtp: PartCost = NO_MTP
    """The multi-token prediction modules beside their layers (cost/mtp.py), on their stage (Plan.mtp_stage)."""
    mtp_heads: PartCost = NO_MTP
    """The depths' logits and cross entropies on the loss's stage when MTP has a chunk of its own (mtp_parts);
    without one they are in `mtp`."""
    grad_overlap: float = 1.0
    """Share of the gradient traffic's overlap window that is really hidden (cost.models.CommModel)."""
    interference: float = 0.0
    """Share of the hidden gradient traffic's time the compute beside it loses (cost/comm_interference.py)."""
    sync_window_micro_batches: int = 1
    """How many micro-batches' backward a layer's gradient traffic overlaps (dp_sync_window)."""
    sync_unhidden: bool = False
    """Whether the units being added sync last, with no backward left to hide behind (dp_sync_window)."""
    chunk_s: list[float] = field(default_factory=list)
    """Per micro-batch, what each of the stage's chunks adds to micro_batch_s, in chunk order: its layers,
    relayouts, runtime work and p2p, the embedding on the first stage's first chunk, the LM head (and MTP) on
    the last chunk (interleaved_iteration prices unequal chunks with them)."""

    def add_layer(self, cost: LayerCost, count: int = 1) -> None:
        """Add `count` consecutive layers of identical cost."""
        self.micro_batch_s += count * cost.micro_batch_s
        self.compute_s += count * (cost.forward_s + cost.backward_s + cost.zero3_exposed_s)
        self.backward_s += count * cost.backward_s
        self.recompute_s += count * cost.recompute_s
        self.tp_comm_s += count * cost.tp_comm_s
        self.ep_comm_s += count * cost.ep_comm_s
        self.cp_comm_s += count * cost.cp_comm_s
        self.ep_hidden_s += count * cost.ep_hidden_s
        self.add_dp_comm(cost.dp_comm_per_iteration_s, cost.backward_s, count, cost.dp_gather_per_iteration_s,
                         cost.forward_s)
        self.state_bytes += count * cost.state_bytes
        self.activation_bytes += count * cost.activation_bytes
        self.largest_layer_activation_bytes = max(self.largest_layer_activation_bytes, cost.activation_bytes)
        self.transient_bytes = max(self.transient_bytes, cost.transient_bytes)
        self.workspace_bytes = max(self.workspace_bytes, cost.workspace_bytes)
        self.optimizer_temporary_bytes += count * cost.optimizer_temporary_bytes

    def add_dp_comm(self, dp_comm_s: float, backward_s: float, count: int = 1, gather_s: float = 0.0,
                    forward_s: float = 0.0) -> None:
        """Exposed data-parallel traffic of `count` units (cost.pipeline.exposed_dp_split): the gradients' beside the
        backward of the sync window (all of it where the units sync last), the weights' all-gather (`gather_s` of
        `dp_comm_s`) beside the forward of as many micro-batches (dispatched together after the optimizer step, each
        bucket waited for by its first forward: dp_sync_window), one where the units come first in the stage's
        forward (its first chunk, whose gradients sync last); the stage's first unit has neither window."""
        if self.sync_unhidden:  # the stage's first chunk: its gradients sync last, its first forward comes first
            exposed = dp_comm_s - gather_s + exposed_dp_time(gather_s, forward_s, self.grad_overlap, self.interference)
        else:
            window = self.sync_window_micro_batches
            exposed = exposed_dp_split(dp_comm_s, gather_s, window * backward_s, window * forward_s, self.grad_overlap,
                                       self.interference)
        first = dp_comm_s if self.units == 0 else exposed
        self.exposed_dp_s += first + (count - 1) * exposed
        self.units += count

    def add_seconds(self, seconds: float, kind: str) -> None:
        self.micro_batch_s += seconds
        setattr(self, kind, getattr(self, kind) + seconds)


def check_plan_fits_job(plan: Plan, model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec) -> None:
    """Named cross-checks between a plan and the job it is scored for."""
    if plan.world_size != cluster.world_size:
        raise UserError(f"plan is for {plan.world_size} GPUs but the cluster has {cluster.world_size} "
                        f"({cluster.num_nodes} nodes x {cluster.gpus_per_node})")
    if plan.num_layers != model.num_layers:
        raise UserError(f"plan places {plan.num_layers} layers but model '{model.name}' has {model.num_layers}")
    if plan.global_batch_size != training.global_batch_size:
        raise UserError(f"plan is for global batch {plan.global_batch_size}, not {training.global_batch_size}")
    pairs = ({(model.layers[0], s) for s in plan.distinct_strategies} if model.is_uniform()
             else set(zip(model.layers, plan.layer_strategies)))
    for layer, strategy in pairs:
        error = layer.tensor_parallel_error(strategy.tp)
        if error is not None:
            raise UserError(f"'{model.name}': {error}")
        try:
            check_expert_strategy(layer, strategy)
        except ValueError as error:
            raise UserError(f"model '{model.name}': {error}") from None
    if training.optimizer_states.precision_aware and any(s.dp > 1 and s.zero != 1 for s in plan.distinct_strategies):
        raise UserError("--use-precision-aware-optimizer needs the distributed optimizer on every data-parallel layer "
                        "(as in Megatron-Core); this plan has plain DP or Megatron-FSDP")
    problem = (context_parallel_problem(plan.embedding.cp, model)
               or cp_comm_problem(model, plan.embedding.tp, plan.embedding.cp, training)
               or (fp8_problem(cluster, training.fp8_recipe) if training.fp8 else None))
    if problem:
        raise UserError(problem)
    if plan.embedding.cp > 1 and training.attention_backend != "flash":
        raise UserError(f"context parallelism runs on the flash (SDPA) core attention, not the "
                        f"{training.attention_backend} one")


def stage_costs(plan: Plan, model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec) -> list[StageCost]:
    """Per-stage sums of layer, transition, p2p, embedding and LM-head costs, each stage on its own GPUs
    (ClusterSpec.stage_clusters); the p2p between stages at the pace of the slowest group's links. After a
    standalone MTP chunk the hidden states of the main model and of each MTP depth travel on together, 1 + D
    sequences' worth (Megatron-Core's MultiTokenPredictionBlock concatenates them along the sequence:
    transformer/multi_token_prediction.py; GPTModel.forward splits them where post_process is set)."""
    overlap = comm_model(cluster).grad_overlap
    views = cluster.stage_clusters(plan.pipeline_parallel)
    window = dp_sync_window(plan)
    stages = [StageCost(grad_overlap=overlap, interference=interference_share(view),
                        step_overhead_s=runtime_overhead(view)[0], sync_window_micro_batches=window) for view in views]
    word = training.activation_bytes
    micro_samples = plan.global_batch_size // plan.num_micro_batches
    p2p = _boundary_p2p(plan, model, views, word, 1)
    mtp_p2p = _boundary_p2p(plan, model, views, word, 1 + model.mtp_num_layers) if plan.mtp_chunk is not None else p2p
    priced = {view: _ends(plan, model, view, training) for view in dict.fromkeys(views)}  # once per group
    parts = [priced[view] for view in views]
    _add_part(stages[0], parts[0].embedding)
    for stage, ends in zip(stages, parts):
        stage.parts = ends
    boundary = plan.boundary_layout(model.seq_length) if plan.pipeline_parallel > 1 else plan.embedding

    def relayout(before: LayerStrategy, after: LayerStrategy, view: ClusterSpec) -> float:
        if before is after:
            return 0.0
        return transition_time(before, after, model.hidden_size, model.seq_length, micro_samples, view, word)

    layer_index, last = 0, len(plan.chunks) - 1
    for chunk_index, chunk in enumerate(plan.chunks):
        stage, view = stages[chunk_index % plan.pipeline_parallel], views[chunk_index % plan.pipeline_parallel]
        previous = plan.embedding if chunk_index == 0 else boundary
        compute_before, chunk_start = stage.compute_s, stage.micro_batch_s
        stage.sync_unhidden = plan.virtual_stages > 1 and chunk_index < plan.pipeline_parallel
        for spec, strategy, count in _chunk_runs(model, layer_index, chunk):
            stage.add_layer(layer_cost(spec, strategy, plan.local_micro_batch(strategy), model.seq_length,
                                       view, training), count)
            stage.add_seconds(relayout(previous, strategy, view), "transition_s")
            previous = strategy
        stage.add_seconds(relayout(previous, plan.embedding if chunk_index == last else boundary, view),
                          "transition_s")
        stage.add_seconds(runtime_overhead(view)[1], "runtime_s")
        layer_index += len(chunk.layers)
        if chunk_index < last:
            chunk_compute = stage.compute_s - compute_before
            sent = mtp_p2p if plan.mtp_chunk is not None and chunk_index >= plan.mtp_chunk else p2p
            stage.add_seconds(exposed_p2p_time(sent, chunk_compute, plan.virtual_stages, overlap), "pp_comm_s")
        stage.chunk_s.append(stage.micro_batch_s - chunk_start)
        stage.sync_unhidden = False
    stages[0].chunk_s[0] += parts[0].embedding.micro_batch_s
    head_index = plan.loss_stage
    head_start = stages[head_index].micro_batch_s
    _add_part(stages[head_index], parts[head_index].head)
    if model.mtp_num_layers:
        _add_mtp(stages, plan, model, views, training)
    stages[head_index].chunk_s[-1] += stages[head_index].micro_batch_s - head_start
    chain = interleaved_chain_p2p(plan, p2p, overlap)
    for index, (stage, view) in enumerate(zip(stages, views)):
        stage.optimizer_s = optimizer_step_time(stage.state_bytes, view, training.optimizer_impl)
        stage.exposed_ep_s = unmerged_ep_seconds(stage.ep_hidden_s, plan, index)
        stage.chain_p2p_s = chain
    return stages


def _boundary_p2p(plan: Plan, model: ModelSpec, views, word: int, sequences: int) -> float:
    """One stage boundary's p2p per micro-batch carrying `sequences` hidden states a sample, at the pace of the
    slowest stage group's links."""
    samples = plan.global_batch_size // plan.num_micro_batches * sequences
    return max(pipeline_p2p_time(model.hidden_size, model.seq_length, samples, plan.gpus_per_stage,
                                 plan.pipeline_parallel, view, word) for view in dict.fromkeys(views))


def interleaved_chain_p2p(plan: Plan, p2p_s: float, overlap: float) -> float:
    """Per iteration, the p2p latency an interleaved schedule cannot hide: `p2p_s` is one boundary's forward plus
    backward transfer of one micro-batch. With overlap_p2p_comm every transfer runs beside compute, but the first
    micro-batch's forward visits the p x v chunks one after another (each on the next stage, the last chunk of a
    round on the first) before any backward can start, and the last micro-batch's backward does the same in
    reverse: 2 (p v - 1) one-way transfers on the critical path whatever m (Megatron-Core's interleaved order
    replayed with a transfer delay on every stage-to-stage dependency: tests/test_chunked_pipeline.py). Without
    interleaving each transfer already blocks its stage (exposed_p2p_time); `overlap`: the share the machine
    hides at all (0 on cpu-gloo, where exposed_p2p_time already charges every transfer)."""
    if plan.virtual_stages == 1 or plan.pipeline_parallel == 1:
        return 0.0
    return overlap * (plan.pipeline_parallel * plan.virtual_stages - 1) * p2p_s


def dp_sync_window(plan: Plan) -> int:
    """Micro-batches of backward that each layer's gradient reduction runs beside. Without interleaving, the last
    micro-batch's: DDP starts a bucket's reduce-scatter once the last backward has filled it, beside the backward
    of the layers below (exposed_dp_time). With v > 1 chunks per stage, Megatron-Core's interleaved schedule runs
    the micro-batches in groups of p per chunk (microbatch_group_size_per_vp_stage, the pipeline size) and starts a
    chunk's gradient sync after its last micro-batch's backward (schedules.py, forward_backward_pipelining_with_
    interleaving: is_last_microbatch_for_model_chunk), so the sync runs beside the next chunk's group: min(p, m)
    micro-batches of backward. The parameter all-gather likewise runs beside a chunk's first group of forwards.
    The stage's first chunk syncs last, after the whole backward: its layers' traffic is charged in full
    (StageCost.sync_unhidden), as the first layer's is without interleaving."""
    if plan.virtual_stages == 1:
        return 1
    return max(1, min(plan.pipeline_parallel, plan.num_micro_batches))


def _ends(plan: Plan, model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec):
    """The embedding's and the LM head's costs (cost.embedding.embedding_cost) on `cluster`'s GPUs."""
    return embedding_cost(local_model(model, plan.embedding), gradient_strategy(plan.embedding),
                          plan.local_micro_batch(plan.embedding), cluster, training, plan.pipeline_parallel)


def unmerged_ep_seconds(hidden_s: float, plan: Plan, stage_index: int) -> float:
    """Per iteration, the dispatch time the combined 1F1B schedule leaves unhidden on one stage: its warm-up
    chunk forwards (one more than the plain schedule's) and as many cool-down backwards run alone
    (schedules.py, combined_1f1b.py), so that many chunk steps of the m x v expose what a merged step
    hides (`hidden_s` per micro-batch over the whole stage)."""
    if hidden_s <= 0:
        return 0.0
    chunks = plan.num_micro_batches * plan.virtual_stages
    alone = min(warmup_chunk_forwards(plan.pipeline_parallel, plan.virtual_stages, stage_index) + 1, chunks)
    return hidden_s * alone / plan.virtual_stages


def _add_mtp(stages: list[StageCost], plan: Plan, model: ModelSpec, views, training: TrainingSpec) -> None:
    """The multi-token prediction modules after the last layer: their transformer layers as layers and the rest
    as a part (cost/mtp.py) on their stage; the depths' logits and cross entropies on the loss's stage, the same
    one unless the layout gives MTP a chunk of its own (that chunk, its stage's last, carries what it adds)."""
    stage, cluster = stages[plan.mtp_stage], views[plan.mtp_stage]
    start = stage.micro_batch_s
    strategy = mtp_layer_strategy(plan)
    stage.add_layer(layer_cost(model.mtp_layer, strategy, plan.local_micro_batch(strategy), model.seq_length,
                               cluster, training), model.mtp_num_layers)
    shape = (local_model(model, plan.embedding), gradient_strategy(plan.embedding),
             plan.local_micro_batch(plan.embedding), cluster, training, plan.pipeline_parallel)
    if plan.mtp_chunk is None:
        stage.mtp = mtp_cost(*shape)
        _add_part(stage, stage.mtp)
        return
    modules, heads = mtp_parts(*shape, standalone=True)
    stage.mtp = modules
    _add_part(stage, modules)
    stage.chunk_s[-1] += stage.micro_batch_s - start
    stages[plan.loss_stage].mtp_heads = heads
    _add_part(stages[plan.loss_stage], heads)


def _chunk_runs(model: ModelSpec, first_layer: int, chunk: Chunk):
    """(spec, strategy, count) runs of a chunk whose first layer is model layer `first_layer`."""
    if model.is_uniform():
        return [(model.layers[0], strategy, count) for strategy, count in chunk.runs]
    return _runs(model.layers[first_layer:first_layer + len(chunk.layers)], chunk.layers)


def _runs(specs, strategies):
    """Group consecutive layers with equal spec and strategy: (spec, strategy, count)."""
    runs: list[list] = []
    for spec, strategy in zip(specs, strategies):
        if runs and _same(runs[-1][0], spec) and _same(runs[-1][1], strategy):
            runs[-1][2] += 1
        else:
            runs.append([spec, strategy, 1])
    return runs


def _same(a, b) -> bool:
    """Equality with the identity shortcut that dataclass __eq__ lacks (shared layer objects)."""
    return a is b or a == b


def _add_part(stage: StageCost, part) -> None:
    """The embedding (before the first layer) or the LM head (after the last)."""
    stage.micro_batch_s += part.micro_batch_s
    stage.compute_s += part.micro_batch_s - part.tp_comm_s
    stage.backward_s += part.backward_s
    stage.tp_comm_s += part.tp_comm_s
    stage.add_dp_comm(part.dp_comm_per_iteration_s, part.backward_s, 1, part.dp_gather_per_iteration_s,
                      part.micro_batch_s - part.backward_s - part.tp_comm_s)
    stage.state_bytes += part.state_bytes
    stage.transient_bytes = max(stage.transient_bytes, part.transient_bytes)
    stage.optimizer_temporary_bytes += part.optimizer_temporary_bytes


def optimizer_step_time(state_bytes: float, cluster: ClusterSpec, impl: str = "fused") -> float:
    """One Adam step over `state_bytes` of model state (cost.models: analytic or measured);
    `impl` is TrainingSpec.optimizer_impl."""
    return compute_model(cluster).optimizer_time(state_bytes, cluster, impl)


def stage_time_per_micro_batch(stage: StageCost, num_micro_batches: int) -> float:
    """A stage's pipeline slot: its micro-batch work plus its once-per-iteration
    gradient sync and optimizer step spread over the m micro-batches, so that the
    steady state (m x the slowest slot) carries the slowest stage's tail in full."""
    tail = stage.exposed_dp_s + stage.exposed_ep_s + stage.chain_p2p_s + stage.optimizer_s + stage.step_overhead_s
    return stage.micro_batch_s + tail / num_micro_batches


def stage_busy_seconds(plan: Plan, model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec) -> tuple[float, ...]:
    """Per iteration, the seconds one GPU of each stage spends in its micro-batches' forward and backward passes:
    layers, embedding and head, recomputation, the collectives inside the layers and the runtime's per-chunk work.
    That is what Megatron-Core's schedule times as 'forward-compute' and 'backward-compute' (runtime/stragglers.py
    compares the two); the pipeline's p2p, the gradient sync and the optimizer step are left out."""
    stages = stage_costs(plan, model, cluster, training)
    return tuple(plan.num_micro_batches * (s.compute_s + s.recompute_s + s.tp_comm_s + s.ep_comm_s + s.cp_comm_s
                                           + s.runtime_s) for s in stages)


def stage_memory(plan: Plan, stage_index: int, stage: StageCost, model: ModelSpec,
                 cluster: ClusterSpec, training: TrainingSpec) -> StageMemory:
    """The allocated terms of one stage's GPU (cost.peak_memory: the peak is their largest moment)."""
    in_flight = in_flight_micro_batches(stage_index, plan.pipeline_parallel, plan.num_micro_batches,
                                        plan.virtual_stages, plan.schedule)
    activations = stage.activation_bytes + stage.mtp.activation_bytes
    costs = stage.parts
    if stage_index == 0:
        activations += costs.embedding.activation_bytes
    activations *= in_flight
    if ep_overlap_runs(plan, model, training):
        activations += merged_step_extra_bytes(stage)
    logits = waiting = 0.0
    if stage_index == plan.loss_stage:
        # the MTP depths' softmaxes are kept beside the main one
        softmax = costs.head.activation_bytes + stage.mtp.loss_bytes + stage.mtp_heads.loss_bytes
        logits = softmax + costs.head.loss_bytes
        if plan.schedule == "gpipe":  # the other micro-batches' softmax waits for their backward
            activations += (plan.num_micro_batches - 1) * softmax
        if plan.pipeline_parallel == 1 and not model.untie_embeddings_and_output_weights:
            waiting = tied_embedding_grad_bytes(model, plan.embedding, training.activation_bytes)
    return StageMemory(states=stage.state_bytes, activations=activations, layer_transient=stage.transient_bytes,
                       workspace=stage.workspace_bytes, logits=logits, waiting_grad=waiting,
                       optimizer_temporaries=stage.optimizer_temporary_bytes,
                       framework=cluster.framework_overhead_bytes)


def merged_step_extra_bytes(stage: StageCost) -> float:
    """What the combined 1F1B schedule (--overlap-moe-expert-parallel-comm) holds beyond plain 1F1B: one layer.

    Megatron-Core 0.16.1 runs one more chunk forward in the warm-up (schedules.py,
    get_pp_rank_microbatches), which takes the place of the forward plain 1F1B runs first in each steady-state
    step. A merged step then pairs layer i's forward of one micro-batch with layer L-1-i's backward of the other
    and frees each backward layer's state as it goes (models/common/model_chunk_schedule_plan.py,
    TransformerModelChunkSchedulePlan.run, release_state; the backward's autograd frees its saved tensors), so
    the new micro-batch's kept layers replace the old one's: at most one layer more is held at once."""
    return stage.largest_layer_activation_bytes


def stage_memory_bytes(plan: Plan, stage_index: int, stage: StageCost, model: ModelSpec,
                       cluster: ClusterSpec, training: TrainingSpec) -> float:
    """Peak allocated bytes on one GPU of a stage."""
    return stage_memory(plan, stage_index, stage, model, cluster, training).peak_bytes


def plan_communicators(plan: Plan, model: ModelSpec) -> int:
    """NCCL communicators a rank of `plan` creates (cost.peak_memory.communicator_count)."""
    tied = not model.untie_embeddings_and_output_weights
    return communicator_count(plan.distinct_strategies | {plan.embedding}, plan.pipeline_parallel, tied)


def estimate_plan(plan: Plan, model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec) -> Prediction:
    """Iteration time, TFLOP/s per GPU and per-stage memory of `plan`."""
    check_plan_fits_job(plan, model, cluster, training)
    stages = stage_costs(plan, model, cluster, training)
    m = plan.num_micro_batches
    times = [stage_time_per_micro_batch(s, m) for s in stages]
    iteration, bubble = iteration_and_bubble(plan, stages, times, cluster)
    views = cluster.stage_clusters(plan.pipeline_parallel)
    terms = [stage_memory(plan, i, s, model, views[i], training) for i, s in enumerate(stages)]
    memory = [t.peak_bytes for t in terms]
    communicators = plan_communicators(plan, model)
    devices = [device_bytes(memory[i], views[i], communicators) for i in range(len(terms))]
    budgets = [device_budget_bytes(view, training) for view in views]
    peak_stage = max(range(len(terms)), key=lambda i: devices[i] / budgets[i])  # the fullest against its budget
    device, budget = devices[peak_stage], budgets[peak_stage]
    cluster_of_peak = views[peak_stage]
    critical = max(range(len(stages)), key=lambda i: times[i])
    return Prediction(
        iteration_time_s=iteration,
        tflops_per_gpu=model_flops_per_iteration(model, plan.global_batch_size) / iteration / plan.world_size / 1e12,
        peak_memory_gib=max(memory) / GIB,
        memory_budget_gib=budget / GIB,
        fits=device <= budget,
        stage_memory_gib=tuple(b / GIB for b in memory),
        stage_time_s=tuple(m * t for t in times),
        breakdown=_breakdown(stages[critical], m, bubble),
        peak_reserved_gib=reserved_bytes(memory[peak_stage], cluster_of_peak) / GIB,
        device_memory_gib=device / GIB,
        memory_breakdown=memory_breakdown(terms[peak_stage], cluster_of_peak, communicators),
        attention_backend=training.attention_backend,
        optimizer_impl=training.optimizer_impl,
        recompute_modules=training.recompute_modules,
        grad_overlap=comm_model(cluster).grad_overlap,
        recipe_flags=recipe_flags(plan, model, training),
    )


def iteration_and_bubble(plan: Plan, stages: list[StageCost], times: list[float],
                         cluster: ClusterSpec) -> tuple[float, float]:
    """Seconds of the iteration and of the critical stage's idle time in it: cost.pipeline.pipeline_time; where
    ranks time-slice CPU cores, their replay (cost.timeslice); where an interleaved plan's chunks differ, the
    chunk-by-chunk replay when it is the longer. pipeline_time stays the floor there: the search's bounds
    (search/stage_bound.py, uniform_floors.py) are bounds of it, and a replay that comes out shorter only says
    that the fill and drain of unequal stages overlap more than the formula's (sum T - T_max) / v."""
    m, v = plan.num_micro_batches, plan.virtual_stages
    iteration, bubble = pipeline_time(times, m, v), bubble_time(times, m, v)
    cores = profiled_cpu_cores(cluster)
    if cores:
        return simulate_iteration(stage_loads(plan, stages, core_share(cluster)), m, v, cores, plan.schedule), bubble
    if unequal_chunks(plan):
        iteration = max(iteration, interleaved_iteration(stages, m, plan.schedule))
        bubble = iteration - m * max(times)
    return iteration, bubble


def recipe_flags(plan: Plan, model: ModelSpec, training: TrainingSpec) -> tuple[str, ...]:
    """The Megatron-LM flags that run what `training` prices beyond the layout: the CP attention's exchange where
    cp > 1 (cost/context_parallel.py), FP8 through Transformer Engine,
    TP communication overlap where a layer has tp > 1 with SP, gradients reduced in bf16, the precision-aware
    optimizer (specs/optimizer_states.py), the flex dispatcher,
    EP overlap where a MoE layer has ep > 1, CUDA graphs (cost/cuda_graphs.py) and activation offloading
    (cost/activation_offload.py)."""
    flags: list[str] = []
    if training.cp_comm_type != "p2p" and plan.embedding.cp > 1:
        flags += ["--cp-comm-type", training.cp_comm_type]
    if training.fp8:
        flags += ["--fp8-format", training.fp8_format, "--fp8-recipe", training.fp8_recipe]
        flags += ["--fp8-param-gather"] if training.fp8_param_gather else []
    if training.tp_comm_overlap and any(s.tp > 1 and s.sp for s in plan.distinct_strategies):
        flags.append("--tp-comm-overlap")
    states = training.optimizer_states
    if training.grad_bytes == 2 and training.precision != "fp32" and states.main_grads_dtype != "bf16":
        flags.append("--grad-reduce-in-bf16")
    flags += states.flags()
    if states.precision_aware and not any(s.zero >= 1 for s in plan.distinct_strategies):
        flags.append("--use-distributed-optimizer")  # Megatron-Core needs it even where dp is 1
    if training.cross_entropy_fusion != "none":
        flags += ["--cross-entropy-loss-fusion", "--cross-entropy-fusion-impl", training.cross_entropy_fusion]
    if training.moe_token_dispatcher == "flex" and any(layer.moe is not None for layer in model.layers):
        flags += ["--moe-token-dispatcher-type", "flex", "--moe-flex-dispatcher-backend", training.moe_flex_backend]
        if training.flex_backend_sms != FLEX_BACKEND_SMS[training.moe_flex_backend]:
            flags += [f"--moe-{training.moe_flex_backend}-num-sms", str(training.flex_backend_sms)]
    if ep_overlap_runs(plan, model, training):
        flags += ["--overlap-moe-expert-parallel-comm", "--delay-wgrad-compute"]
    flags += cuda_graph_flags(plan.distinct_strategies, training) + offload_flags(training)
    return tuple(flags)


def stage_loads(plan: Plan, stages: list[StageCost], share: float) -> list[StageLoad]:
    """The stages as cost.timeslice sees them: work at a whole core (the profiled compute and
    the runtime's own work x `share`) and waiting (TP, p2p and relayout traffic), per
    micro-batch chunk, forward and backward each taking half of the runtime work and waiting."""
    group = max(s.tp for s in plan.distinct_strategies | {plan.embedding})
    v = plan.virtual_stages
    loads = []
    for stage in stages:
        forward = stage.compute_s - stage.backward_s + stage.runtime_s / 2
        backward = stage.backward_s + stage.recompute_s + stage.runtime_s / 2
        wait = (stage.tp_comm_s + stage.ep_comm_s + stage.cp_comm_s + stage.pp_comm_s
                + stage.transition_s) / 2
        loads.append(StageLoad(group=group, replicas=plan.gpus_per_stage // group,
                               forward=(forward * share / v, wait / v), backward=(backward * share / v, wait / v),
                               sync=stage.exposed_dp_s,
                               step_work=(stage.optimizer_s + stage.step_overhead_s) * share,
                               chunk_weights=chunk_weights(stage) if unequal_chunks(plan) else ()))
    return loads


def unequal_chunks(plan: Plan) -> bool:
    """Whether an interleaved plan's chunks hold different numbers of layers (a --pipeline-model-parallel-layout,
    the embedding and the loss counted in the split, a mixed cluster's uneven split in chunks)."""
    return plan.virtual_stages > 1 and len({len(chunk.layers) for chunk in plan.chunks}) > 1


def chunk_weights(stage: StageCost) -> tuple[float, ...]:
    """Each chunk's share of the stage's micro-batch time against an equal share (1.0 each when alike)."""
    mean = sum(stage.chunk_s) / len(stage.chunk_s)
    return tuple(seconds / mean for seconds in stage.chunk_s) if mean > 0 else ()


def interleaved_iteration(stages: list[StageCost], m: int, schedule: str) -> float:
    """The iteration of an interleaved plan whose chunks differ, replayed chunk by chunk
    (cost.pipeline.chunked_pipeline_time): pipeline_time gives every chunk of a stage the same 1/v of its
    time, so it cannot see a stage wait for a neighbour's longer chunk (issue 39: a re-plan of 5, 5, 2, 4
    layers in 2 chunks per stage was predicted 32.6% faster and measured 11% faster). Each chunk's time splits
    into forward and backward as its stage's does: the backward's compute and recomputation, and half of the
    rest (TP, EP, CP and p2p traffic, relayouts, the runtime's work)."""
    chunk_times, tails = [], []
    for stage in stages:
        other = stage.micro_batch_s - stage.compute_s - stage.recompute_s
        backward = (stage.backward_s + stage.recompute_s + other / 2) / stage.micro_batch_s
        chunk_times.append([(seconds * (1 - backward), seconds * backward) for seconds in stage.chunk_s])
        tails.append(stage.exposed_dp_s + stage.exposed_ep_s + stage.chain_p2p_s + stage.optimizer_s
                     + stage.step_overhead_s)
    return chunked_pipeline_time(chunk_times, m, tails, schedule)


def _breakdown(stage: StageCost, m: int, bubble: float) -> TimeBreakdown:
    return TimeBreakdown(
        compute_s=m * stage.compute_s, recompute_s=m * stage.recompute_s, tp_comm_s=m * stage.tp_comm_s,
        ep_comm_s=m * stage.ep_comm_s + stage.exposed_ep_s, cp_comm_s=m * stage.cp_comm_s,
        dp_comm_s=stage.exposed_dp_s, pp_comm_s=m * stage.pp_comm_s + stage.chain_p2p_s, bubble_s=bubble,
        transition_s=m * stage.transition_s, optimizer_s=stage.optimizer_s,
        runtime_s=m * stage.runtime_s + stage.step_overhead_s,
    )

