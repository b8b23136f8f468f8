"""Megatron-Core 0.16.1's CUDA graphs and fine-grained activation offloading, as TrainingSpec sees them: the names
its flags take and the combinations its TransformerConfig and arguments.py refuse (priced in cost/cuda_graphs.py
and cost/activation_offload.py)."""
from __future__ import annotations

from typing import Optional

CUDA_GRAPH_IMPLS = ("none", "local", "transformer_engine")
"""Megatron-LM's --cuda-graph-impl (--enable-cuda-graph is local, --external-cuda-graph transformer_engine)."""
CUDA_GRAPH_SCOPES = ("attn", "mlp", "moe", "moe_router", "moe_preprocess", "full_iteration")
"""Megatron-LM's --cuda-graph-scope values priced here; none given (or the deprecated `full`): the whole layer.
`mamba` is refused: no Mamba layer is priced."""
OFFLOAD_MODULES = ("attn_norm", "qkv_linear", "core_attn", "attn_proj", "mlp_norm", "expert_fc1", "moe_act")
"""Megatron-LM's --offload-modules: each offloads its module's input (TransformerConfig.offload_modules)."""
DEFAULT_MIN_OFFLOADED_TENSOR_SIZE = 1024 * 1024
"""Megatron-LM's --min-offloaded-tensor-size default, in elements: smaller saved tensors stay on the device."""
ATTENTION_SIDE = frozenset({"attn_norm", "qkv_linear", "core_attn", "attn_proj"})
"""Offloaded modules inside TransformerLayer._forward_attention (what the `attn` graph scope captures)."""


def cuda_graph_problem(impl: str, scopes: tuple[str, ...]) -> Optional[str]:
    """Why Megatron-Core 0.16.1 refuses these CUDA graph settings (transformer_config.py __post_init__ and
    arguments.py's --cuda-graph-scope help), as one line; None when it runs them."""
    if impl not in CUDA_GRAPH_IMPLS:
        return f"--cuda-graph-impl must be one of {', '.join(CUDA_GRAPH_IMPLS)}, got {impl!r}"
    unknown = [scope for scope in scopes if scope not in CUDA_GRAPH_SCOPES]
    if unknown:
        return (f"--cuda-graph-scope {unknown[0]} is not priced; choose among {', '.join(CUDA_GRAPH_SCOPES)} "
                "(none: the whole layer)")
    if len(set(scopes)) != len(scopes):
        return "--cuda-graph-scope lists a scope twice"
    if scopes and impl == "none":
        return "--cuda-graph-scope needs --cuda-graph-impl local or transformer_engine"
    if "full_iteration" in scopes and (impl != "local" or len(scopes) > 1):
        return "--cuda-graph-scope full_iteration runs alone and only with --cuda-graph-impl local"
    if impl == "local" and scopes and scopes != ("full_iteration",):
        return "--cuda-graph-impl local captures whole layers or full_iteration; partial scopes need transformer_engine"
    if "moe" in scopes and "moe_router" in scopes:
        return "--cuda-graph-scope must not contain both moe and moe_router (as in Megatron-Core)"
    if "moe_preprocess" in scopes and "moe_router" not in scopes:
        return "--cuda-graph-scope moe_preprocess needs moe_router (as in Megatron-Core)"
    return None


def offload_problem(modules: tuple[str, ...], min_size: int, graph_impl: str,
                    graph_scopes: tuple[str, ...]) -> Optional[str]:
    """Why Megatron-Core 0.16.1 refuses these --offload-modules, as one line; None when it runs them.
    transformer_config.py checks the names and attn_proj's need of core_attn; its documentation
    (docs/user-guide/features/fine_grained_activation_offloading.md) says a graph's scope may not contain an
    offloaded module."""
    unknown = [module for module in modules if module not in OFFLOAD_MODULES]
    if unknown:
        return f"--offload-modules {unknown[0]} is not one of {', '.join(OFFLOAD_MODULES)}"
    if len(set(modules)) != len(modules):
        return "--offload-modules lists a module twice"
    if "attn_proj" in modules and "core_attn" not in modules:
        return "--offload-modules attn_proj needs core_attn (its input is core_attn's output, as in Megatron-Core)"
    if min_size < 0:
        return f"--min-offloaded-tensor-size must not be negative, got {min_size}"
    if modules and graph_impl != "none" and _graph_holds_offloaded(modules, graph_scopes):
        return ("a CUDA graph's scope may not contain an offloaded module (Megatron-Core's fine-grained offloading "
                "guide): give --cuda-graph-scope parts of the layer that hold none of --offload-modules")
    return None


def _graph_holds_offloaded(modules: tuple[str, ...], scopes: tuple[str, ...]) -> bool:
    """Whether a graph's scope holds one of `modules`: the whole layer holds all; attn its attention side; mlp and
    moe_router the pre-MLP norm (moe_router stops at the router, before the experts); moe the whole MoE side."""
    if not scopes or "full_iteration" in scopes:
        return True
    held = set(ATTENTION_SIDE) if "attn" in scopes else set()
    if {"mlp", "moe_router"} & set(scopes):
        held.add("mlp_norm")
    if "moe" in scopes:
        held |= {"mlp_norm", "expert_fc1", "moe_act"}
    return bool(held & set(modules))
