"""Aten ops of a MoE layer's routed side and of multi-latent attention: the counts behind their host-time floors.

    .venv/bin/python -m validation.count_moe_host_ops

As validation.count_host_ops does for a dense layer, runs one forward and one backward on the CPU under a
TorchDispatchMode and prints:
- the routed side of the runtime's MoE layer (MoELayer.forward without its shared expert: router, dispatcher,
  SequentialMLP experts, combine) at 4 and 8 experts for each dispatcher, and the base and per-expert counts
  they give (cost/moe.py HOST_OPS_ROUTED), with the router's and the preprocess's share (HOST_OPS_ROUTER,
  HOST_OPS_PREPROCESS);
- TEGroupedMLP._apply_bias at 4 and 8 experts (HOST_OPS_GROUPED_FC2_BIAS);
- the LLaMA-style layer under multi-latent attention, with and without a query down-projection, beside the same
  layer with standard attention (cost/layer_kernels.py MLA_HOST_OPS).
The counts do not depend on the sizes: the shapes are tiny.
"""
from __future__ import annotations

import dataclasses
import os

import torch

from megatron_auto.profiling.layer_bench import LayerBenchSettings
from megatron_auto.profiling.model_profile import _setup_megatron
from megatron_auto.specs.model import MLASpec, uniform_model
from validation.count_host_ops import LLAMA, OpCount, layer_counts

SEQ, BATCH, HIDDEN = 16, 2, 64


def moe_layer(experts: int, dispatcher: str):
    """The runtime's MoELayer (layer 0's MLP) with `experts` SequentialMLP experts, top-2, no shared expert."""
    from megatron_auto.runtime.model import first_decoder_layer
    from megatron_auto.runtime.settings import MoESettings, TrainSettings

    model = uniform_model("count", 2, HIDDEN, 4, SEQ, 256, ffn_hidden_size=128, num_query_groups=2, swiglu=True,
                          normalization="RMSNorm", add_bias_linear=False, position_embedding_type="rope",
                          hidden_dropout=0.0, attention_dropout=0.0, num_experts=experts, moe_router_topk=2,
                          moe_ffn_hidden_size=64)
    settings = TrainSettings(precision="bf16", attention_backend="flash",
                             moe=dataclasses.replace(MoESettings(), token_dispatcher=dispatcher))
    return first_decoder_layer(model, settings, torch.device("cpu"))[0].mlp


def routed_counts(experts: int, dispatcher: str) -> tuple[int, int, int, int, int]:
    """(forward, backward, router forward, router backward, preprocess forward) ops of the routed side."""
    moe = moe_layer(experts, dispatcher)
    hidden = torch.randn(SEQ, BATCH, HIDDEN, dtype=torch.bfloat16, requires_grad=True)
    moe(hidden)[0].sum().backward()  # warm-up, not counted
    with OpCount() as forward:
        out = moe(hidden)[0]
    with OpCount() as backward:
        out.backward(torch.ones_like(out))
    with OpCount() as router:
        probs, routing_map = moe.route(hidden)
    gradient, kept = torch.ones_like(probs), probs.detach()
    with OpCount() as router_backward:
        probs.backward(gradient)
    with OpCount() as preprocess:
        moe.preprocess(hidden, kept, routing_map)
    return (forward.cuda_equivalent, backward.cuda_equivalent, router.cuda_equivalent,
            router_backward.cuda_equivalent, preprocess.cuda_equivalent)


def bias_counts(experts: int) -> tuple[int, int]:
    """(forward, backward) ops of TEGroupedMLP._apply_bias over `experts` experts of 6 tokens each."""
    from megatron.core.transformer.moe.experts import TEGroupedMLP

    tokens = 6
    output = torch.randn(experts * tokens, HIDDEN, dtype=torch.bfloat16, requires_grad=True)
    biases = [torch.randn(HIDDEN, dtype=torch.bfloat16, requires_grad=True) for _ in range(experts)]
    probs = torch.rand(experts * tokens, 1, dtype=torch.bfloat16, requires_grad=True)
    with OpCount() as forward:
        out = TEGroupedMLP._apply_bias(output, biases, [tokens] * experts, probs)
    gradient = torch.ones_like(out)
    with OpCount() as backward:
        out.backward(gradient)
    return forward.cuda_equivalent, backward.cuda_equivalent


def print_routed() -> None:
    print("| dispatcher | experts | forward / backward ops | router forward / backward | preprocess forward |")
    print("|---|---|---|---|---|")
    for dispatcher in ("alltoall", "allgather"):
        rows = {experts: routed_counts(experts, dispatcher) for experts in (4, 8)}
        for experts, (forward, backward, router, router_backward, preprocess) in rows.items():
            print(f"| {dispatcher} | {experts} | {forward} / {backward} | {router} / {router_backward} "
                  f"| {preprocess} |")
        per_forward, per_backward = ((rows[8][i] - rows[4][i]) // 4 for i in (0, 1))
        print(f"| {dispatcher} | base + per expert | {rows[4][0] - 4 * per_forward} + {per_forward} E / "
              f"{rows[4][1] - 4 * per_backward} + {per_backward} E | | |")


def main() -> None:
    for key, value in (("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0"), ("MASTER_ADDR", "127.0.0.1"),
                       ("MASTER_PORT", "29574")):
        os.environ.setdefault(key, value)
    _setup_megatron()
    print_routed()
    four, eight = bias_counts(4), bias_counts(8)
    print(f"\nTEGroupedMLP._apply_bias forward / backward ops: 4 experts {four[0]} / {four[1]}, "
          f"8 experts {eight[0]} / {eight[1]}")
    settings = LayerBenchSettings(precision="bf16", attention_backend="flash", attention_dropout=0.0,
                                  rotary_base=10000)
    mla = MLASpec(kv_lora_rank=32, qk_head_dim=16, qk_pos_emb_head_dim=8, v_head_dim=16, q_lora_rank=24)
    print("\n| layer (LLaMA-style, flash) | forward / backward ops |\n|---|---|")
    for name, spec in (("standard attention", LLAMA),
                       ("MLA with q_lora_rank", dataclasses.replace(LLAMA, num_query_groups=4, mla=mla)),
                       ("MLA without", dataclasses.replace(LLAMA, num_query_groups=4,
                                                           mla=dataclasses.replace(mla, q_lora_rank=None)))):
        print(f"| {name} | {' / '.join(map(str, layer_counts(spec, settings, core=False)))} |")


if __name__ == "__main__":
    main()
