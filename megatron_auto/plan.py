"""Plan: the one type that the search returns and a person may write by hand.

A plan lays the model's layers out in `pipeline_parallel * virtual_stages`
chunks, in model order; chunk c runs on pipeline stage c % pipeline_parallel
(Megatron's interleaved assignment). Every layer carries its own strategy; a
plan in the `megatron` space uses one TP/DP/SP/ZeRO layout for all layers.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from functools import cached_property
from pathlib import Path
from typing import Optional

from . import serde
from .serde import CachedHash, checked, replaced_unchecked
from .errors import UserError
from .limits import MAX_GLOBAL_BATCH, MAX_GPUS, MAX_LAYERS
from .parallel_dims import ParallelDims
from .specs.model import ModelSpec, _check_version
from .specs.training import DEFAULT_RECOMPUTE_MODULES

PLAN_SCHEMA_VERSION = 1
RECOMPUTE_KINDS = ("none", "selective", "full")
SPACES = ("megatron", "hybrid")
SCHEDULES = ("1f1b", "gpipe")


@dataclass(frozen=True)
class LayerStrategy(CachedHash):
    """How one layer (or the embedding and LM head) is laid out on its stage's GPUs."""

    __hash__ = CachedHash.__hash__  # dataclass(frozen=True) would otherwise replace it

    tp: int = 1
    """Tensor-parallel degree (Megatron column/row split)."""
    dp: int = 1
    """Data-parallel degree; tp * dp equals the GPUs of the stage."""
    zero: int = 0
    """Sharding of the data-parallel replicas: 0 none, 1 optimizer states (Megatron's
    distributed optimizer), 2 also gradients, 3 also parameters (FSDP)."""
    sp: bool = False
    """Megatron sequence parallelism in the TP group (needs tp > 1)."""
    recompute: str = "none"
    """Activation recomputation: none, selective (attention core) or full (whole layer)."""
    ep: int = 1
    """Expert-parallel degree of a MoE layer [--expert-model-parallel-size]; 1 for a dense layer."""
    etp: Optional[int] = None
    """Expert tensor-parallel degree of a MoE layer [--expert-tensor-parallel-size]; None = tp (Megatron's default)."""
    cp: int = 1
    """Context-parallel degree [--context-parallel-size]: each sequence split over cp ranks, which hold the same
    samples and weights; tp * cp * dp equals the GPUs of the stage (Megatron-Core's rank order tp-cp-ep-dp-pp)."""

    def __post_init__(self) -> None:
        self.dims  # noqa: B018 -- builds the layer's ParallelDims, which checks the degrees
        if self.zero not in (0, 1, 2, 3):
            raise ValueError(f"zero must be 0, 1, 2 or 3, got {self.zero}")
        if self.recompute not in RECOMPUTE_KINDS:
            raise ValueError(f"recompute must be one of {RECOMPUTE_KINDS}, got {self.recompute!r}")
        if self.sp and self.tp == 1:
            raise ValueError("sequence parallelism needs tp > 1")

    @cached_property
    def dims(self) -> ParallelDims:
        """The layer's degrees on its stage (pp and vp are the plan's): Megatron-Core's groups must partition
        its tp x cp x dp ranks, the expert groups included."""
        return ParallelDims(tp=self.tp, cp=self.cp, dp=self.dp, ep=self.ep, etp=self.etp)

    @property
    def gpus(self) -> int:
        return self.dims.stage_gpus

    @property
    def gradient_dp(self) -> int:
        """Ranks that reduce their gradients together: dp x cp (ParallelDims.gradient_dp)."""
        return self.dims.gradient_dp

    @property
    def expert_tp(self) -> int:
        """Tensor-parallel degree of the experts: etp, or tp when unset."""
        return self.dims.expert_tp

    @property
    def expert_dp(self) -> int:
        """Data-parallel degree of the experts (ParallelDims.expert_dp)."""
        return self.dims.expert_dp

    @cached_property
    def per_micro_batch_key(self) -> tuple:
        """What a layer's per-micro-batch terms (its seconds, its kept activations, its experts' dispatch) read of
        this layout: all but the data-parallel degree and a ZeRO stage below 3, which only the states and the
        per-iteration gradient traffic read. The search's memos of those terms key on it, so one pricing serves
        every pipeline depth and optimizer choice (tests/test_search_speed.py checks that they read neither)."""
        return (self.tp, self.sp, self.cp, self.ep, self.etp, self.recompute,
                (self.dp, self.zero) if self.zero >= 3 else None)

    def layout(self) -> tuple[int, int, int, bool, int]:
        """What decides where the layer's tensors live; recompute does not."""
        return (self.tp, self.dp, self.zero, self.sp, self.cp)

    def short(self) -> str:
        """Compact label for tables, e.g. `tp4·dp2·z1·sp·rc=full`."""
        parts = [f"tp{self.tp}"] + ([f"cp{self.cp}"] if self.cp > 1 else []) + [f"dp{self.dp}"]
        if self.zero:
            parts.append(f"z{self.zero}")
        if self.sp:
            parts.append("sp")
        if self.ep > 1:
            parts.append(f"ep{self.ep}")
        if self.etp is not None:
            parts.append(f"etp{self.etp}")
        if self.recompute != "none":
            parts.append(f"rc={self.recompute}")
        return "·".join(parts)


@dataclass(frozen=True)
class Chunk:
    """A run of consecutive layers that one pipeline stage holds (a virtual stage)."""

    layers: tuple[LayerStrategy, ...]
    """One strategy per layer, in model order."""

    @cached_property
    def runs(self) -> tuple[tuple[LayerStrategy, int], ...]:
        """Consecutive equal strategies as (strategy, count): what the cost model sums."""
        runs: list[list] = []
        for strategy in self.layers:
            if runs and (runs[-1][0] is strategy or runs[-1][0] == strategy):
                runs[-1][1] += 1
            else:
                runs.append([strategy, 1])
        return tuple((strategy, count) for strategy, count in runs)

    @cached_property
    def distinct(self) -> frozenset[LayerStrategy]:
        return frozenset(strategy for strategy, _ in self.runs)


@dataclass(frozen=True)
class TimeBreakdown:
    """Where one iteration's time goes on the critical stage, in seconds."""

    compute_s: float = 0.0
    """Forward and backward kernels (and ZeRO-3 traffic compute could not hide)."""
    recompute_s: float = 0.0
    """The extra forward work of activation recomputation."""
    tp_comm_s: float = 0.0
    """Tensor-parallel all-reduces (or all-gathers and reduce-scatters with SP)."""
    ep_comm_s: float = 0.0
    """MoE token dispatch and combine over the expert-parallel group, and expert-TP collectives."""
    cp_comm_s: float = 0.0
    """Context parallelism's K/V all-gathers and the reduce-scatter of their gradients."""
    dp_comm_s: float = 0.0
    """Gradient synchronisation left after overlapping with backward."""
    pp_comm_s: float = 0.0
    """Point-to-point sends between pipeline stages."""
    bubble_s: float = 0.0
    """Pipeline fill and drain beyond m times the slowest stage."""
    transition_s: float = 0.0
    """Re-laying out activations between layers of different layouts."""
    optimizer_s: float = 0.0
    """The Adam step."""
    runtime_s: float = 0.0
    """The training runtime's own per-step and per-micro-batch work (measured; cost.models.runtime_overhead)."""

    @property
    def total_s(self) -> float:
        """The parts summed: the iteration, except where ranks time-slice CPU cores (cost.timeslice)."""
        return sum(getattr(self, f.name) for f in fields(self))


@dataclass(frozen=True)
class MemoryBreakdown:
    """The peak stage's memory per GPU by term, in GiB (cost.peak_memory, docs/cost_model.md); the
    allocated peak is the largest moment's sum, not the sum of every term."""

    peak_moment: str
    """When the allocated peak occurs: backward, loss or optimizer step."""
    states_gib: float
    """Weights, gradients and optimizer states."""
    activations_gib: float
    """Activations of the micro-batches in flight (backward and loss moments)."""
    layer_transient_gib: float
    """Backward: one layer's recompute and attention working set, and a waiting tied weight gradient."""
    logits_gib: float
    """Loss: the cross entropy's fp32 softmax and the logits beside it."""
    optimizer_temporaries_gib: float
    """Optimizer step: the foreach Adam's temporaries."""
    workspace_gib: float
    """Run-long kernel buffers (the unfused attention's scores buffer)."""
    framework_gib: float
    """The framework's plan-independent tensors."""
    allocator_reserve_gib: float
    """The caching allocator's reserve above the allocated peak."""
    cuda_context_gib: float
    """CUDA context and cuBLAS workspace, outside the allocator."""
    nccl_gib: float
    """NCCL communicators' buffers, outside the allocator."""
    nccl_communicators: int
    """Communicators counted."""


@dataclass(frozen=True)
class Prediction:
    """What the cost model expects of the plan."""

    iteration_time_s: float
    """Seconds per training iteration."""
    tflops_per_gpu: float
    """Model FLOPs (Narayanan et al., no recompute) per second per GPU, in 10^12."""
    peak_memory_gib: float
    """Largest allocated memory per GPU over the stages (what torch.cuda.max_memory_allocated reports)."""
    memory_budget_gib: float
    """Device memory per GPU the plan was checked against: the budget less the safety margin."""
    fits: bool
    """Whether every stage stays within the budget."""
    stage_memory_gib: tuple[float, ...]
    """Per-GPU memory of each pipeline stage."""
    stage_time_s: tuple[float, ...]
    """Busy seconds per iteration of each stage (m x its slot)."""
    breakdown: TimeBreakdown
    """The critical stage's time by cause."""
    peak_reserved_gib: float = 0.0
    """The caching allocator's reserve at the peak stage (torch.cuda.max_memory_reserved)."""
    device_memory_gib: float = 0.0
    """Device memory the plan needs at the peak: the allocated peak plus CUDA context and NCCL (the reserve
    above the peak is not needed: cost/peak_memory.py); `fits` compares it to the budget."""
    memory_breakdown: Optional[MemoryBreakdown] = None
    """The peak stage's memory by term."""
    attention_backend: str = ""
    """The core attention priced (flash or unfused)."""
    optimizer_impl: str = ""
    """The optimizer step priced (fused or foreach)."""
    recompute_modules: tuple[str, ...] = DEFAULT_RECOMPUTE_MODULES
    """What `selective` recomputation was priced as re-running (TrainingSpec.recompute_modules)."""
    grad_overlap: float = 0.0
    """Share of the data-parallel traffic's overlap window priced as hidden (ClusterSpec.grad_overlap):
    above 0, the plan assumes Megatron's DDP reduces (and gathers) while the backward (forward) runs."""
    recipe_flags: tuple[str, ...] = ()
    """Megatron-LM flags of the precision and recipe knobs the plan was priced with (FP8, TP communication
    overlap, gradients in bf16: cost/fp8.py, cost/tp_overlap.py); the plan's flags carry them."""


@dataclass(frozen=True)
class Plan:
    """A complete parallel layout of one training job."""

    space: str
    """`megatron` (stock Megatron-Core can run it) or `hybrid` (per-layer layouts)."""
    world_size: int = checked(positive=True)
    """GPUs (ranks) in the job."""
    pipeline_parallel: int
    """Pipeline stages, p."""
    global_batch_size: int = checked(positive=True, at_most=MAX_GLOBAL_BATCH)
    """Samples per iteration, B."""
    num_micro_batches: int
    """Micro-batches per iteration, m; each layer's ranks see B / (m * dp) samples each."""
    chunks: tuple[Chunk, ...]
    """p * v chunks in model order; chunk c runs on stage c % p."""
    embedding: LayerStrategy = LayerStrategy()
    """Layout of the word embedding (first stage) and LM head (last stage)."""
    virtual_stages: int = 1
    """Chunks per stage, v (Megatron's virtual pipeline size); v > 1 interleaves."""
    schedule: str = "1f1b"
    """Pipeline schedule: 1f1b (interleaved when v > 1) or gpipe."""
    mtp_chunk: Optional[int] = None
    """The chunk that holds the multi-token-prediction layers when it is not the last (Megatron-Core's
    standalone MTP, from a --pipeline-model-parallel-layout: "...|m|L"); None: the last chunk, beside the loss."""
    model: Optional[ModelSpec] = None
    """The model the plan was made for; checked against the runtime's flags."""
    cluster: str = ""
    """Name of the cluster (preset or file) the plan was made for."""
    prediction: Optional[Prediction] = None
    """The cost model's estimate, when the plan came from the search."""
    schema_version: int = PLAN_SCHEMA_VERSION
    """Version of this record's layout."""

    def __post_init__(self) -> None:
        _check_version(self.schema_version, PLAN_SCHEMA_VERSION, "plan")
        for check in PLAN_VALIDATORS:
            check(self)

    def with_prediction(self, prediction: Optional[Prediction]) -> Plan:
        """This plan with `prediction`: dataclasses.replace without re-running the validators, which read no
        prediction (the search attaches one to thousands of plans)."""
        return replaced_unchecked(self, prediction=prediction)

    @cached_property
    def layer_strategies(self) -> tuple[LayerStrategy, ...]:
        return tuple(s for chunk in self.chunks for s in chunk.layers)

    @cached_property
    def distinct_strategies(self) -> frozenset[LayerStrategy]:
        """The layers' strategies without repeats (the embedding's not included)."""
        return frozenset().union(*(chunk.distinct for chunk in self.chunks))

    @property
    def num_layers(self) -> int:
        return sum(len(chunk.layers) for chunk in self.chunks)

    @property
    def recomputes_selectively(self) -> bool:
        """Whether some layer re-runs modules (--recompute-modules) in its backward."""
        return any(s.recompute == "selective" for s in self.distinct_strategies)

    @property
    def gpus_per_stage(self) -> int:
        return self.world_size // self.pipeline_parallel

    @property
    def virtual_chunk_layers(self) -> int:
        """Layers of a middle model chunk (with virtual stages: every chunk but the first and last, whose
        layer count Megatron may lower by one for the embedding or the loss)."""
        return len(self.chunks[1].layers) if len(self.chunks) > 2 else max(len(c.layers) for c in self.chunks)

    @property
    def loss_stage(self) -> int:
        """The stage of the last chunk: the LM head and the loss."""
        return (len(self.chunks) - 1) % self.pipeline_parallel

    @property
    def mtp_stage(self) -> int:
        """The stage of the multi-token prediction modules: the loss's (Megatron-Core puts them in the last chunk
        without a layout), or that of the layout's standalone MTP chunk (mtp_chunk)."""
        return self.loss_stage if self.mtp_chunk is None else self.mtp_chunk % self.pipeline_parallel

    def stage_chunks(self, stage: int) -> tuple[Chunk, ...]:
        return self.chunks[stage::self.pipeline_parallel]

    def stage_layer_counts(self) -> tuple[int, ...]:
        return tuple(sum(len(c.layers) for c in self.stage_chunks(s)) for s in range(self.pipeline_parallel))

    def local_micro_batch(self, strategy: LayerStrategy) -> int:
        """Samples each rank of a layer with this strategy processes per micro-batch."""
        return self.global_batch_size // (self.num_micro_batches * strategy.dp)

    def is_uniform_layout(self) -> bool:
        return len({s.layout() for s in self.distinct_strategies} | {self.embedding.layout()}) == 1

    def boundary_layout(self, seq_length: int) -> LayerStrategy:
        """Layout of the activations that cross a pipeline-stage boundary.

        Stock Megatron sends the (uniform) layer layout itself; the hybrid runtime
        re-lays each stage's output into `boundary_layout_for` and its input out of it.
        """
        if self.space == "megatron":
            return self.embedding
        return boundary_layout_for(self.gpus_per_stage, self.global_batch_size // self.num_micro_batches, seq_length)


def boundary_layout_for(gpus_per_stage: int, micro_batch_samples: int, seq_length: int) -> LayerStrategy:
    """Each GPU holds 1/n of the micro-batch: split by batch (tp 1, dp n) when the
    micro-batch splits n ways, else by sequence (tp n with SP), so that the p2p
    tensor has one shape on every rank of every stage, as Megatron's schedules need."""
    n = gpus_per_stage
    if micro_batch_samples % n == 0:
        return LayerStrategy(tp=1, dp=n)
    if seq_length % n == 0 and n > 1:
        return LayerStrategy(tp=n, dp=1, sp=True)
    raise UserError(f"neither the micro-batch ({micro_batch_samples} samples) nor the sequence "
                    f"({seq_length} tokens) splits over the {n} GPUs of a stage")


def _check_space_and_schedule(plan: Plan) -> None:
    if plan.space not in SPACES:
        raise ValueError(f"space must be one of {SPACES}, got {plan.space!r}")
    if plan.schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}, got {plan.schedule!r}")
    if plan.virtual_stages > 1 and (plan.schedule != "1f1b" or plan.pipeline_parallel < 2):
        raise ValueError("virtual stages need the 1f1b schedule and at least 2 pipeline stages")
    if plan.virtual_stages > 1 and plan.num_micro_batches % plan.pipeline_parallel:
        raise ValueError(f"interleaving needs the micro-batches ({plan.num_micro_batches}) in multiples of "
                         f"pipeline_parallel ({plan.pipeline_parallel}), as Megatron-Core's schedule does")


def _check_chunk_count(plan: Plan) -> None:
    if plan.pipeline_parallel < 1 or plan.virtual_stages < 1:
        raise ValueError("pipeline_parallel and virtual_stages must be at least 1")
    expected = plan.pipeline_parallel * plan.virtual_stages
    if len(plan.chunks) != expected:
        raise ValueError(f"plan has {len(plan.chunks)} chunks; pipeline_parallel x virtual_stages = {expected}")
    # Megatron-Core builds a chunk that holds only the embedding, MTP or loss (a --pipeline-model-parallel-layout
    # chunk without "t"); estimate prices it, the runtime refuses it (pipeline_layout.runtime_chunk_problem).
    empty_allowed = plan.space == "megatron" and plan.num_layers >= 1
    if not empty_allowed and not all(chunk.layers for chunk in plan.chunks):
        raise ValueError("every chunk needs at least one layer")


def _check_limits(plan: Plan) -> None:
    if plan.world_size > MAX_GPUS or plan.num_layers > MAX_LAYERS:
        raise ValueError(f"{plan.num_layers} layers on {plan.world_size} GPUs is beyond what megatron-auto plans for "
                         f"({MAX_LAYERS} layers, {MAX_GPUS} GPUs: megatron_auto/limits.py)")


def _check_world_size(plan: Plan) -> None:
    if plan.world_size % plan.pipeline_parallel:
        raise ValueError(f"world size {plan.world_size} is not divisible by pipeline_parallel {plan.pipeline_parallel}")
    if all(s.gpus == plan.gpus_per_stage for s in plan.distinct_strategies | {plan.embedding}):
        return
    for index, strategy in enumerate(plan.layer_strategies + (plan.embedding,)):
        if strategy.gpus != plan.gpus_per_stage:
            where = "embedding" if index == plan.num_layers else f"layer {index}"
            raise ValueError(f"{where}: tp x cp x dp = {strategy.gpus}, but each stage has "
                             f"{plan.gpus_per_stage} GPUs")


def _check_batch_split(plan: Plan) -> None:
    if plan.num_micro_batches < 1 or plan.global_batch_size % plan.num_micro_batches:
        raise ValueError(f"global batch {plan.global_batch_size} is not divisible into {plan.num_micro_batches} micro-batches")
    per_micro_batch = plan.global_batch_size // plan.num_micro_batches
    for strategy in plan.distinct_strategies | {plan.embedding}:
        if per_micro_batch % strategy.dp:
            raise ValueError(f"a micro-batch of {per_micro_batch} samples does not split over dp={strategy.dp}")


def _check_model_match(plan: Plan) -> None:
    if plan.embedding.ep != 1 or plan.embedding.etp is not None:
        raise ValueError("the embedding has no experts: its ep must be 1 and etp unset")
    if plan.model is None:
        return
    if plan.model.num_layers != plan.num_layers:
        raise ValueError(f"plan places {plan.num_layers} layers but the model has {plan.model.num_layers}")
    model = plan.model
    pairs = ({(model.layers[0], s) for s in plan.distinct_strategies} if model.is_uniform()
             else set(zip(model.layers, plan.layer_strategies)))
    for layer, strategy in pairs:
        error = layer.tensor_parallel_error(strategy.tp)
        if error is not None:
            raise ValueError(error)
        check_expert_strategy(layer, strategy)


def check_expert_strategy(layer, strategy: LayerStrategy) -> None:
    """ep/etp against the layer: none on a dense layer; on a MoE layer what Megatron-Core accepts
    (ep divides the experts; SP with TP, moe_layer.py; biases only with etp 1, transformer_config.py)."""
    if layer.moe is None:
        if strategy.ep != 1 or strategy.etp is not None:
            raise ValueError(f"ep={strategy.ep} etp={strategy.etp} on a dense layer (expert parallelism "
                             f"is for MoE layers only)")
        return
    if layer.moe.num_experts % strategy.ep:
        raise ValueError(f"ep={strategy.ep} does not divide the {layer.moe.num_experts} experts")
    if strategy.tp > 1 and not strategy.sp:
        raise ValueError("a MoE layer with tp > 1 needs sequence parallelism (Megatron-Core's MoELayer)")
    if layer.add_bias_linear and strategy.expert_tp != 1:
        raise ValueError(f"MoE layers with biases need expert tp 1 (Megatron-Core), got {strategy.expert_tp}")


def _check_megatron_space(plan: Plan) -> None:
    if plan.space != "megatron":
        return
    if not plan.is_uniform_layout():
        raise ValueError("a megatron-space plan uses one TP/DP/ZeRO/SP layout for all layers")
    _check_one_expert_layout(plan)
    kinds = {s.recompute for s in plan.distinct_strategies}
    if "selective" in kinds and len(kinds) > 1:
        raise ValueError("stock Megatron recomputes selectively on all layers or on none")
    # Any chunk sizes are Megatron's: --pipeline-model-parallel-layout spells out the layers of every chunk.


def context_parallel_problem(cp: int, model: ModelSpec) -> Optional[str]:
    """Why `model` cannot run context parallelism `cp`, or None: Megatron-Core needs a sequence that splits
    into 2 x cp chunks (get_batch_on_this_cp_rank), and the cost model prices no multi-latent attention
    layer, nor multi-token prediction, under CP yet (what Transformer Engine's CP attention runs is
    cost.context_parallel.cp_comm_problem's)."""
    if cp == 1:
        return None
    if model.seq_length % (2 * cp):
        return (f"context parallelism {cp} splits each sequence into {2 * cp} chunks, which "
                f"{model.seq_length} tokens do not divide into")
    if any(layer.mla is not None for layer in model.distinct_layers):
        return f"context parallelism with multi-latent attention is not priced yet (model '{model.name}')"
    if model.mtp_num_layers:
        return f"context parallelism with multi-token prediction is not priced yet (model '{model.name}')"
    return None


def _check_multi_token_prediction(plan: Plan) -> None:
    if plan.space != "megatron" and plan.model is not None and plan.model.mtp_num_layers:
        raise ValueError("multi-token prediction is for megatron-space plans (the hybrid runtime builds no MTP "
                         "modules yet)")
    if plan.mtp_chunk is None:
        return
    # Megatron-Core's layout rules (pipeline_parallel_layer_layout.py): MTP after every decoder layer, in the
    # last chunk of its pipeline rank, before the loss's chunk.
    last = len(plan.chunks) - 1
    if not last - plan.pipeline_parallel < plan.mtp_chunk < last:
        raise ValueError(f"mtp_chunk {plan.mtp_chunk}: a standalone MTP chunk is the last chunk of a stage other "
                         f"than the loss's (chunks {last - plan.pipeline_parallel + 1} to {last - 1})")
    if any(chunk.layers for chunk in plan.chunks[plan.mtp_chunk + 1:]):
        raise ValueError(f"mtp_chunk {plan.mtp_chunk}: decoder layers come before the MTP layers")
    if plan.model is not None and not plan.model.mtp_num_layers:
        raise ValueError(f"mtp_chunk {plan.mtp_chunk}: model '{plan.model.name}' has no MTP layers")


def _check_context_parallel(plan: Plan) -> None:
    if plan.space != "megatron" and any(s.cp > 1 for s in plan.distinct_strategies | {plan.embedding}):
        raise ValueError("context parallelism is for megatron-space plans (one layout for every layer)")
    problem = context_parallel_problem(plan.embedding.cp, plan.model) if plan.model is not None else None
    if problem:
        raise ValueError(problem)


def _check_one_expert_layout(plan: Plan) -> None:
    """Megatron's --expert-model/tensor-parallel-size: one (ep, etp) for every MoE layer. Dense layers
    have (1, None) (check_expert_strategy), so more than two pairs, or two beside no dense layer, differ;
    only two pairs on a model with both kinds of layer need the layer-by-layer look."""
    pairs = {(s.ep, s.etp) for s in plan.distinct_strategies}
    if len(pairs) <= 1 or plan.model is None:
        return
    dense = any(layer.moe is None for layer in plan.model.distinct_layers)
    if len(pairs) == 2 and dense and (1, None) in pairs:
        pairs = {(s.ep, s.etp) for layer, s in zip(plan.model.layers, plan.layer_strategies) if layer.moe}
    if len(pairs) > 1:
        raise ValueError("a megatron-space plan uses one ep/etp for all MoE layers")


PLAN_VALIDATORS = (
    _check_space_and_schedule, _check_chunk_count, _check_limits, _check_world_size,
    _check_batch_split, _check_model_match, _check_megatron_space, _check_context_parallel,
    _check_multi_token_prediction,
)


def save_plan(plan: Plan, path: str | Path) -> None:
    """Write the canonical JSON (byte-identical for equal plans); written whole or not at all."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(serde.dumps(plan))
    tmp.replace(path)


def load_plan(path: str | Path) -> Plan:
    """Read a plan file, raising UserError on anything malformed."""
    data = serde.read_json(path, "plan")
    if isinstance(data, dict) and data.get("schema_version", PLAN_SCHEMA_VERSION) != PLAN_SCHEMA_VERSION:
        raise UserError(f"plan file '{path}' has schema_version {data['schema_version']!r}; "
                        f"this megatron-auto reads version {PLAN_SCHEMA_VERSION}")
    if _layers_in_file(data) > MAX_LAYERS:  # before building a record per layer
        raise UserError(f"plan file '{path}' places more than the {MAX_LAYERS} layers megatron-auto plans for "
                        f"(megatron_auto/limits.py)")
    return serde.from_dict(Plan, data, f"plan '{Path(path).name}'")


def _layers_in_file(data: object) -> int:
    """The most layers that the raw JSON's chunks or model list (0 where malformed: from_dict says why)."""
    if not isinstance(data, dict):
        return 0
    chunks = data["chunks"] if isinstance(data.get("chunks"), list) else []
    in_chunks = sum(len(c["layers"]) for c in chunks if isinstance(c, dict) and isinstance(c.get("layers"), list))
    model = data.get("model")
    in_model = len(model["layers"]) if isinstance(model, dict) and isinstance(model.get("layers"), list) else 0
    return max(in_chunks, in_model)
