"""The kernels one run uses, chosen once: layer spec, core attention, fusions, optimizer step.

Both runtimes (stock and hybrid) and the layer profiler build their layers from
here, so the kernels measured, priced and run are the same. The choice of
`auto` is megatron_auto.kernel_choice' (flash + fused on GPUs, unfused + foreach on CPU).

- Layer spec: Transformer Engine's when it imports on a CUDA host (its own fused
  attention, chosen by Megatron's `attention_backend`), else Megatron-Core's local
  spec with the core attention swapped: SDPAttention (runtime/attention.py) for
  `flash`, Megatron's DotProductAttention for `unfused`.
- Fusions: Megatron's bias-activation (bias + GeLU / SwiGLU) and bias-dropout-add
  fusions, which megatron-core compiles with torch.compile (megatron/core/jit.py),
  on CUDA only and with `--bias-fusions on` only: `auto` keeps them off, since their
  host cost exceeds what they save (megatron_auto.kernel_choice says by how much). On CPU
  they run and match (tests/runtime/test_kernels_runtime.py), but the compile costs
  ~13 s per process the first time (~1.5 s from inductor's cache; measured on this
  repository's 2-core test machine) and the CPU's measured profiles were taken without
  them. Megatron's bias-GeLU kernel computes the tanh approximation of GeLU (as
  Megatron-LM's default runs do). masked_softmax_fusion
  needs apex: off.
- Optimizer step: torch AdamW with `fused=True` (one kernel per step, no
  per-parameter temporaries) or its `foreach` default; see use_optimizer_impl.
- Weight-gradient accumulation: Megatron's `gradient_accumulation_fusion` with
  `--grad-accumulation-fusion on`, or `auto` on GPUs (apex's extension, else the torch
  stand-in once its start-up check passed on this GPU: torch_wgrad_checked): the
  linear layers add each weight gradient into its fp32 main_grad inside their
  backward; without apex through patches/wgrad_accumulation_torch.py. Only parts that
  Megatron DDP wraps have a main_grad: ZeRO-3 segments of the hybrid runtime run without.

Apart from the accumulation stand-in, none of these patches megatron-core: the attention
is a layer-spec choice, the fusions are TransformerConfig fields, and the Adam step is
torch's own per-group flag, set on the torch AdamW that megatron-core 0.16.1 builds without apex/TE (it offers no option
for it). tests/runtime/test_kernels_runtime.py fails if upstream stops building one.
"""
from __future__ import annotations

import copy
import functools
import logging
from dataclasses import dataclass

import torch

from .. import kernel_choice as choices
from ..specs.model import LayerSpec, ModelSpec
from .optimizer_parts import inner_optimizers

logger = logging.getLogger(__name__)

_TE_BACKENDS = {"auto": "auto", "flash": "flash", "fused": "fused", "unfused": "unfused", "local": "unfused"}
"""Megatron-LM's --attention-backend -> Transformer Engine's backend (AttnBackend), under TE's spec."""


def cuda_host() -> bool:
    """True when this process sees a CUDA device (then the GPU's kernels run and are priced)."""
    return torch.cuda.is_available()


def use_matmul_flags(disable_bf16_reduced_precision_matmul: bool) -> None:
    """--disable-bf16-reduced-precision-matmul, as Megatron-LM sets it (CUDA only; no-op on CPU)."""
    if disable_bf16_reduced_precision_matmul:
        torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False


@functools.lru_cache(maxsize=None)
def transformer_engine_available() -> bool:
    """True when Transformer Engine imports on a CUDA host (then its fused layer spec is used)."""
    try:
        import transformer_engine  # noqa: F401
    except Exception:  # any import failure means "not usable here"
        return False
    return torch.cuda.is_available()


@dataclass(frozen=True)
class RunKernels:
    """The kernels of one run, resolved for this host."""

    layer_spec: str
    """transformer_engine or local (Megatron-Core's names for the two layer specs)."""
    attention: str
    """flash (SDPA) or unfused (DotProductAttention): what the planner prices (kernels.PRICED_ATTENTION)."""
    attention_request: str
    """The --attention-backend given (Megatron-LM's name); sets TE's backend under its spec."""
    bias_activation_fusion: bool
    """Megatron's fused bias + GeLU/SwiGLU."""
    bias_dropout_fusion: bool
    """Megatron's fused bias + dropout + residual add."""
    optimizer_impl: str
    """fused (torch Adam fused=True) or foreach (torch's default)."""
    grad_accumulation_fusion: bool = False
    """Megatron's gradient_accumulation_fusion: weight gradients added into main_grad by the GEMM."""
    grouped_gemm: bool = False
    """MoE experts as one grouped GEMM (TE's TEGroupedMLP, or Megatron's GroupedMLP on the grouped_gemm
    package); False: SequentialMLP, one GEMM per local expert (the same math)."""
    moe: bool = False
    """Whether the model has MoE layers (then describe() names the experts' kernel)."""
    mla: bool = False
    """Whether the layers are multi-latent attention (whose unfused core is runtime/attention.py's
    MLADotProductAttention)."""

    def describe(self) -> str:
        """One log line naming every choice."""
        if self.layer_spec == "transformer_engine":
            attention = f"Transformer Engine ({_TE_BACKENDS[self.attention_request]})"
        else:
            unfused = "MLADotProductAttention (unfused, MLA's head widths)" if self.mla else \
                "Megatron DotProductAttention (unfused)"
            attention = "torch SDPA (flash)" if self.attention == "flash" else unfused
        return (f"kernels: layer spec {self.layer_spec}, core attention {attention}, "
                f"bias-activation fusion {_on(self.bias_activation_fusion)}, "
                f"bias-dropout-add fusion {_on(self.bias_dropout_fusion)}, masked-softmax fusion off, "
                f"optimizer Adam step {self.optimizer_impl}, "
                f"weight-gradient accumulation fusion {_wgrad_fusion(self.grad_accumulation_fusion)}"
                + self._experts())

    def _experts(self) -> str:
        if not self.moe:
            return ""
        return ", MoE experts " + ("grouped GEMM" if self.grouped_gemm else "SequentialMLP (a GEMM per expert)")


def _on(flag: bool) -> str:
    return "on" if flag else "off"


def _wgrad_fusion(on: bool) -> str:
    if not on:
        return "off"
    return "on (apex)" if apex_wgrad_available() else "on (torch GEMM, patches/wgrad_accumulation_torch.py)"


@functools.lru_cache(maxsize=None)
def apex_wgrad_available() -> bool:
    """True when apex's fused weight-gradient extension imports (Megatron-LM then fuses by default)."""
    try:
        import fused_weight_gradient_mlp_cuda  # noqa: F401
    except Exception:  # any import failure means "not usable here"
        return False
    return True


@functools.lru_cache(maxsize=None)
def torch_wgrad_checked() -> bool:
    """True when CUDA is present and the torch stand-in for apex's weight-gradient GEMM
    (patches/wgrad_accumulation_torch.py) adds into an fp32 main_grad on this process's GPU as apex's
    kernel does (its accumulation_error check, run once); a failed check is logged and leaves `auto` off."""
    if apex_wgrad_available() or not torch.cuda.is_available():
        return False
    from patches import wgrad_accumulation_torch

    problem = wgrad_accumulation_torch.accumulation_error(torch.device("cuda", torch.cuda.current_device()))
    if problem:
        logger.warning("weight-gradient accumulation fusion stays off under auto: %s", problem)
    return problem is None


def grouped_gemm_available(spec: str, on_gpu: bool) -> bool:
    """Whether the experts' grouped GEMM runs: TE's TEGroupedMLP under its spec, else Megatron's
    GroupedMLP on the grouped_gemm package (CUDA kernels)."""
    if spec == "transformer_engine":
        return True
    from megatron.core.transformer.moe import grouped_gemm_util

    return on_gpu and grouped_gemm_util.grouped_gemm_is_available()


def choose_kernels(layer: LayerSpec, attention_backend: str = "auto", optimizer_impl: str = "auto",
                   on_gpu: bool | None = None, fusions: tuple[bool, bool] = (True, True),
                   bias_fusions: str = "auto", grad_accumulation_fusion: str = "auto",
                   grouped_gemm: bool = False, moe: bool = False) -> RunKernels:
    """The kernels of layers like `layer` for the requested backends (`auto` resolved for this host);
    `bias_fusions` (auto/on/off) whether Megatron's bias fusions run, and `fusions` whether each
    (bias-activation, bias-dropout-add) is allowed (Megatron-LM's --no-bias-*-fusion flags);
    `grad_accumulation_fusion` (auto/on/off) megatron_auto.kernel_choice.resolve_grad_accumulation_fusion's;
    `grouped_gemm` (--moe-grouped-gemm) runs where its kernel is available, else SequentialMLP."""
    on_gpu = torch.cuda.is_available() if on_gpu is None else on_gpu
    fused = choices.resolve_bias_fusions(bias_fusions, on_gpu)
    spec = "transformer_engine" if on_gpu and transformer_engine_available() else "local"
    return RunKernels(
        layer_spec=spec,
        attention=choices.resolve_attention_backend(attention_backend, on_gpu),
        attention_request=attention_backend,
        # Megatron's bias-GeLU kernel needs a bias; its SwiGLU kernel runs with or without one
        # (TransformerConfig.__post_init__ refuses GeLU fusion without bias); it has none for squared ReLU.
        bias_activation_fusion=fused and fusions[0] and (layer.swiglu or (layer.add_bias_linear
                                                                         and not layer.squared_relu)),
        bias_dropout_fusion=fused and fusions[1],
        optimizer_impl=choices.resolve_optimizer_impl(optimizer_impl, on_gpu),
        grad_accumulation_fusion=choices.resolve_grad_accumulation_fusion(
            grad_accumulation_fusion, apex_wgrad_available(),
            grad_accumulation_fusion == "auto" and on_gpu and torch_wgrad_checked()),
        grouped_gemm=moe and grouped_gemm and grouped_gemm_available(spec, on_gpu),
        moe=moe,
        mla=layer.mla is not None,
    )


def config_flags(kernels: RunKernels) -> dict:
    """TransformerConfig's kernel fields for `kernels` (the fusions without apex/TE stay off)."""
    flags = dict(
        bias_activation_fusion=kernels.bias_activation_fusion,
        bias_dropout_fusion=kernels.bias_dropout_fusion,
        gradient_accumulation_fusion=kernels.grad_accumulation_fusion,
        # These need apex or Transformer Engine kernels, absent from the local spec's host.
        masked_softmax_fusion=False,
        apply_rope_fusion=False,
        persist_layer_norm=False,
    )
    if kernels.layer_spec == "transformer_engine":
        from megatron.core.transformer.enums import AttnBackend

        flags["attention_backend"] = AttnBackend[_TE_BACKENDS[kernels.attention_request]]
    return flags


def layer_spec(layer: LayerSpec, kernels: RunKernels):
    """The TransformerLayer spec that runs `kernels`: TE's, or the local one with its core attention set;
    a MoE layer's MLP is Megatron-Core's MoELayer (its router, dispatcher and experts); an MLA layer's
    attention is Megatron-Core's MLASelfAttention (its latent projections and norms, under --qk-layernorm).

    Unfused MLA runs attention.MLADotProductAttention: Megatron-Core 0.16.1's DotProductAttention does not
    take the head widths MLASelfAttention passes its core (attention.py)."""
    from megatron.core.models.gpt import gpt_layer_specs

    experts = dict(num_experts=layer.moe.num_experts if layer.moe else None, moe_grouped_gemm=kernels.grouped_gemm)
    shape = dict(qk_layernorm=layer.qk_layernorm, multi_latent_attention=layer.mla is not None, **experts)
    if kernels.layer_spec == "transformer_engine":
        return gpt_layer_specs.get_gpt_layer_with_transformer_engine_spec(**shape)
    spec = gpt_layer_specs.get_gpt_layer_local_spec(normalization=layer.normalization, **shape)
    if kernels.attention == "flash" or layer.mla is not None:
        from .attention import MLADotProductAttention, SDPAttention

        spec = copy.deepcopy(spec)
        core = SDPAttention if kernels.attention == "flash" else MLADotProductAttention
        spec.submodules.self_attention.submodules.core_attention = core
    return spec


def kernels_for_run(model: ModelSpec, settings) -> RunKernels:
    """choose_kernels for a run's TrainSettings (its attention_backend and optimizer_impl)."""
    return choose_kernels(model.layers[0], settings.attention_backend, settings.optimizer_impl,
                          fusions=(settings.bias_activation_fusion, settings.bias_dropout_fusion),
                          bias_fusions=settings.bias_fusions,
                          grad_accumulation_fusion=settings.grad_accumulation_fusion,
                          grouped_gemm=settings.moe.grouped_gemm,
                          moe=any(layer.moe is not None for layer in model.layers))


def torch_adams(optimizer) -> list:
    """The torch Adam/AdamW instances inside a Megatron optimizer (chained or not).

    megatron-core 0.16.1 builds torch.optim.AdamW when neither apex nor TE is installed
    (megatron/core/optimizer/__init__.py); with them it builds their FusedAdam, found here as none.
    """
    found = []
    for inner in inner_optimizers(optimizer):
        torch_optimizer = getattr(inner, "optimizer", None)
        if isinstance(torch_optimizer, torch.optim.Adam):
            found.append(torch_optimizer)
    return found


def _set_impl(adam, impl: str) -> None:
    """Switch torch Adam's step implementation, and keep each `step` count where that one expects it."""
    fused = impl == "fused"
    for group in [adam.defaults, *adam.param_groups]:
        group["fused"], group["foreach"] = fused, not fused
    for param, state in adam.state.items():
        if "step" in state:
            # fused: a float32 scalar on the parameter's device; foreach: one on the CPU. A copy per
            # parameter: a loaded state may share one tensor, which each update would advance.
            device = param.device if fused else torch.device("cpu")
            state["step"] = state["step"].detach().to(dtype=torch.float32, device=device).clone()


def use_run_optimizer_impl(optimizer, settings) -> int:
    """use_optimizer_impl with the run's --optimizer-impl (TrainSettings.optimizer_impl, auto resolved)."""
    return use_optimizer_impl(optimizer, choices.resolve_optimizer_impl(settings.optimizer_impl,
                                                                        torch.cuda.is_available()))


def use_optimizer_impl(optimizer, impl: str) -> int:
    """Run the torch Adams of `optimizer` with `impl` (fused or foreach), also after every
    load_state_dict (a loaded param group carries the saving run's flags); returns how many."""
    adams = torch_adams(optimizer)
    for adam in adams:
        _set_impl(adam, impl)
        adam.register_load_state_dict_post_hook(functools.partial(_set_impl, impl=impl))
    if not adams and impl == "foreach":
        logger.warning("apex/Transformer Engine FusedAdam runs the optimizer step; --optimizer-impl foreach "
                       "has no effect")
    return len(adams)
