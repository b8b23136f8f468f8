"""The run's kernels side by side on one layer: SDPA (`flash`) vs Megatron's unfused core attention, and
torch Adam's fused vs foreach step. Runs on the GPU when there is one, else on the CPU.

Command (one process; replaces its section of docs/benchmarks.md unless --no-docs):
    OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.bench_kernels [--hidden 256 --heads 8 --seq 512
        --micro-batch 1 --precision fp32 --attention-dropout 0.0 --iters 5] [--no-docs]

Per attention backend: forward and backward seconds of one Megatron-Core TransformerLayer on the
runtime's spec (profiling/layer_bench.measure_layer: blocks of back-to-back calls) and the bytes its
forward saves for backward. Per optimizer step: seconds of one Adam step over the layer's weights,
and on CUDA the memory the step allocates above its state (the foreach step's temporaries).
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

import torch

from benchmarks.docs_sections import write_section
from megatron_auto.profiling.layer_bench import LayerBenchSettings, build_layer, measure_layer
from megatron_auto.specs.model import uniform_model

ROOT = Path(__file__).resolve().parents[1]

HEADING = "## Kernels: core attention and Adam step on one layer"
MIB = 1024**2


def setup() -> torch.device:
    import patches
    from megatron.core import parallel_state, tensor_parallel

    from megatron_auto.profiling.cluster_profile import init_from_env

    patches.apply_all()
    device, _ = init_from_env()
    parallel_state.initialize_model_parallel(1, 1)
    tensor_parallel.model_parallel_cuda_manual_seed(1234)
    return device


def adam_step(layer, settings: LayerBenchSettings, impl: str, device) -> tuple[float, float]:
    """(seconds per Adam step, bytes the step allocates above params, grads and state; 0 on CPU)."""
    module = build_layer(layer, 1, settings, device)
    params = [p for p in module.parameters()]
    for p in params:
        p.grad = torch.randn_like(p)
    adam = torch.optim.AdamW(params, lr=1e-4, fused=impl == "fused", foreach=impl == "foreach")
    adam.step()  # creates the state
    on_cuda = device.type == "cuda"
    if on_cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated() if on_cuda else 0
    start = time.perf_counter()
    for _ in range(settings.iters):
        adam.step()
    if on_cuda:
        torch.cuda.synchronize()
    seconds = (time.perf_counter() - start) / settings.iters
    return seconds, (torch.cuda.max_memory_allocated() - base) if on_cuda else 0.0


def measure(args: argparse.Namespace, device) -> list[tuple[str, str]]:
    """(what, figures) rows of the report."""
    layer = uniform_model("bench", 1, args.hidden, args.heads, args.seq, 256).layers[0]
    base = LayerBenchSettings(precision=args.precision, hidden_dropout=0.0, attention_dropout=args.attention_dropout,
                              iters=args.iters)
    rows = []
    for backend in ("unfused", "flash"):
        timing = measure_layer(layer, 1, args.micro_batch, args.seq,
                               dataclasses.replace(base, attention_backend=backend), device)
        rows.append((f"attention `{backend}`", f"forward {timing.forward_s * 1e3:.2f} ms, backward "
                     f"{timing.backward_s * 1e3:.2f} ms, saved activations {timing.activation_bytes / MIB:.1f} MiB"))
    for impl in ("foreach", "fused"):
        seconds, extra = adam_step(layer, base, impl, device)
        memory = f", {extra / MIB:.1f} MiB allocated by the step" if device.type == "cuda" else ""
        rows.append((f"Adam step `{impl}`", f"{seconds * 1e3:.2f} ms{memory}"))
    return rows


def report(args: argparse.Namespace, device, rows: list[tuple[str, str]]) -> str:
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU (1 thread)"
    lines = [HEADING, "", "`OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.bench_kernels "
             f"--hidden {args.hidden} --heads {args.heads} --seq {args.seq} --micro-batch {args.micro_batch} "
             f"--precision {args.precision} --attention-dropout {args.attention_dropout} --iters {args.iters}` "
             f"on {name}, torch {torch.__version__}: "
             "one TransformerLayer (GeLU MLP 4h, causal), the layer's weights for Adam.", "",
             "| kernel | measured |", "|---|---|"]
    lines += [f"| {what} | {figures} |" for what, figures in rows]
    if device.type == "cpu":
        lines += ["", "On the CPU, torch's SDPA runs attention dropout above 0 in its math fallback, which keeps "
                  "the s x s probabilities like the unfused core (rerun with `--attention-dropout 0.1`); CUDA's flash "
                  "kernel drops out inside the kernel. GPU figures: data/reference/h100/README.md."]
    return "\n".join(lines) + "\n\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for flag, default in (("--hidden", 256), ("--heads", 8), ("--seq", 512), ("--micro-batch", 1), ("--iters", 5)):
        parser.add_argument(flag, type=int, default=default)
    parser.add_argument("--precision", choices=("fp32", "bf16", "fp16"), default="fp32")
    parser.add_argument("--attention-dropout", type=float, default=0.0)
    parser.add_argument("--no-docs", action="store_true")
    args = parser.parse_args(argv)
    device = setup()
    text = report(args, device, measure(args, device))
    sys.stdout.write(text)
    if not args.no_docs:
        write_section(ROOT / "docs" / "benchmarks.md", HEADING, text)
    torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
