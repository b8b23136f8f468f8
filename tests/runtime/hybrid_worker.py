"""One rank of a hybrid equivalence launch: run hybrid plans of a tiny GPT in turn.

Usage (per rank, RANK/WORLD_SIZE/MASTER_* set): python hybrid_worker.py CASES.json RESULTS.json
Each case: {"name", optional "model" ("gpt", "llama", "qwen3" or "mla"), "plan": plan.json path or
{"chunks": [[strategy, ...], ...], "embedding": strategy, "micro_batches": m, "virtual_stages": v},
"init": state-dict path (optional for plans: else the seeded weights), optional "reference": true
(stock single-process run that saves its initial state dict to "init"), optional "dropout": p
(hidden and attention dropout), optional "probe": true (before training, every rank draws 4 numbers
per segment inside the segment's TP-region dropout stream and 4 outside it; gathered as
"probe": [{"tp", "inside": [per rank], "outside": [per rank]}]), optional "steps", optional
"settings" (TrainSettings fields, e.g. precision, attention_backend), optional "data_vocab_size" (mock tokens drawn
from fewer ids than the padded vocabulary, so that training has something to learn), optional
"drop_grad_sync": true (a broken run: the parts' DP gradient reductions skipped)}.
The last rank writes {name: {"losses", "grad_norms", "loss_scales", "skipped", "param_dtypes", "kernels",
"seconds", "threads" (the process's threads at the end of the case, its session alive), "threads_closed" (after
session.close)[, "probe"]}}.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import sys
import time

import patches

patches.apply_all()

import torch  # noqa: E402

from megatron_auto.plan import Chunk, LayerStrategy, Plan, load_plan  # noqa: E402
from megatron_auto.runtime import distributed, session  # noqa: E402
from megatron_auto.runtime.manual_plan import ManualParallelism, plan_from_flags  # noqa: E402
from megatron_auto.runtime.settings import DataSettings, TrainSettings  # noqa: E402
from megatron_auto.specs.model import uniform_model  # noqa: E402
from tests.runtime.worker_models import llama_model, mla_model, qwen3_model  # noqa: E402
from tests.runtime.worker_stats import thread_count  # noqa: E402

MODEL = uniform_model("hybrid-gpt", num_layers=4, hidden_size=64, num_attention_heads=4,
                      seq_length=32, vocab_size=256)
MODELS = {"gpt": MODEL, "llama": llama_model("hybrid-llama"), "qwen3": qwen3_model("hybrid-qwen3"),
          "mla": mla_model("hybrid-mla")}
SETTINGS = TrainSettings(train_iters=5, lr=1e-3, hidden_dropout=0.0, attention_dropout=0.0, clip_grad=1.0,
                         weight_decay=0.01, seed=1234, timeout_s=90.0, make_vocab_size_divisible_by=64,
                         data=DataSettings(vocab_size=256))
GLOBAL_BATCH = 8


def hybrid_plan(spec: dict, world: int) -> Plan:
    """A hybrid Plan from a compact case description."""
    chunks = tuple(Chunk(tuple(LayerStrategy(**s) for s in layers)) for layers in spec["chunks"])
    virtual = spec.get("virtual_stages", 1)
    return Plan(space="hybrid", world_size=world, pipeline_parallel=len(chunks) // virtual,
                global_batch_size=GLOBAL_BATCH, num_micro_batches=spec.get("micro_batches", 2), chunks=chunks,
                embedding=LayerStrategy(**spec["embedding"]), virtual_stages=virtual)


def probe_dropout_streams(run) -> list[dict]:
    """Per segment: what each rank draws inside its TP-region dropout stream and outside it."""
    from megatron.core.tensor_parallel import get_cuda_rng_tracker

    out = []
    for chunk in run.model:
        for strategy, rng in zip(chunk.decoder.strategies, chunk.decoder.rngs):
            with rng.active(), get_cuda_rng_tracker().fork():
                inside = torch.rand(4).tolist()
            outside = torch.rand(4).tolist()
            gathered = [None] * torch.distributed.get_world_size()
            torch.distributed.all_gather_object(gathered, (inside, outside))
            out.append({"tp": strategy.tp, "inside": [g[0] for g in gathered], "outside": [g[1] for g in gathered]})
    return out


def run_kernels(run) -> dict:
    """The core-attention classes, the torch Adam step flags (fused, foreach) and the weight-gradient
    accumulation of each kind of part this rank ran."""
    from megatron_auto.runtime.kernels import torch_adams

    cores = {type(m).__name__ for chunk in run.model for n, m in chunk.named_modules() if n.endswith("core_attention")}
    flags = {(g["fused"], g["foreach"]) for adam in torch_adams(run.optimizer) for g in adam.param_groups}
    # (part is FSDP2/ZeRO-3, its linear layers accumulate weight gradients in the GEMM)
    wgrad = {(type(part).__name__ == "ShardedPart", m.gradient_accumulation_fusion) for chunk in run.model
             for part in getattr(chunk, "wrapped", [chunk]) for m in part.modules()
             if hasattr(m, "gradient_accumulation_fusion")}
    return {"cores": sorted(cores), "adam_flags": sorted(flags), "wgrad_fusion": sorted(wgrad)}


def run_case(case: dict, info) -> tuple[dict, object]:
    """The case's results and its session (still open)."""
    world = torch.distributed.get_world_size()
    dropout = case.get("dropout", 0.0)
    settings = dataclasses.replace(SETTINGS, train_iters=case.get("steps", 5), hidden_dropout=dropout,
                                   attention_dropout=dropout, **case.get("settings", {}),
                                   data=DataSettings(vocab_size=case.get("data_vocab_size", 256)))
    model = MODELS[case.get("model", "gpt")]
    if case.get("reference"):
        plan = plan_from_flags(model, world, ManualParallelism(global_batch_size=GLOBAL_BATCH, micro_batch_size=2))
        run = session.build_session(plan, model, settings, info.backend, info.device)
        torch.save(run.model[0].module.state_dict(), case["init"])
    else:
        spec = case["plan"]
        plan = load_plan(spec) if isinstance(spec, str) else hybrid_plan(spec, world)
        state = torch.load(case["init"], weights_only=True) if case.get("init") else None
        run = session.build_session(plan, model, settings, info.backend, info.device, initial_state=state)
    if case.get("drop_grad_sync"):  # a negative control: no part's data-parallel gradients are reduced
        for chunk in run.model:
            for part in chunk.wrapped:
                part.finish_grad_sync = lambda **_: None
    probe = probe_dropout_streams(run) if case.get("probe") else None
    results = session.train(run)
    out = {"losses": [r.loss for r in results], "grad_norms": [r.grad_norm for r in results],
           "loss_scales": [r.loss_scale for r in results], "skipped": [r.skipped for r in results],
           "param_dtypes": sorted({str(p.dtype) for chunk in run.model for p in chunk.parameters()}),
           "kernels": run_kernels(run)}
    return (out if probe is None else {**out, "probe": probe}), run


def main() -> None:
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    cases = json.load(open(sys.argv[1]))
    info = distributed.init_distributed(SETTINGS.timeout_s)
    results = {}
    for case in cases:
        started = time.monotonic()
        out, run = run_case(case, info)
        out.update(seconds=time.monotonic() - started, threads=thread_count())
        session.close(run)  # here, where no local of run_case still holds a part of the model
        results[case["name"]] = {**out, "threads_closed": thread_count()}
    if torch.distributed.get_rank() == torch.distributed.get_world_size() - 1:
        json.dump(results, open(sys.argv[2], "w"), indent=1)
    distributed.shutdown()


if __name__ == "__main__":
    main()
