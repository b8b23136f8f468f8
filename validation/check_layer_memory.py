"""The activation formula against one layer's saved tensors on this device, attention kind by kind.

Command (one process; torchrun-style env vars optional; on a GPU about a minute):
    python3 -m validation.check_layer_memory [--out layer_memory.json]

For each case (GPT: multi-head, learned positions; Llama-style: grouped queries 4:1 and RoPE; Qwen-style:
RoPE and q/k norms; multi-query with RoPE; a MoE layer with a shared expert, 8 experts, top-2; all SwiGLU
except GPT) layer 0 of the runtime's own GPTModel is built (runtime.config + runtime.model: its spec and
kernels, dropout 0.1) and one forward's saved tensors are counted (saved-tensor hooks, each storage once);
the cost model's activation bytes for the same shape (cost.layer_cost, the routed experts included) are
printed beside them. The unfused core also keeps the cached s x s causal mask, which the formula leaves out
on purpose, so it is added to the prediction. On a GPU: bf16, flash (SDPA) and unfused, hidden 1024, 16
heads, sequence 2048, micro-batch 2. On the CPU: fp32, unfused only (torch's CPU SDPA keeps
the s x s probabilities under dropout, which no GPU kernel does), hidden 64, sequence 16, and LayerNorm for
RMSNorm (torch's eager CPU RMSNorm also keeps its normalized input, which the formula does not count;
whether CUDA's does is what the GPU run shows).
Exit status 1 when a case is off by more than 1%.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from megatron_auto.cost.layer_cost import layer_cost
from megatron_auto.plan import LayerStrategy
from megatron_auto.specs.model import uniform_model
from megatron_auto.specs.presets import CLUSTER_PRESETS
from megatron_auto.specs.training import TrainingSpec

TOLERANCE = 0.01
SHAPES = {
    "gpt": dict(),
    "llama-gqa-rope": dict(swiglu=True, add_bias_linear=False, normalization="RMSNorm", num_query_groups=4,
                           position_embedding_type="rope"),
    "qwen-qknorm-rope": dict(swiglu=True, add_bias_linear=False, normalization="RMSNorm", num_query_groups=4,
                             position_embedding_type="rope", qk_layernorm=True),
    "mqa-rope": dict(swiglu=True, add_bias_linear=False, num_query_groups=1, position_embedding_type="rope"),
    "moe-shared": dict(swiglu=True, add_bias_linear=False, normalization="RMSNorm", num_query_groups=4,
                       position_embedding_type="rope", num_experts=8, moe_router_topk=2,
                       moe_shared_expert_intermediate_size=256),
}


def device_setup() -> dict:
    """Sizes, precision and attention kinds for this device."""
    import torch

    if torch.cuda.is_available():
        return dict(hidden=1024, heads=16, seq=2048, batch=2, precision="bf16", backends=("flash", "unfused"),
                    cluster=CLUSTER_PRESETS["dgx-h100-80gb"], normalization=None)
    return dict(hidden=64, heads=16, seq=16, batch=2, precision="fp32", backends=("unfused",),
                cluster=CLUSTER_PRESETS["cpu-gloo"], normalization="LayerNorm")


def measure(name: str, shape: dict, backend: str, setup: dict, device) -> dict:
    """One case: measured and predicted bytes of one forward's saved tensors."""
    import torch

    from megatron_auto.profiling.layer_bench import saved_activation_bytes
    from megatron_auto.runtime.config import DTYPES
    from megatron_auto.runtime.kernels import transformer_engine_available
    from megatron_auto.runtime.model import first_decoder_layer
    from megatron_auto.runtime.settings import TrainSettings

    if setup["normalization"]:
        shape = dict(shape, normalization=setup["normalization"])
    model = uniform_model(name, 1, setup["hidden"], setup["heads"], setup["seq"], 1024, **shape)
    layer, seq, batch = model.layers[0], setup["seq"], setup["batch"]
    module, rope = first_decoder_layer(model, TrainSettings(precision=setup["precision"], attention_backend=backend),
                                       device)
    hidden = torch.randn(seq, batch, layer.hidden_size, device=device, dtype=DTYPES[setup["precision"]],
                         requires_grad=True)
    measured = saved_activation_bytes(module, hidden, **rope)
    te_spec = device.type == "cuda" and transformer_engine_available()  # the spec the runtime built
    training = TrainingSpec(batch, precision=setup["precision"], attention_backend=backend, fused_norms=te_spec)
    predicted = layer_cost(layer, LayerStrategy(tp=1, dp=1), batch, seq, setup["cluster"], training).activation_bytes
    predicted += seq * seq if backend == "unfused" else 0  # the cached causal mask (bool)
    return dict(case=name, backend=backend, measured_bytes=measured, predicted_bytes=predicted,
                error=(predicted - measured) / measured)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="write the rows as JSON here")
    args = parser.parse_args(argv)
    from megatron_auto.profiling.model_profile import _setup_megatron

    device, setup = _setup_megatron(), device_setup()
    rows = [measure(name, shape, backend, setup, device) for name, shape in SHAPES.items()
            for backend in setup["backends"]]
    print(f"| case | core | measured MiB | predicted MiB | error |  ({setup['precision']}, h {setup['hidden']}, "
          f"s {setup['seq']}, b {setup['batch']}, device {device})")
    for row in rows:
        print(f"| {row['case']} | {row['backend']} | {row['measured_bytes'] / 2**20:.3f} | "
              f"{row['predicted_bytes'] / 2**20:.3f} | {100 * row['error']:+.2f}% |")
    if args.out:
        described = {key: value for key, value in setup.items() if key != "cluster"}
        Path(args.out).write_text(json.dumps(dict(setup=described, rows=rows), indent=2) + "\n")
    return 1 if any(abs(row["error"]) > TOLERANCE for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
