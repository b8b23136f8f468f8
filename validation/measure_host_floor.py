"""Host seconds per layer pass of the runtime's whole training step, per layer structure, core attention
and recompute: the data the cost model's host-time term is to be fitted to.

On a CUDA machine (about 3 minutes on one H100):

    python3 -m validation.measure_host_floor --out host_floor.json

The cost model floors every layer pass at ops x GpuSpec.kernel_launch_s (cost/layer_kernels.py: 66
forward and 86 backward ops of a GPT layer at 25 us on dgx-h100-80gb), whatever the layer's structure
and kernels. Each case here builds the runtime's session on one rank (TP1/PP1, bf16, Megatron DDP with
its per-parameter gradient hooks, the run's optimizer) at a token count so small that the GPU waits
for the host (seq 128, micro-batch 1, hidden 2304): an iteration then takes what the host takes to
issue it. Two depths give the seconds of one layer's forward and backward for one micro-batch (the
slope) and the rest of the iteration (the intercept: embedding, LM head, loss, schedule and optimizer
step). Each row sets the slope beside what the cost model prices for that layer pass at that shape on
dgx-h100-80gb (cost.compute.layer_compute_times plus recompute_time), which at this shape is its floor.

On CPU, `--tiny` runs the same code on hidden 64 (tests/test_measure_host_floor.py); the figures are
then the CPU's kernel time, not a host floor.

The `moe` structure is GPT-OSS 120B's layer as one GPU of its EP8 recipe holds it (16 experts of width h, top-4,
all local here): its row tells whether the host floor the cost model gives a MoE layer's router, dispatcher and
experts (their ops counted on the CPU: cost/moe.py, expert_host_seconds) holds on a GPU (issue 37, the GPT-OSS row).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch

from megatron_auto.cost.compute import layer_compute_times, recompute_time
from megatron_auto.specs.model import ModelSpec, uniform_model
from megatron_auto.specs.presets import CLUSTER_PRESETS


@dataclasses.dataclass(frozen=True)
class Structure:
    """A layer structure as Megatron-LM's flags give it (its GPT-3 and Llama-3 examples)."""

    flags: dict
    """uniform_model keywords."""
    heads_per_query_group: int = 1
    dropout: float = 0.1
    """Hidden and attention dropout (Megatron-LM's default 0.1; its Llama-3 example sets 0)."""
    swiglu_ffn: bool = False
    """The MLP width Llama uses with SwiGLU: 8h/3, rounded down to a multiple of 64."""


LLAMA_FLAGS = dict(swiglu=True, normalization="RMSNorm", add_bias_linear=False, position_embedding_type="rope",
                   untie_embeddings_and_output_weights=True)
STRUCTURES = {
    "gpt": Structure(flags={}),
    "llama": Structure(flags=LLAMA_FLAGS, heads_per_query_group=4, dropout=0.0, swiglu_ffn=True),
    # GPT-OSS 120B's experts on one GPU of its EP8 recipe: 16 local experts, top-4 (all 16 here, on one rank).
    "moe": Structure(flags=dict(LLAMA_FLAGS, num_experts=16, moe_router_topk=4), heads_per_query_group=4,
                     dropout=0.0, swiglu_ffn=True),
}
BACKENDS = ("flash", "unfused")
RECOMPUTES = ("none", "selective", "full")


@dataclasses.dataclass(frozen=True)
class Shape:
    hidden_size: int
    num_attention_heads: int
    seq_length: int
    vocab_size: int
    depths: tuple[int, int]
    micro_batches: int


GPU_SHAPE = Shape(hidden_size=2304, num_attention_heads=24, seq_length=128, vocab_size=51200, depths=(2, 6),
                  micro_batches=4)
TINY_SHAPE = Shape(hidden_size=64, num_attention_heads=4, seq_length=32, vocab_size=256, depths=(1, 2),
                   micro_batches=2)


@dataclasses.dataclass(frozen=True)
class Case:
    structure: str
    backend: str
    recompute: str

    @property
    def name(self) -> str:
        return f"{self.structure}:{self.backend}:{self.recompute}"


def parse_case(text: str) -> Case:
    """`structure:backend:recompute`, each from its list."""
    parts = text.split(":")
    if len(parts) != 3 or parts[0] not in STRUCTURES or parts[1] not in BACKENDS or parts[2] not in RECOMPUTES:
        raise argparse.ArgumentTypeError(f"a case is STRUCTURE:BACKEND:RECOMPUTE with STRUCTURE in "
                                         f"{sorted(STRUCTURES)}, BACKEND in {BACKENDS}, RECOMPUTE in "
                                         f"{RECOMPUTES}; got {text!r}")
    return Case(*parts)


ALL_CASES = tuple(Case(s, b, r) for s in STRUCTURES for b in BACKENDS for r in RECOMPUTES)


def model_spec(structure: str, layers: int, shape: Shape) -> ModelSpec:
    """The model of `structure`, `layers` deep."""
    kind = STRUCTURES[structure]
    ffn = shape.hidden_size * 8 // 3 // 64 * 64 if kind.swiglu_ffn else None
    experts = {"moe_ffn_hidden_size": shape.hidden_size} if "num_experts" in kind.flags else {}  # GPT-OSS: f = h
    return uniform_model(f"host-floor-{structure}", layers, shape.hidden_size, shape.num_attention_heads,
                         shape.seq_length, shape.vocab_size, ffn_hidden_size=ffn,
                         num_query_groups=shape.num_attention_heads // kind.heads_per_query_group, **kind.flags,
                         **experts)


def build_session(case: Case, model, shape: Shape, precision: str, info):
    """The runtime's session of `case` on this rank: TP1/PP1, micro-batch 1, `shape.micro_batches` per step."""
    from megatron_auto.runtime import session
    from megatron_auto.runtime.manual_plan import ManualParallelism, plan_from_flags
    from megatron_auto.runtime.settings import DataSettings, TrainSettings

    recompute = None if case.recompute == "none" else case.recompute
    plan = plan_from_flags(model, 1, ManualParallelism(
        micro_batch_size=1, global_batch_size=shape.micro_batches, recompute_granularity=recompute,
        recompute_method="uniform" if recompute == "full" else None,
        recompute_num_layers=1 if recompute == "full" else None))
    dropout = STRUCTURES[case.structure].dropout
    settings = TrainSettings(precision=precision, hidden_dropout=dropout, attention_dropout=dropout,
                             attention_backend=case.backend,
                             train_iters=10**6, lr=1e-4, clip_grad=1.0, weight_decay=0.01,
                             data=DataSettings(vocab_size=shape.vocab_size))
    return session.build_session(plan, model, settings, info.backend, info.device)


def median_iteration_s(job, warmup: int, iters: int, device: torch.device) -> float:
    """Median wall seconds of `iters` iterations after `warmup` untimed ones, the device drained after each."""
    from megatron_auto.runtime import session

    samples = []
    for index in range(warmup + iters):
        start = time.perf_counter()
        session.run_iteration(job)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if index >= warmup:
            samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def layer_parameters(job) -> int:
    """Parameters of the first decoder layer the session built (what the structure's flags made)."""
    from megatron.core.transformer.transformer_layer import TransformerLayer

    layer = next(m for chunk in job.model for m in chunk.modules() if isinstance(m, TransformerLayer))
    return sum(p.numel() for p in layer.parameters())


def priced_layer_pass_s(model: ModelSpec, case: Case, shape: Shape) -> float:
    """What the cost model prices for one layer's forward, backward and recompute of one micro-batch at
    this shape on dgx-h100-80gb, in bf16: a MoE layer's dense part (attention, norms, router) floored as a
    layer's, and its routed experts beside it with their own floor (cost/moe.py, expert_host_seconds: what a MoE
    case measures)."""
    layer, cluster = model.layers[0], CLUSTER_PRESETS["dgx-h100-80gb"]
    dense = dataclasses.replace(layer, moe=None) if layer.moe is not None else layer
    times = layer_compute_times(dense, shape.seq_length, 1, 1, False, cluster, 2, case.backend)
    priced = times.forward_s + times.backward_s + recompute_time(times, case.recompute)
    if layer.moe is None:
        return priced
    from megatron_auto.cost.moe import expert_compute_times
    from megatron_auto.plan import LayerStrategy
    from megatron_auto.specs.training import TrainingSpec

    forward, backward = expert_compute_times(layer, shape.seq_length, 1, LayerStrategy(), cluster,
                                             TrainingSpec(global_batch_size=shape.micro_batches))
    return priced + forward + backward + (forward if case.recompute == "full" else 0.0)


def measure_case(case: Case, shape: Shape, precision: str, info, warmup: int, iters: int) -> dict:
    """The case's row: per layer pass (the slope over the two depths) and the rest of an iteration."""
    seconds, parameters = [], 0
    for depth in shape.depths:
        model = model_spec(case.structure, depth, shape)
        job = build_session(case, model, shape, precision, info)
        seconds.append(median_iteration_s(job, warmup, iters, info.device))
        parameters = layer_parameters(job)
        del job
        if info.device.type == "cuda":
            torch.cuda.empty_cache()
    (shallow, deep), m = shape.depths, shape.micro_batches
    per_layer = (seconds[1] - seconds[0]) / ((deep - shallow) * m)
    return {"case": case.name, "iteration_s": dict(zip(map(str, shape.depths), seconds)),
            "layer_pass_s": per_layer, "rest_of_iteration_s": seconds[0] - shallow * m * per_layer,
            "priced_layer_pass_s": priced_layer_pass_s(model, case, shape),
            "layer_parameters": parameters, "spec_layer_parameters": model.layers[0].num_parameters}


def table(rows: list[dict]) -> str:
    """Markdown: measured against priced per layer pass, and the rest of the iteration."""
    lines = ["| structure | core attention | recompute | measured ms per layer pass | priced ms | measured / priced "
             "| rest of iteration ms |", "|---|---|---|---|---|---|---|"]
    for row in rows:
        structure, backend, recompute = row["case"].split(":")
        measured, priced = row["layer_pass_s"], row["priced_layer_pass_s"]
        lines.append(f"| {structure} | {backend} | {recompute} | {measured * 1e3:.3f} | {priced * 1e3:.3f} | "
                     f"{measured / priced:.2f} | {row['rest_of_iteration_s'] * 1e3:.2f} |")
    return "\n".join(lines) + "\n"


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiny", action="store_true", help="hidden 64, seq 32, depths 1 and 2 (the CPU test)")
    parser.add_argument("--cases", nargs="+", type=parse_case, default=list(ALL_CASES),
                        help="STRUCTURE:BACKEND:RECOMPUTE each (default: all 18)")
    parser.add_argument("--precision", choices=("bf16", "fp32"), help="default: bf16 on CUDA, fp32 on CPU")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--out", help="write the rows as JSON here")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    from validation.bench_gpu_vs_torch import on_one_rank

    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s", stream=sys.stderr)
    warnings.filterwarnings("ignore", category=UserWarning)
    shape = TINY_SHAPE if args.tiny else GPU_SHAPE
    precision = args.precision or ("bf16" if torch.cuda.is_available() else "fp32")
    rows, info = on_one_rank(lambda info: [measure_case(case, shape, precision, info, args.warmup, args.iters)
                                           for case in args.cases])
    device = torch.cuda.get_device_name(info.device) if info.device.type == "cuda" else "CPU"
    sys.stdout.write(f"{device}, torch {torch.__version__}, {precision}; {shape}\n\n" + table(rows))
    if args.out:
        Path(args.out).write_text(json.dumps({"device": device, "precision": precision,
                                              "shape": dataclasses.asdict(shape), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
