"""One process: the layer that profile-model times against the layer that training runs.

Usage (RANK/WORLD_SIZE/MASTER_* set, one rank): python layer_bench_worker.py CASES.json RESULTS.json
Each case: {"name", "model": uniform_model keywords, "attention": flash|unfused, "precision", and
optionally "rotary_percent"}. For each,
the runtime's first decoder layer (runtime.config.transformer_config + runtime.model.build_chunks at
TP1/PP1, with GPTModel's own RoPE table) and profiling.layer_bench.build_layer's layer (with
layer_bench.rotary_table) run one forward and one backward on the same input; the results hold each
layer's parameters (name, shape, dtype) and the aten ops each pass dispatched, in order.
"""
from __future__ import annotations

import json
import sys

import patches

patches.apply_all()

import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from megatron_auto.profiling import layer_bench  # noqa: E402
from megatron_auto.profiling.model_profile import _setup_megatron  # noqa: E402
from megatron_auto.runtime.config import transformer_config  # noqa: E402
from megatron_auto.parallel_dims import ParallelDims  # noqa: E402
from megatron_auto.runtime.layout import MegatronLayout  # noqa: E402
from megatron_auto.runtime.model import build_chunks  # noqa: E402
from megatron_auto.runtime.settings import TrainSettings  # noqa: E402
from megatron_auto.specs.model import uniform_model  # noqa: E402

SEQ, BATCH = 16, 2


class OpLog(TorchDispatchMode):
    """The names of the aten ops dispatched while active."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


def runtime_layer(model, settings: TrainSettings):
    """(layer 0 of the runtime's GPTModel, its forward keywords)."""
    layout = MegatronLayout(ParallelDims(), micro_batch_size=BATCH, num_micro_batches=1,
                            global_batch_size=BATCH)
    config = transformer_config(model, layout, settings, "gloo")
    chunk = build_chunks(model, layout, settings, config, model.vocab_size, torch.device("cpu"))[0]
    chunk = chunk.to(layer_bench.DTYPES[settings.precision])
    rope = {}
    if model.position_embedding_type == "rope":
        rope = {"rotary_pos_emb": chunk.rotary_pos_emb(SEQ)}
    return chunk.decoder.layers[0], rope


def bench_layer(model, settings: TrainSettings):
    """(the layer profile-model times, its forward keywords)."""
    layer = model.layers[0]
    bench = layer_bench.LayerBenchSettings(
        precision=settings.precision, hidden_dropout=settings.hidden_dropout,
        attention_dropout=settings.attention_dropout, attention_backend=settings.attention_backend,
        rotary_base=model.rotary_base if model.position_embedding_type == "rope" else None,
        rotary_percent=settings.rotary_percent)
    module = layer_bench.build_layer(layer, 1, bench, torch.device("cpu"))
    return module, layer_bench.rotary_table(layer, SEQ, bench, torch.device("cpu"))


def trace(module, rope: dict, hidden_size: int, dtype) -> dict:
    """Parameters and the ops of one forward and one backward (after one untraced warm-up pair)."""
    hidden = torch.randn(SEQ, BATCH, hidden_size, dtype=dtype, requires_grad=True)
    module(hidden, attention_mask=None, **rope)[0].sum().backward()
    with OpLog() as forward:
        out = module(hidden, attention_mask=None, **rope)[0]
    grad = torch.ones_like(out)
    with OpLog() as backward:
        out.backward(grad)
    params = [[name, list(p.shape), str(p.dtype)] for name, p in module.named_parameters()]
    return {"params": params, "forward": forward.ops, "backward": backward.ops}


def run_case(case: dict) -> dict:
    model = uniform_model(case["name"], **case["model"])
    settings = TrainSettings(precision=case["precision"], attention_backend=case["attention"],
                             rotary_percent=case.get("rotary_percent", 1.0))
    dtype = layer_bench.DTYPES[case["precision"]]
    results = {}
    for side, build in (("runtime", runtime_layer), ("bench", bench_layer)):
        torch.manual_seed(0)
        module, rope = build(model, settings)
        results[side] = trace(module, rope, model.layers[0].hidden_size, dtype)
    return results


def main(cases_path: str, results_path: str) -> None:
    _setup_megatron()
    cases = json.loads(open(cases_path).read())
    results = {case["name"]: run_case(case) for case in cases}
    with open(results_path, "w") as out:
        json.dump(results, out)


if __name__ == "__main__":
    main(*sys.argv[1:3])
