"""Aten ops that one pass of the runtime's decoder layer dispatches: the count behind a host-time floor.

    .venv/bin/python -m validation.count_host_ops

Builds the layer as profile-model does (profiling.layer_bench.build_layer: the runtime's spec, config and
RoPE), runs one forward and one backward under a TorchDispatchMode on the CPU and prints, per layer shape
and core attention, the ops of the layer's forward and backward, of its core attention alone, and of its
MLP's and two norms' forwards (what selective recompute of mlp and layernorm re-runs). CPU ops
are mapped to what CUDA dispatches where the two differ: CPU's four-op dropout (empty_like, bernoulli_,
div_, mul) counts as CUDA's one native_dropout, and `flash` is counted at attention dropout 0, since on
the CPU SDPA with dropout takes its math path while CUDA's flash kernel drops out inside the kernel.
Megatron DDP's per-parameter main_grad.add_ in backward is not part of the layer and not counted.
"""
from __future__ import annotations

import collections
import dataclasses
import os

import patches  # noqa: F401  (megatron-core imported the way every runtime entry point does)
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from megatron_auto.profiling.layer_bench import LayerBenchSettings, build_layer, rotary_table
from megatron_auto.profiling.model_profile import _setup_megatron
from megatron_auto.specs.model import LayerSpec

SEQ, BATCH, HIDDEN = 16, 2, 64
GPT = LayerSpec(hidden_size=HIDDEN, num_attention_heads=4, num_query_groups=4, ffn_hidden_size=4 * HIDDEN)
LLAMA = dataclasses.replace(GPT, num_query_groups=2, swiglu=True, normalization="RMSNorm", add_bias_linear=False,
                            ffn_hidden_size=2 * HIDDEN)
SHAPES = (("GPT", GPT, None), ("LLaMA-style (RMSNorm, SwiGLU, RoPE, GQA)", LLAMA, 10000))


class OpCount(TorchDispatchMode):
    """Ops dispatched while active, CPU dropout counted as CUDA's one op."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))

    @property
    def cuda_equivalent(self) -> int:
        return sum(self.ops.values()) - 3 * self.ops["bernoulli_"]


def count(call) -> tuple[int, int]:
    """(forward ops, backward ops) of `call()`, whose output's backward is taken with ones."""
    with OpCount() as forward:
        out = call()
    with OpCount() as backward:
        out.backward(torch.ones_like(out))
    return forward.cuda_equivalent, backward.cuda_equivalent


def module_counts(module) -> tuple[int, int]:
    """(MLP forward, both norms' forward) ops: what selective recompute of `mlp` and `layernorm` re-runs."""
    hidden = torch.randn(SEQ, BATCH, HIDDEN, dtype=torch.bfloat16, requires_grad=True)
    module.mlp(hidden)  # warm-up, not counted
    with OpCount() as mlp:
        module.mlp(hidden)
    with OpCount() as norms:
        module.input_layernorm(hidden)
        module.pre_mlp_layernorm(hidden)
    return mlp.cuda_equivalent, norms.cuda_equivalent


def layer_counts(layer: LayerSpec, settings: LayerBenchSettings, core: bool = True) -> tuple[int, ...]:
    """(layer forward, layer backward, core forward, core backward, MLP forward, norms forward) ops; the first two
    alone without `core`."""
    module = build_layer(layer, 1, settings, "cpu")
    rope = rotary_table(layer, SEQ, settings, "cpu")
    hidden = torch.randn(SEQ, BATCH, HIDDEN, dtype=torch.bfloat16, requires_grad=True)
    module(hidden, attention_mask=None, **rope)[0].sum().backward()  # warm-up, not counted
    full = count(lambda: module(hidden, attention_mask=None, **rope)[0])
    if not core:
        return full
    core = module.self_attention.core_attention
    q = torch.randn(SEQ, BATCH, layer.num_attention_heads, layer.kv_channels, dtype=torch.bfloat16,
                    requires_grad=True)
    kv = torch.randn(SEQ, BATCH, layer.num_query_groups, layer.kv_channels, dtype=torch.bfloat16,
                     requires_grad=True)
    return (*full, *count(lambda: core(q, kv, kv, None, attn_mask_type=core.attn_mask_type)), *module_counts(module))


def main() -> None:
    for key, value in (("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0"), ("MASTER_ADDR", "127.0.0.1"),
                       ("MASTER_PORT", "29573")):
        os.environ.setdefault(key, value)
    _setup_megatron()
    print("| layer | core attention | layer forward / backward ops | core attention forward / backward ops "
          "| MLP / norms forward ops |")
    print("|---|---|---|---|---|")
    for name, layer, rotary_base in SHAPES:
        for backend, attention_dropout in (("unfused", 0.1), ("flash", 0.0)):
            settings = LayerBenchSettings(precision="bf16", attention_backend=backend,
                                          attention_dropout=attention_dropout, rotary_base=rotary_base)
            fwd, bwd, core_fwd, core_bwd, mlp, norms = layer_counts(layer, settings)
            print(f"| {name} | {backend} | {fwd} / {bwd} | {core_fwd} / {core_bwd} | {mlp} / {norms} |")


if __name__ == "__main__":
    main()
