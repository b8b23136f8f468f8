"""Where one training step's time goes: ours against the plain PyTorch reference, by kernel kind.

On a CUDA machine (prints; docs/benchmarks.md "Where the runtime's time goes" quotes its output):

    python3 -m validation.profile_gpu_step [--micro-batch-size 2] [--bias-fusions auto|on|off]
    python3 -m validation.profile_gpu_step --time-bias-fusions    # also: ours with Megatron's bias fusions on, off, on
    python3 -m validation.profile_gpu_step --time-grad-accumulation-fusion    # also: ours with it on, off, on

It builds both models as validation/bench_gpu_vs_torch.py does (GPT 1.7B shape, bf16, one
rank), runs `--warmup` untimed iterations of each, then one iteration under
torch.profiler and reports per model: the wall time of the profiled iteration, the
GPU kernel time summed by kind (GEMM, attention, element-wise, Adam, ...), how many
times the host waited for the GPU (`cudaStreamSynchronize` calls), and the top
kernels and host-side operators. A step whose wall time exceeds its kernel time by
more than the profiler's own overhead is host-bound: the GPU waits for launches.

`--time-bias-fusions` then times our step, built once, with Megatron's bias-activation
and bias-dropout-add fusions switched on, off and on again on the built model
(TransformerConfig is read at every call): median wall seconds per iteration over
`--iters` iterations after `--warmup` ones, and the host's seconds until the step returned.
`--time-grad-accumulation-fusion` does the same with Megatron's weight-gradient accumulation
fusion (each linear layer's `gradient_accumulation_fusion`, read at every call; without apex
the torch stand-in of patches/wgrad_accumulation_torch.py runs it).

On CPU (`--tiny`) the same code runs end to end (tests/test_profile_gpu_step.py);
CPU ops stand in for kernels.
"""
from __future__ import annotations

import collections
import logging
import statistics
import sys
import time
import warnings

import torch
from torch.profiler import ProfilerActivity, profile

from validation import bench_gpu_vs_torch as bench

KINDS = (("aten::mm", "gemm"), ("aten::addmm", "gemm"), ("aten::bmm", "gemm"), ("nccl", "nccl"),
         ("flash", "attention"), ("fmha", "attention"), ("attention", "attention"),
         ("adam", "adam"), ("gemm", "gemm"), ("nvjet", "gemm"), ("cutlass", "gemm"), ("xmma", "gemm"),
         ("memcpy", "copy"), ("memset", "memset"), ("layer_norm", "layernorm"), ("norm", "norm/reduce"),
         ("reduce", "norm/reduce"), ("softmax", "softmax/cross-entropy"), ("nll", "softmax/cross-entropy"),
         ("triton", "triton (compiled fusions)"), ("elementwise", "element-wise"), ("copy", "copy"), ("cat", "copy"))
"""Substrings of kernel names and the kind they count as (first match wins)."""


def kernel_kind(name: str) -> str:
    lowered = name.lower()
    return next((kind for key, kind in KINDS if key in lowered), "other")


def profile_one_step(step, on_cuda: bool):
    """Run `step` once under torch.profiler; (wall seconds, its key averages)."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_cuda else [])
    with profile(activities=activities) as prof:
        start = time.perf_counter()
        step()
        bench.synchronize(torch.device("cuda" if on_cuda else "cpu"))
        wall = time.perf_counter() - start
    return wall, prof.key_averages()


def report(name: str, wall: float, averages, on_cuda: bool, rows: int) -> str:
    """Markdown: wall time, kernel time by kind, host waits, and the top operators."""
    device_type = torch.autograd.DeviceType.CUDA if on_cuda else torch.autograd.DeviceType.CPU
    kernels = [e for e in averages if e.device_type == device_type and (on_cuda or e.key.startswith("aten::"))]
    attribute = "self_device_time_total" if on_cuda else "self_cpu_time_total"
    by_kind = collections.Counter()
    for event in kernels:
        by_kind[kernel_kind(event.key)] += getattr(event, attribute) / 1e6
    waits = [e for e in averages if e.key == "cudaStreamSynchronize"]
    syncs, waited_ms = sum(e.count for e in waits), sum(e.self_cpu_time_total for e in waits) / 1e3
    lines = [f"### {name}", "", f"Profiled iteration: {wall:.4f} s wall, {sum(by_kind.values()):.4f} s of "
             f"{'GPU kernels' if on_cuda else 'CPU operators'}, {syncs} host waits (cudaStreamSynchronize, "
             f"{waited_ms:.1f} ms).", "",
             "| kind | ms |", "|---|---|"]
    lines += [f"| {kind} | {seconds * 1000:.1f} |" for kind, seconds in by_kind.most_common()]
    sort_by = "self_cuda_time_total" if on_cuda else "self_cpu_time_total"
    lines += ["", "```", averages.table(sort_by=sort_by, row_limit=rows, max_name_column_width=60), "```", ""]
    return "\n".join(lines)


def time_step(step, iterations: int, device: torch.device) -> tuple[float, float]:
    """Median wall seconds per iteration, and median host seconds until `step` returned."""
    walls, hosts = [], []
    for _ in range(iterations):
        start = time.perf_counter()
        step()
        hosts.append(time.perf_counter() - start)
        bench.synchronize(device)
        walls.append(time.perf_counter() - start)
    return statistics.median(walls), statistics.median(hosts)


def switch_bias_fusions(chunks: list, on: bool) -> None:
    """Megatron's bias fusions on or off in the built model's TransformerConfig(s); the bias-GeLU
    kernel needs a bias (TransformerConfig refuses it otherwise), the SwiGLU one does not."""
    configs = {id(m.config): m.config for chunk in chunks for m in chunk.modules() if hasattr(m, "config")}
    for config in configs.values():
        config.bias_activation_fusion = on and (config.add_bias_linear or config.gated_linear_unit)
        config.bias_dropout_fusion = on


def switch_grad_accumulation_fusion(chunks: list, on: bool) -> None:
    """Megatron's weight-gradient accumulation fusion on or off in every built linear layer (each keeps
    its own flag; the weights' main_grad buffers are Megatron DDP's, there either way)."""
    for chunk in chunks:
        for module in chunk.modules():
            if hasattr(module, "gradient_accumulation_fusion"):
                module.gradient_accumulation_fusion = on


SWITCHES = {"bias fusions": switch_bias_fusions, "grad accumulation fusion": switch_grad_accumulation_fusion}
"""What --time-bias-fusions and --time-grad-accumulation-fusion switch on the built model."""


def compare_switch(job, args, device: torch.device, name: str) -> str:
    """Markdown: our step with SWITCHES[name] on, off, on again (the first and last bracket drift)."""
    from megatron_auto.runtime import session

    lines = [f"### megatron-auto runtime: {name}", "", f"| {name} | s / iteration | host s until return |",
             "|---|---|---|"]
    for on in (True, False, True):
        SWITCHES[name](job.model, on)
        for _ in range(args.warmup):
            session.run_iteration(job)
        wall, host = time_step(lambda: session.run_iteration(job), args.iters, device)
        lines.append(f"| {'on' if on else 'off'} | {wall:.4f} | {host:.4f} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    import patches
    from megatron_auto.runtime import distributed, session

    parser = bench.build_parser(__doc__)
    parser.add_argument("--rows", type=int, default=25, help="operators listed per model")
    parser.add_argument("--time-bias-fusions", action="store_true",
                        help="also time our step with the bias fusions on, off and on (see the docstring)")
    parser.add_argument("--time-grad-accumulation-fusion", action="store_true",
                        help="also time our step with the weight-gradient accumulation fusion on, off and on")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    warnings.filterwarnings("ignore", category=UserWarning)
    shape = bench.TINY_SHAPE if args.tiny else bench.DEFAULT_SHAPE
    precision = args.precision or ("bf16" if torch.cuda.is_available() else "fp32")
    patches.apply_all()
    bench._join_one_rank_job()
    info = distributed.init_distributed(600.0)
    on_cuda = info.device.type == "cuda"
    try:
        job, _ = bench.build_runtime(args, shape, precision, info)
        steps = {"megatron-auto runtime": lambda: session.run_iteration(job)}
        _, _, steps["plain PyTorch"] = bench.build_reference(args, shape, precision, info.device)
        out = [bench.describe(args, shape, precision, info.device), ""]
        for name, step in steps.items():
            for _ in range(args.warmup):
                step()
            out.append(report(name, *profile_one_step(step, on_cuda), on_cuda, args.rows))
        if args.time_bias_fusions:
            out.append(compare_switch(job, args, info.device, "bias fusions"))
        if args.time_grad_accumulation_fusion:
            out.append(compare_switch(job, args, info.device, "grad accumulation fusion"))
    finally:
        distributed.shutdown()
    sys.stdout.write("\n".join(out) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
