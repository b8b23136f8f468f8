"""Every rank: the bytes the runtime's MoE (or MLA) layer saves for backward, split over the ranks of one stage.

Usage (RANK/WORLD_SIZE/MASTER_* set): python moe_saved_worker.py CASES.json RESULTS.json
Each case: {"name", "model": uniform_model keywords (every layer MoE), "dispatcher": alltoall or allgather,
"tp": tensor parallel (with sequence parallel above 1, which MoE layers need), "ep", "etp": the experts'
expert-parallel and expert-TP degrees (ep x etp = WORLD_SIZE), optional "modules": selective recompute of those;
"mla" in the model: MLASpec keywords}; every case of one launch has the same degrees.
Layer 0 of the runtime's GPTModel (runtime.model.first_decoder_layer, fp32, unfused attention, dropout 0.1)
runs one forward on this rank's own tokens (s/tp of them under sequence parallel); the results hold, per rank,
profiling.layer_bench.saved_activation_bytes, the token copies this rank's experts processed (0: a dense layer)
and the threads the process held after the case.
"""
from __future__ import annotations

import json
import sys
from dataclasses import replace

import patches

patches.apply_all()

import torch  # noqa: E402

from megatron_auto.profiling.cluster_profile import init_from_env  # noqa: E402
from megatron_auto.profiling.layer_bench import saved_activation_bytes  # noqa: E402
from megatron_auto.parallel_dims import ParallelDims  # noqa: E402
from megatron_auto.runtime.layout import MegatronLayout  # noqa: E402
from megatron_auto.runtime.model import first_decoder_layer  # noqa: E402
from megatron_auto.runtime.settings import MoESettings, TrainSettings  # noqa: E402
from megatron_auto.specs.model import MLASpec, uniform_model  # noqa: E402
from tests.runtime.worker_stats import thread_count  # noqa: E402

SEQ, BATCH = 16, 2


def processed_copies(layer) -> list[int]:
    """Hook on the experts: how many token copies this rank's experts get in the forward."""
    counts = []

    def count(_module, args):
        counts.append(int(torch.as_tensor(args[1]).sum()))  # experts(permuted tokens, tokens_per_expert, ...)
    layer.mlp.experts.register_forward_pre_hook(count)
    return counts


def stage_layout(case: dict, world_size: int) -> MegatronLayout:
    dp = world_size // case["tp"]
    return MegatronLayout(ParallelDims(tp=case["tp"], dp=dp, ep=case["ep"], etp=case["etp"]),
                          micro_batch_size=1, num_micro_batches=1, global_batch_size=dp,
                          sequence_parallel=case["tp"] > 1)


def run_case(case: dict, world_size: int) -> dict:
    from megatron.core import tensor_parallel

    keywords = dict(case["model"])
    if "mla" in keywords:
        keywords["mla"] = MLASpec(**keywords["mla"])
    model = uniform_model(case["name"], **keywords)
    modules = tuple(case.get("modules", ("core_attn",)))
    settings = TrainSettings(precision="fp32", attention_backend="unfused", recompute_modules=modules,
                             moe=replace(MoESettings(), token_dispatcher=case["dispatcher"]))
    recompute = "selective" if "modules" in case else None
    layer, rope = first_decoder_layer(model, settings, torch.device("cpu"), recompute, stage_layout(case, world_size))
    counts = processed_copies(layer) if model.layers[0].moe is not None else [0]
    torch.manual_seed(10 + torch.distributed.get_rank())  # each rank routes its own tokens
    tensor_parallel.model_parallel_cuda_manual_seed(1)
    hidden = torch.randn(SEQ // case["tp"], BATCH, model.layers[0].hidden_size, requires_grad=True)
    saved = saved_activation_bytes(layer, hidden, **rope)
    return {"saved": saved, "processed": counts[0], "threads": thread_count()}


def main(cases_path: str, results_path: str) -> None:
    from megatron.core import parallel_state

    init_from_env()
    world_size = torch.distributed.get_world_size()
    cases = json.loads(open(cases_path).read())
    parallel_state.initialize_model_parallel(cases[0]["tp"], 1, expert_model_parallel_size=cases[0]["ep"],
                                             expert_tensor_parallel_size=cases[0]["etp"])
    results = {case["name"]: run_case(case, world_size) for case in cases}
    everyone = [None] * world_size
    torch.distributed.all_gather_object(everyone, results)
    if torch.distributed.get_rank() == 0:
        with open(results_path, "w") as out:
            json.dump(everyone, out)


if __name__ == "__main__":
    main(*sys.argv[1:3])
