"""TrainingSpec: batch, precision and the byte counts of mixed-precision Adam."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ..kernel_choice import PRICED_ATTENTION, PRICED_OPTIMIZER
from ..limits import MAX_GLOBAL_BATCH
from ..serde import CachedHash

from .host_knobs import DEFAULT_MIN_OFFLOADED_TENSOR_SIZE, cuda_graph_problem, offload_problem
from .model import _check_version
from .optimizer_states import OptimizerStates

DEFAULT_OPTIMIZER_STATES = OptimizerStates()
"""fp32 masters, moments and gradients: Megatron-Core's optimizer without the precision-aware switch."""

TRAINING_SCHEMA_VERSION = 1
GIB = 1024**3
MOE_TOKEN_DISPATCHERS = ("alltoall", "allgather", "flex")
CROSS_ENTROPY_FUSIONS = ("none", "native", "te")
"""How the loss runs: Megatron-Core's vocab-parallel cross entropy, its fused version (--cross-entropy-loss-fusion
--cross-entropy-fusion-impl native) or Transformer Engine's (... te)."""
FLEX_DISPATCHER_BACKENDS = ("deepep", "hybridep")
# Routed tokens on the busiest EP rank over the mean. 1.0 = balanced routing, what the auxiliary loss drives
# toward and a capacity factor of 1 enforces; no measured figure was available (docs/cost_model.md, "MoE").
DEFAULT_MOE_LOAD_IMBALANCE = 1.0
FLEX_BACKEND_SMS = {"deepep": 20, "hybridep": 16}
"""SMs the flex dispatcher's kernels run on by default: megatron-core 0.16.1 TransformerConfig.moe_deepep_num_sms
and moe_hybridep_num_sms (Megatron-LM's --moe-deepep-num-sms, --moe-hybridep-num-sms)."""
RECOMPUTE_MODULES = ("core_attn", "mlp", "layernorm", "moe", "shared_experts", "mla_up_proj")
"""Megatron-Core's --recompute-modules that are priced and run here."""
PRICED_ONLY_RECOMPUTE_MODULES = ("moe_act",)
"""Megatron-Core's --recompute-modules that are priced when given but neither searched nor run here: moe_act, the
experts' activation (output-discarding checkpoint, transformer/moe/experts.py), which needs the grouped GEMM's
CUDA kernel."""
_KNOWN_RECOMPUTE_MODULES = (*RECOMPUTE_MODULES, *PRICED_ONLY_RECOMPUTE_MODULES)
_KNOWN_RECOMPUTE_SET = frozenset(_KNOWN_RECOMPUTE_MODULES)
MOE_RECOMPUTE_MODULES = ("moe", "shared_experts", "moe_act")
"""The ones that act on MoE layers alone: the whole MoELayer (router, dispatch, experts, combine and the
shared expert), the shared expert (megatron/core/transformer/moe/moe_layer.py) and the experts' activation."""
DEFAULT_RECOMPUTE_MODULES = ("core_attn",)
"""Megatron-LM's default --recompute-modules."""
PRECISIONS = ("bf16", "fp16", "fp32", "fp8")
"""What TrainingSpec.precision may be."""
FP8_RECIPES = ("delayed", "tensorwise", "blockwise", "mxfp8")
"""Megatron-LM's --fp8-recipe choices (priced in cost/fp8.py)."""
FP8_FORMATS = ("e4m3", "hybrid")
"""Megatron-LM's --fp8-format choices (hybrid: E4M3 forward, E5M2 gradients)."""
CP_COMM_TYPES = ("p2p", "all_gather", "a2a")
"""Megatron-LM's --cp-comm-type values that are priced (cost/context_parallel.py); a2a+p2p, the hierarchical
one, is not."""


@dataclass(frozen=True)
class KernelFusions:
    """Megatron's fused kernels that change what a layer keeps for backward (cost/memory.py)."""

    bias_activation: bool = False
    """Bias + SwiGLU in one kernel that keeps only its input [Megatron-LM's default; --no-bias-swiglu-fusion]."""
    rope: bool = False
    """RoPE through Transformer Engine's fused kernel, no per-layer cos/sin tables [--apply-rope-fusion]."""


UNFUSED = KernelFusions()


@dataclass(frozen=True)
class TrainingSpec(CachedHash):
    """What the user fixes before any parallelism is chosen."""

    __hash__ = CachedHash.__hash__  # dataclass(frozen=True) would otherwise replace it

    global_batch_size: int
    """Samples per iteration, B."""
    precision: str = "bf16"
    """bf16, fp16, fp32, or fp8 (BF16 weights and activations, the decoder's linear layers in FP8 through
    Transformer Engine: cost/fp8.py): the type of weights and activations in the forward pass."""
    param_bytes: int = 2
    """Bytes per model weight as the forward pass reads it."""
    grad_bytes: int = 4
    """Bytes per gradient: Megatron accumulates into fp32 main_grad buffers."""
    optimizer_bytes: int = 12
    """Bytes of Adam state per parameter: fp32 master copy, momentum and variance.
    (Megatron-LM docs/distrib_optimizer: 18 bytes/param = 2 + 4 + 12 without sharding.) Under the
    precision-aware optimizer, what `optimizer_states` keeps (set from it)."""
    optimizer_states: OptimizerStates = DEFAULT_OPTIMIZER_STATES
    """--use-precision-aware-optimizer and its dtypes (specs/optimizer_states.py): they set optimizer_bytes and,
    with bf16 main gradients, grad_bytes."""
    memory_budget_bytes: int = 0
    """Device memory per GPU a plan may use; 0 means the GPU's usable capacity (GpuSpec.capacity_bytes)."""
    attention_backend: str = "flash"
    """Core attention that runs: flash (SDPA, no s x s scores kept) or unfused (megatron_auto.kernel_choice)."""
    optimizer_impl: str = "fused"
    """Optimizer step that runs: fused (no temporaries) or foreach (megatron_auto.kernel_choice)."""
    schema_version: int = TRAINING_SCHEMA_VERSION
    """Version of this record's layout."""
    memory_margin: Optional[float] = None
    """Safety margin on the budget, a fraction in [0, 1): fits when device memory <= budget x (1 - margin);
    None: the cluster's default (ClusterSpec.memory_margin, derived in docs/cost_model.md)."""
    moe_token_dispatcher: str = "alltoall"
    """How MoE layers move tokens to their experts: alltoall, allgather, or flex (DeepEP's or HybridEP's kernels,
    which send a token once to each node that hosts its experts) [--moe-token-dispatcher-type] (cost/moe.py)."""
    moe_flex_backend: str = "deepep"
    """With the flex dispatcher: deepep or hybridep [--moe-flex-dispatcher-backend]; both move the same bytes."""
    moe_deepep_num_sms: int = FLEX_BACKEND_SMS["deepep"]
    """SMs DeepEP's kernels hold [--moe-deepep-num-sms]: what a hidden flex dispatch takes from the compute beside
    it (cost/comm_interference.py)."""
    moe_hybridep_num_sms: int = FLEX_BACKEND_SMS["hybridep"]
    """SMs HybridEP's kernels hold [--moe-hybridep-num-sms], as moe_deepep_num_sms."""
    moe_ep_overlap: bool = False
    """One micro-batch's dispatch and combine beside another's attention and experts (Megatron-Core's combined
    1F1B schedule) [--overlap-moe-expert-parallel-comm] (cost/ep_overlap.py)."""
    moe_load_imbalance: float = DEFAULT_MOE_LOAD_IMBALANCE
    """Routed tokens on the busiest expert-parallel rank over the mean (>= 1); scales expert time and memory."""
    moe_grouped_gemm: bool = False
    """The experts' GEMMs batched into one grouped GEMM [--moe-grouped-gemm]."""
    moe_shared_expert_overlap: bool = False
    """The shared expert runs on its own stream beside the alltoall dispatch [--moe-shared-expert-overlap]
    (cost/shared_expert.py)."""
    recompute_modules: tuple[str, ...] = DEFAULT_RECOMPUTE_MODULES
    """What `selective` recomputation re-runs in backward [--recompute-modules]: core_attn (the attention
    core), mlp (a dense layer's MLP; Megatron-Core leaves a MoE layer's alone), layernorm (both norms,
    whose outputs are then not kept), moe (a MoE layer's whole MoELayer) and shared_experts (its shared
    expert). `selective_modules` says what that means in each layer."""
    fp8_format: str = "hybrid"
    """With fp8: Megatron-LM's --fp8-format, e4m3 or hybrid (E4M3 forward, E5M2 gradients)."""
    fp8_recipe: str = "delayed"
    """With fp8: Megatron-LM's --fp8-recipe, delayed, tensorwise, blockwise or mxfp8 (cost/fp8.py)."""
    fp8_param_gather: bool = False
    """With fp8: the linear weights are kept in FP8 and gathered as such [--fp8-param-gather]."""
    grad_accumulation_fusion: bool = False
    """Weight gradients accumulated into fp32 main_grad inside the wgrad GEMM (Megatron-LM's
    --gradient-accumulation-fusion, on by default with TE or apex; the runtime's `auto` on GPUs): no separate
    accumulation pass (cost/layer_kernels.py, weight_grad_accumulation_bytes)."""
    tp_comm_overlap: bool = False
    """Transformer Engine overlaps the SP all-gathers and reduce-scatters with the GEMMs [--tp-comm-overlap]
    (cost/tp_overlap.py)."""
    bias_activation_fusion: bool = False
    """Megatron's fused bias + activation runs (the runtime's --bias-fusions on; Megatron-LM's default): a SwiGLU
    MLP keeps 3f per token instead of 4f (cost/memory.py mlp_saved_width)."""
    rope_fusion: bool = False
    """RoPE runs Transformer Engine's fused kernel (Megatron-LM's --apply-rope-fusion default where TE imports;
    the runtime leaves it off): no per-layer cos/sin tables are kept."""
    cross_entropy_fusion: str = "none"
    """CROSS_ENTROPY_FUSIONS: with te, Transformer Engine's fused cross entropy keeps the logits in their own type
    and writes their gradient over them, with no fp32 softmax beside them (cost/memory.py, cost/layer_kernels.py)."""
    fused_norms: bool = False
    """The layers run Transformer Engine's spec, whose norms are fused into the next GEMM
    (TELayerNormColumnParallelLinear): megatron-core then leaves `layernorm` recomputation undone
    (transformer_layer.py recomputes a norm only when it is a module of its own), so it frees nothing."""
    cuda_graph_impl: str = "none"
    """CUDA graphs that replay the layers' kernels without the host issuing each op: none, local (Megatron-Core's
    own) or transformer_engine (TE's make_graphed_callables) [--cuda-graph-impl; --enable-cuda-graph is local,
    --external-cuda-graph transformer_engine] (cost/cuda_graphs.py). megatron-auto's runtime does not capture them."""
    cuda_graph_scope: tuple[str, ...] = ()
    """What each layer's graphs capture [--cuda-graph-scope]: () the whole layer; attn, mlp, moe, moe_router,
    moe_preprocess (transformer_engine) or full_iteration (local) (specs/host_knobs.py)."""
    offload_modules: tuple[str, ...] = ()
    """Modules whose saved input goes to host memory over PCIe in forward and comes back in backward
    [--fine-grained-activation-offloading --offload-modules] (cost/activation_offload.py); () is off.
    megatron-auto's runtime keeps every activation on the device."""
    min_offloaded_tensor_size: int = DEFAULT_MIN_OFFLOADED_TENSOR_SIZE
    """Saved tensors of fewer elements stay on the device [--min-offloaded-tensor-size]."""
    cp_comm_type: str = "p2p"
    """How Transformer Engine's attention runs context parallelism [--cp-comm-type]: p2p (the K/V ring), all_gather
    (K and V gathered whole) or a2a (Q, K, V and the output exchanged all-to-all, each rank attending for 1/cp of
    the heads over the whole sequence) (cost/context_parallel.py). The local spec's CP attention all-gathers
    whatever it says."""

    def __post_init__(self) -> None:
        _check_version(self.schema_version, TRAINING_SCHEMA_VERSION, "training spec")
        if not 0 < self.global_batch_size <= MAX_GLOBAL_BATCH:
            raise ValueError(f"global batch size must be positive and at most {MAX_GLOBAL_BATCH} "
                             f"(megatron_auto/limits.py), got {self.global_batch_size}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")
        self._check_fp8()
        self._apply_optimizer_states()
        if self.memory_budget_bytes < 0:
            raise ValueError("memory budget must not be negative")
        if self.attention_backend not in PRICED_ATTENTION:
            raise ValueError(f"attention backend must be one of {PRICED_ATTENTION}, got {self.attention_backend!r}")
        if self.memory_margin is not None and not 0.0 <= self.memory_margin < 1.0:
            raise ValueError(f"memory margin must be a fraction in [0, 1), got {self.memory_margin}")
        if self.optimizer_impl not in PRICED_OPTIMIZER:
            raise ValueError(f"optimizer implementation must be one of {PRICED_OPTIMIZER}, "
                             f"got {self.optimizer_impl!r}")
        self._check_moe()
        self._check_recompute_modules()
        problem = (cuda_graph_problem(self.cuda_graph_impl, self.cuda_graph_scope)
                   or offload_problem(self.offload_modules, self.min_offloaded_tensor_size, self.cuda_graph_impl,
                                      self.cuda_graph_scope))
        if problem:
            raise ValueError(problem)
        if self.cp_comm_type not in CP_COMM_TYPES:
            raise ValueError(f"--cp-comm-type must be one of {', '.join(CP_COMM_TYPES)} (a2a+p2p is not priced), "
                             f"got {self.cp_comm_type!r}")
        if self.cross_entropy_fusion not in CROSS_ENTROPY_FUSIONS:
            raise ValueError(f"cross entropy fusion must be one of {', '.join(CROSS_ENTROPY_FUSIONS)}, "
                             f"got {self.cross_entropy_fusion!r}")

    def _apply_optimizer_states(self) -> None:
        """Megatron-Core's checks of the precision-aware optimizer, and the bytes its states keep."""
        states = self.optimizer_states
        if states is DEFAULT_OPTIMIZER_STATES:  # the common case, and every search's replace() of it
            return
        problem = states.problem()
        if problem:
            raise ValueError(problem)
        if not states.precision_aware:
            return
        if self.precision == "fp32":
            raise ValueError("--use-precision-aware-optimizer needs 16-bit or fp8 training, not fp32")
        object.__setattr__(self, "optimizer_bytes", states.adam_bytes(self.precision, self.fp8_recipe))
        if states.main_grads_dtype == "bf16":
            object.__setattr__(self, "grad_bytes", 2)

    def _check_fp8(self) -> None:
        if self.fp8_format not in FP8_FORMATS:
            raise ValueError(f"fp8 format must be one of {', '.join(FP8_FORMATS)}, got {self.fp8_format!r}")
        if self.fp8_recipe not in FP8_RECIPES:
            raise ValueError(f"fp8 recipe must be one of {', '.join(FP8_RECIPES)}, got {self.fp8_recipe!r}")
        if self.fp8_param_gather and not self.fp8:
            raise ValueError("--fp8-param-gather needs fp8 training (--precision fp8)")

    @property
    def fusions(self) -> KernelFusions:
        return KernelFusions(bias_activation=self.bias_activation_fusion, rope=self.rope_fusion)

    @property
    def flex_backend_sms(self) -> int:
        """The SMs the flex dispatcher's chosen backend holds (moe_deepep_num_sms or moe_hybridep_num_sms)."""
        return self.moe_deepep_num_sms if self.moe_flex_backend == "deepep" else self.moe_hybridep_num_sms

    @property
    def fp8(self) -> bool:
        """The decoder's linear layers run in FP8 (cost/fp8.py)."""
        return self.precision == "fp8"

    def _check_recompute_modules(self) -> None:
        modules = self.recompute_modules
        if not modules or len(set(modules)) != len(modules) or not _KNOWN_RECOMPUTE_SET.issuperset(modules):
            raise ValueError(f"recompute modules must be distinct names among {', '.join(_KNOWN_RECOMPUTE_MODULES)}, "
                             f"got {' '.join(modules) or 'none'}")
        if "moe_act" not in modules:
            return
        if not self.moe_grouped_gemm:
            raise ValueError("--recompute-modules moe_act needs --moe-grouped-gemm (as in Megatron-Core)")
        if self.fp8 and self.fp8_recipe == "delayed":
            raise ValueError("--recompute-modules moe_act does not run under FP8 delayed scaling (as in Megatron-Core)")

    def selective_modules(self, layer) -> frozenset[str]:
        """What selective recomputation re-runs in `layer` (a LayerSpec), in the cost model's terms: core_attn,
        layernorm, mlp (the dense part's MLP: a dense layer's, or a MoE layer's shared expert) and moe (the
        routed experts with their router and dispatch), mla_up_proj (an MLA layer's up projections and RoPE),
        moe_act (the routed experts' activation).

        Megatron-Core's transformer_layer.py sets recompute_mlp only for layers whose MLP is not a MoELayer
        and recomputes no fused norm (a MoE layer's pre-MLP norm, a module of its own even in TE's spec, is
        conservatively left kept too); MoELayer checkpoints the shared expert under shared_experts, and the
        whole layer, shared expert included, under moe."""
        modules = frozenset(self.recompute_modules)
        if self.fused_norms:
            modules -= {"layernorm"}
        if layer.mla is None:
            modules -= {"mla_up_proj"}
        if layer.moe is None:
            return modules - set(MOE_RECOMPUTE_MODULES)
        recomputed = modules & {"core_attn", "layernorm", "moe", "mla_up_proj", "moe_act"}
        if layer.moe.shared_expert_ffn_hidden_size and modules & set(MOE_RECOMPUTE_MODULES):
            recomputed |= {"mlp"}
        return recomputed

    def _check_moe(self) -> None:
        if self.moe_token_dispatcher not in MOE_TOKEN_DISPATCHERS:
            raise ValueError(f"MoE token dispatcher must be one of {', '.join(MOE_TOKEN_DISPATCHERS)}, "
                             f"got {self.moe_token_dispatcher!r}")
        if self.moe_shared_expert_overlap and self.moe_token_dispatcher != "alltoall":
            raise ValueError("--moe-shared-expert-overlap only works with the alltoall token dispatcher "
                             f"(as in Megatron-Core), not {self.moe_token_dispatcher}")
        if self.moe_flex_backend not in FLEX_DISPATCHER_BACKENDS:
            raise ValueError(f"flex dispatcher backend must be one of {', '.join(FLEX_DISPATCHER_BACKENDS)}, "
                             f"got {self.moe_flex_backend!r}")
        self._check_ep_overlap()
        if not 1.0 <= self.moe_load_imbalance < float("inf"):
            raise ValueError(f"MoE load imbalance must be a finite number >= 1, got {self.moe_load_imbalance}")
        if min(self.moe_deepep_num_sms, self.moe_hybridep_num_sms) < 1:
            raise ValueError("--moe-deepep-num-sms and --moe-hybridep-num-sms must be at least 1")

    def _check_ep_overlap(self) -> None:
        """What Megatron-Core 0.16.1's TransformerConfig refuses beside --overlap-moe-expert-parallel-comm."""
        if not self.moe_ep_overlap:
            return
        if self.moe_token_dispatcher == "allgather":
            raise ValueError("--overlap-moe-expert-parallel-comm works with the alltoall or flex token dispatcher "
                             "(as in Megatron-Core), not allgather")
        if self.moe_shared_expert_overlap:
            raise ValueError("--overlap-moe-expert-parallel-comm and --moe-shared-expert-overlap exclude each other "
                             "(as in Megatron-Core)")
        if self.precision == "fp32":
            raise ValueError("--overlap-moe-expert-parallel-comm needs a 16-bit model (bf16, fp16 or fp8), not fp32")

    @property
    def activation_bytes(self) -> int:
        """Bytes per activation element (2 in 16-bit training, as Korthikanti et al. assume)."""
        return 4 if self.precision == "fp32" else 2

    def budget_for(self, gpu_memory_bytes: int) -> int:
        return self.memory_budget_bytes or gpu_memory_bytes

    def margin_for(self, cluster_margin: float) -> float:
        """The safety margin in force: this spec's, else the cluster's default."""
        return cluster_margin if self.memory_margin is None else self.memory_margin

    @classmethod
    def fp32(cls, global_batch_size: int, memory_budget_bytes: int = 0, attention_backend: str = "unfused",
             optimizer_impl: str = "foreach", memory_margin: Optional[float] = None, **moe) -> "TrainingSpec":
        """Full fp32 training, as on CPU: 4-byte weights and grads, 8 bytes of Adam moments
        (and by default the CPU's kernels, megatron_auto.kernel_choice); `moe`: the moe_* fields."""
        return cls(global_batch_size=global_batch_size, precision="fp32", param_bytes=4,
                   grad_bytes=4, optimizer_bytes=8, memory_budget_bytes=memory_budget_bytes,
                   attention_backend=attention_backend, optimizer_impl=optimizer_impl, memory_margin=memory_margin,
                   **moe)

    @classmethod
    def for_precision(cls, precision: str, global_batch_size: int, **options) -> "TrainingSpec":
        """The spec of a run in `precision`: fp32's byte counts for fp32, mixed precision's otherwise;
        `options` are the other fields (budget, kernels, margin)."""
        if precision == "fp32":
            return cls.fp32(global_batch_size, **options)
        return cls(global_batch_size=global_batch_size, precision=precision, **options)


_INTERNED: dict = {}


def interned(training: TrainingSpec) -> TrainingSpec:
    """The first training spec seen equal to `training`. The cost model's caches are keyed on training specs: keys
    that are one object match by identity, where equal copies are compared field by field on every hit."""
    if len(_INTERNED) > 4096:
        _INTERNED.clear()
    return _INTERNED.setdefault(training, training)


def recompute_modules_problem(layers, modules) -> Optional[str]:
    """Why selective recompute of `modules` cannot run on a model of these LayerSpecs, or None.

    megatron-core 0.16.1 recomputes a dense MLP through tensor_parallel.checkpoint, whose outputs then
    include the fc2 bias Parameter (MLP returns it apart, skip_bias_add); the checkpoint's backward
    re-enters itself through that bias without end (measured: a GPT layer with --recompute-modules mlp
    never finishes its first backward; a bias-free MLP, --disable-bias-linear, trains)."""
    if "mlp" in modules and any(layer.add_bias_linear and layer.moe is None for layer in layers):
        return ("--recompute-modules mlp: megatron-core 0.16.1 cannot recompute an MLP with linear biases (its "
                "checkpoint never ends the backward); recompute mlp with --disable-bias-linear, or choose "
                "core_attn/layernorm")
    if "mla_up_proj" in modules and not any(layer.mla is not None for layer in layers):
        # TransformerConfig.__post_init__ raises the same.
        return "--recompute-modules mla_up_proj needs --multi-latent-attention"
    return None
