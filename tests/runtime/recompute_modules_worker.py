"""One process: the bytes the runtime's decoder layer saves for backward under each --recompute-modules set.

Usage (RANK/WORLD_SIZE/MASTER_* set, one rank): python recompute_modules_worker.py CASES.json RESULTS.json
Each case: {"name", "model": uniform_model keywords, "modules": [...]}. For each, layer 0 of the runtime's
GPTModel (runtime.model.first_decoder_layer at TP1/PP1, fp32, unfused attention, dropout 0.1; with RoPE,
the rotary table its GPTModel passes) runs one forward without recompute
and one under `--recompute-granularity selective` with the case's modules; the results hold
profiling.layer_bench.saved_activation_bytes of each, whether the two backward passes gave the same
input gradient, and the threads the process held after the case.
"""
from __future__ import annotations

import json
import sys

import patches

patches.apply_all()

import torch  # noqa: E402

from megatron_auto.profiling.layer_bench import saved_activation_bytes  # noqa: E402
from megatron_auto.profiling.model_profile import _setup_megatron  # noqa: E402
from megatron_auto.runtime.model import first_decoder_layer  # noqa: E402
from megatron_auto.runtime.settings import TrainSettings  # noqa: E402
from megatron_auto.specs.model import MLASpec, uniform_model  # noqa: E402
from tests.runtime.worker_stats import thread_count  # noqa: E402

SEQ, BATCH = 16, 2


def runtime_layer(model, modules: list[str], recompute: str | None):
    """Layer 0 of the runtime's GPTModel under this recompute, and its RoPE keywords."""
    settings = TrainSettings(precision="fp32", attention_backend="unfused", recompute_modules=tuple(modules))
    return first_decoder_layer(model, settings, torch.device("cpu"), recompute)


def saved_and_grad(layer, rope: dict, hidden_size: int) -> tuple[int, torch.Tensor]:
    """Saved bytes of one forward, and the input gradient of its backward (the same dropout seed each time)."""
    from megatron.core import tensor_parallel

    torch.manual_seed(1)
    tensor_parallel.model_parallel_cuda_manual_seed(1)
    hidden = torch.randn(SEQ, BATCH, hidden_size, requires_grad=True)
    saved = saved_activation_bytes(layer, hidden, **rope)
    torch.manual_seed(2)
    tensor_parallel.model_parallel_cuda_manual_seed(2)
    layer(hidden, attention_mask=None, **rope)[0].sum().backward()
    return saved, hidden.grad


def case_model(case: dict):
    """The case's model: uniform_model keywords, with an "mla" entry as MLASpec keywords."""
    keywords = dict(case["model"])
    if "mla" in keywords:
        keywords["mla"] = MLASpec(**keywords["mla"])
    return uniform_model(case["name"], **keywords)


def run_case(case: dict) -> dict:
    model = case_model(case)
    h = model.layers[0].hidden_size
    plain, plain_grad = saved_and_grad(*runtime_layer(model, case["modules"], None), h)
    recomputed, grad = saved_and_grad(*runtime_layer(model, case["modules"], "selective"), h)
    return {"none": plain, "selective": recomputed, "same_gradient": bool(torch.equal(grad, plain_grad)),
            "gradient_max_diff": float((grad - plain_grad).abs().max()), "gradient_max": float(plain_grad.abs().max()),
            "threads": thread_count()}


def main(cases_path: str, results_path: str) -> None:
    _setup_megatron()
    cases = json.loads(open(cases_path).read())
    with open(results_path, "w") as out:
        json.dump({case["name"]: run_case(case) for case in cases}, out)


if __name__ == "__main__":
    main(*sys.argv[1:3])
