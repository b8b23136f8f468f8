"""Time and size one Megatron-Core TransformerLayer at a TP shard's shapes.

TP emulation (documented in docs/cost_model.md): the shard of rank r under TP
degree t holds a/t query heads, g/t key/value groups and f/t MLP columns of
width-h layers. Building a tp=1 TransformerLayer with exactly those widths
(kv_channels pinned to h/a) runs the same GEMM and element-wise shapes on one
process, without the TP all-reduces, which the cluster profile prices.
Activation bytes: the storages the forward pass saves for backward (saved-tensor
hooks, each storage counted once, parameters excluded); on GPUs also the growth
of torch.cuda.memory_allocated across the forward.
Times are per call of back-to-back blocks that all ranks start together and
that end when the last rank is done (timing.block_seconds), so they include the
share of the cores a rank gets beside the other ranks; the backward is timed
alone, each call after an untimed forward (a difference of two blocks came out
at zero under load).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch

from ..specs.model import LayerSpec
from ..specs.profiles import LayerTiming
from .timing import block_seconds

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class LayerBenchSettings:
    """How the layer runs: what the runtime uses by default (tools/pretrain_gpt.py)."""

    precision: str = "fp32"
    hidden_dropout: float = 0.1
    attention_dropout: float = 0.1
    iters: int = 5
    attention_backend: str = "auto"
    """--attention-backend, resolved as the runtime does (runtime/kernels.py)."""
    optimizer_impl: str = "auto"
    """--optimizer-impl, resolved as the runtime does."""
    grad_accumulation_fusion: str = "auto"
    """--grad-accumulation-fusion, resolved as the runtime does."""
    bias_fusions: str = "auto"
    """--bias-fusions, resolved as the runtime does (on runs Megatron's bias fusions on GPUs only)."""
    rotary_base: Optional[int] = None
    """RoPE's base for a rope model (each layer then rotates its queries and keys, as in GPTModel); None:
    the model has learned or no position embeddings, which live outside the layers."""
    rotary_percent: float = 1.0
    """Share of each head's channels that RoPE rotates (--rotary-percent)."""


def bench_kernels(layer: LayerSpec, settings: LayerBenchSettings):
    """The kernels the runtime would run for `layer` on this host (runtime/kernels.choose_kernels)."""
    from ..runtime.kernels import choose_kernels

    return choose_kernels(layer, settings.attention_backend, settings.optimizer_impl,
                          bias_fusions=settings.bias_fusions,
                          grad_accumulation_fusion=settings.grad_accumulation_fusion)


def sharded_config(layer: LayerSpec, tp: int, settings: LayerBenchSettings):
    """A tp=1 TransformerConfig at the widths of one of `tp` shards (MLATransformerConfig for a multi-latent
    attention layer: its heads split, its latent down-projections whole, as each TP rank computes them in full
    before it keeps its share)."""
    from ..runtime.config import config_class, layer_fields
    from ..runtime.kernels import config_flags

    dtype = DTYPES[settings.precision]
    fields = layer_fields(layer)
    fields.update(num_attention_heads=layer.num_attention_heads // tp, num_query_groups=layer.num_query_groups // tp,
                  ffn_hidden_size=layer.ffn_hidden_size // tp)
    return config_class(layer)(
        num_layers=1, **fields,
        hidden_dropout=settings.hidden_dropout, attention_dropout=settings.attention_dropout,
        params_dtype=dtype, pipeline_dtype=dtype, bf16=settings.precision == "bf16",
        fp16=settings.precision == "fp16", use_cpu_initialization=True,
        **config_flags(bench_kernels(layer, settings)),
    )


def build_layer(layer: LayerSpec, tp: int, settings: LayerBenchSettings, device):
    """Megatron-Core's TransformerLayer on the runtime's spec and kernels (runtime/kernels.py)."""
    from megatron.core.transformer.spec_utils import build_module

    from ..runtime.kernels import layer_spec

    config = sharded_config(layer, tp, settings)
    spec = layer_spec(layer, bench_kernels(layer, settings))
    # Every weight in the run's precision (norms too), as Megatron-LM's Float16Module casts the model.
    module = build_module(spec, config=config, layer_number=1).to(device=device, dtype=DTYPES[settings.precision])
    if config.gradient_accumulation_fusion:  # the fp32 buffers Megatron DDP would give the weights
        for param in module.parameters():
            param.main_grad = torch.zeros_like(param, dtype=torch.float32)
    return module


def rotary_table(layer: LayerSpec, seq: int, settings: LayerBenchSettings, device) -> dict:
    """The layer's keyword for GPTModel's RoPE table of `seq` positions ({} without RoPE, and under multi-latent
    attention, which computes its own RoPE)."""
    if settings.rotary_base is None or layer.mla is not None:
        return {}
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding

    rotary = RotaryEmbedding(kv_channels=layer.kv_channels, rotary_percent=settings.rotary_percent,
                             rotary_base=settings.rotary_base,
                             use_cpu_initialization=True)
    return {"rotary_pos_emb": rotary(seq).to(device)}


def saved_activation_bytes(module: torch.nn.Module, hidden: torch.Tensor, **rope) -> int:
    """Bytes of the distinct non-parameter storages the forward pass saves for backward, counted when the
    forward has returned (selective recompute of `layernorm` frees a saved norm output's storage then)."""
    output, saved = saved_bytes_of(lambda: module(hidden, attention_mask=None, **rope), module)
    del output
    return saved


def saved_bytes_of(forward: Callable[[], object], module: torch.nn.Module) -> tuple[object, int]:
    """`forward()`'s result and the bytes of the distinct storages it saved for backward, other than
    `module`'s parameters, counted once it has returned."""
    params = {p.untyped_storage().data_ptr() for p in module.parameters()}
    seen: dict[int, torch.UntypedStorage] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in params:
            seen[storage.data_ptr()] = storage
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        output = forward()
    return output, sum(storage.nbytes() for storage in seen.values())


def _core_attention_seconds(module, seq: int, micro_batch: int, iters: int, device, dtype, barrier) -> float:
    """Forward seconds of the attention core alone (what selective recompute re-runs)."""
    attention = module.self_attention
    heads = attention.num_attention_heads_per_partition
    groups = attention.num_query_groups_per_partition
    width = attention.hidden_size_per_attention_head
    q = torch.randn(seq, micro_batch, heads, width, device=device, dtype=dtype)
    # K/V keep their groups: each core shares them over the heads itself (repeating them first crashed).
    kv = torch.randn(seq, micro_batch, groups, width, device=device, dtype=dtype)
    core = attention.core_attention
    with torch.no_grad():
        return block_seconds(lambda: core(q, kv, kv, None, attn_mask_type=core.attn_mask_type), iters,
                             barrier=barrier)


def measure_layer(layer: LayerSpec, tp: int, micro_batch: int, seq: int, settings: LayerBenchSettings,
                  device, barrier: Callable[[], object] = lambda: None) -> LayerTiming:
    """Forward, backward and attention-core seconds (timing.block_seconds, between `barrier`s
    shared with the other ranks) and the bytes of one shard."""
    module = build_layer(layer, tp, settings, device)
    dtype = DTYPES[settings.precision]
    hidden = torch.randn(seq, micro_batch, layer.hidden_size, device=device, dtype=dtype, requires_grad=True)
    grad = torch.randn_like(hidden)
    rope = rotary_table(layer, seq, settings, device)
    state: dict[str, torch.Tensor] = {}

    def forward() -> None:
        state["out"] = module(hidden, attention_mask=None, **rope)[0]

    def backward() -> None:
        state["out"].backward(grad)

    forward_s = block_seconds(forward, settings.iters, barrier=barrier)
    backward_s = block_seconds(backward, settings.iters, barrier=barrier, untimed=forward)
    core_s = _core_attention_seconds(module, seq, micro_batch, settings.iters, device, dtype, barrier)
    param_bytes = sum(p.numel() * p.element_size() for p in module.parameters())
    activations = saved_activation_bytes(module, hidden, **rope)
    return LayerTiming(tp=tp, micro_batch=micro_batch, seq_length=seq, forward_s=forward_s,
                       backward_s=backward_s, attention_core_forward_s=core_s,
                       activation_bytes=activations, param_bytes=param_bytes)


def optimizer_seconds_per_state_byte(layer: LayerSpec, settings: LayerBenchSettings, device,
                                     barrier: Callable[[], object] = lambda: None) -> float:
    """Seconds of torch Adam (plus grad-norm clipping) per byte of fp32 state (4+4+8 per weight).

    Adam steps fp32 weights in every precision: with bf16/fp16 these are the optimizer's
    fp32 master copies (Megatron's Float16OptimizerWithFloat16Params)."""
    module = build_layer(layer, 1, settings, device)
    params = [torch.nn.Parameter(p.detach().float()) for p in module.parameters()]
    for p in params:
        p.grad = torch.randn_like(p)
    fused = bench_kernels(layer, settings).optimizer_impl == "fused"
    optimizer = torch.optim.Adam(params, lr=1e-4, fused=fused, foreach=not fused)

    def step() -> None:
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()

    seconds = block_seconds(step, settings.iters, warmup=2, barrier=barrier)
    numel = sum(p.numel() for p in params)
    return seconds / (numel * 16)
