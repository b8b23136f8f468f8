"""Our training step against a plain PyTorch GPT of the same shape, in one process on one GPU.

On a CUDA machine (one command; replaces its section of docs/benchmarks.md):

    python3 -m validation.bench_gpu_vs_torch

It builds the runtime's session (runtime.session.build_session on one rank, a TP1/PP1
plan with --micro-batch-size, or `--plan plan.json`) and the reference
(validation/torch_reference_gpt.py: SDPA attention, bf16 autocast over fp32 master weights,
fused AdamW, eager), both on the GPU, and runs them in alternating rounds of
`--iters` iterations after `--warmup` untimed ones each. It prints per model the
median seconds per iteration, TFLOP/s per GPU (runtime.metrics.model_flops_per_iteration,
Narayanan et al. SC21 model FLOPs, the same count for both), the peak allocated
memory, and the ratios ours / torch.

Peak memory in one process: both models stay resident, so each one's peak is its own
resident bytes (weights and optimizer states; for ours, what was allocated before the
reference was built) plus the largest rise of torch.cuda.max_memory_allocated over
what was allocated when its rounds began. Reserved memory is shared by the two and not
split. Default shape: GPT 1.7B (24 layers, hidden 2304, 24 heads, seq 2048, vocab
51200), micro-batch 2, global batch 16, bf16. `--precision`, `--attention-backend`,
`--optimizer-impl`, `--bias-fusions` and `--grad-accumulation-fusion` are passed to the runtime's
settings when it has them.

On CPU (`--tiny`: 2 layers, hidden 64; fp32 by default) the same code runs end to end
(tests/test_bench_gpu_vs_torch.py); no docs section is written unless `--benchmarks` is given.
"""
from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import statistics
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

from benchmarks.docs_sections import write_section
from megatron_auto.specs.model import uniform_model
from megatron_auto.specs.training import GIB
from validation import torch_reference_gpt as reference

ROOT = Path(__file__).resolve().parents[1]

HEADING = "## Runtime vs plain PyTorch on one GPU (GPT 1.7B shape)"
DEFAULT_SHAPE = reference.GptShape(num_layers=24, hidden_size=2304, num_attention_heads=24, seq_length=2048,
                                   vocab_size=51200)
TINY_SHAPE = reference.GptShape(num_layers=2, hidden_size=64, num_attention_heads=4, seq_length=32, vocab_size=256)


@dataclass(frozen=True)
class Measured:
    """One model's figures over the benchmark."""

    name: str
    seconds: float
    """Median seconds per iteration over the timed iterations of every round."""
    tflops_per_gpu: float
    peak_allocated_bytes: float
    """Its resident bytes plus its largest rise of the allocator's peak (see the docstring)."""


def build_parser(description: str = __doc__) -> argparse.ArgumentParser:
    """The benchmark's flags (validation/profile_gpu_step.py takes the same)."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiny", action="store_true", help="2 layers, hidden 64, seq 32 (the CPU test)")
    parser.add_argument("--micro-batch-size", type=int, default=2)
    parser.add_argument("--global-batch-size", type=int, default=16)
    parser.add_argument("--precision", choices=("bf16", "fp32"), help="default: bf16 on CUDA, fp32 on CPU")
    parser.add_argument("--attention-backend", default="auto", help="forwarded to the runtime's settings")
    parser.add_argument("--optimizer-impl", default="auto", help="forwarded to the runtime's settings")
    parser.add_argument("--bias-fusions", default="auto", help="forwarded to the runtime's settings")
    parser.add_argument("--grad-accumulation-fusion", default="auto", help="forwarded to the runtime's settings")
    parser.add_argument("--recompute", choices=("none", "selective", "full"), default="none")
    parser.add_argument("--plan", help="a one-rank plan.json for the runtime (default: TP1/PP1 from the flags)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--iters", type=int, default=3, help="timed iterations per model per round")
    parser.add_argument("--warmup", type=int, default=2, help="untimed iterations per model first")
    parser.add_argument("--benchmarks", help="markdown file to write the section into "
                                             "(default on CUDA: docs/benchmarks.md; on CPU: none)")
    return parser


def parse_args(argv=None) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def runtime_settings(args: argparse.Namespace, shape: reference.GptShape, precision: str):
    """TrainSettings of the runtime's run: no dropout (as the reference), and the kernel knobs
    forwarded when this runtime's settings have them."""
    from megatron_auto.runtime.settings import DataSettings, TrainSettings

    wanted = dict(precision=precision, hidden_dropout=shape.dropout, attention_dropout=shape.dropout,
                  train_iters=10**6, lr=1e-4, clip_grad=1.0, weight_decay=0.01,
                  data=DataSettings(vocab_size=shape.vocab_size))
    known = {f.name for f in dataclasses.fields(TrainSettings)}
    for knob in ("attention_backend", "optimizer_impl", "bias_fusions", "grad_accumulation_fusion"):
        if knob in known:
            wanted[knob] = getattr(args, knob)
        else:
            logging.info("runtime settings have no %s: the runtime runs its default", knob)
    return TrainSettings(**wanted)


def runtime_plan(args: argparse.Namespace, model):
    from megatron_auto.runtime.manual_plan import ManualParallelism, plan_from_flags
    from megatron_auto.runtime.planning import plan_from_file

    if args.plan:
        return plan_from_file(args.plan, model, 1)
    recompute = None if args.recompute == "none" else args.recompute
    return plan_from_flags(model, 1, ManualParallelism(
        micro_batch_size=args.micro_batch_size, global_batch_size=args.global_batch_size,
        recompute_granularity=recompute, recompute_method="uniform" if recompute == "full" else None,
        recompute_num_layers=1 if recompute == "full" else None))


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def allocated(device: torch.device) -> int:
    return torch.cuda.memory_allocated(device) if device.type == "cuda" else 0


class Timed:
    """Alternating rounds: each model's step, its iteration seconds and its largest allocator rise."""

    def __init__(self, name: str, step, device: torch.device):
        self.name, self.step, self.device = name, step, device
        self.samples: list[float] = []
        self.rise = 0

    def round(self, iterations: int, timed: bool = True) -> None:
        synchronize(self.device)
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        start_bytes = allocated(self.device)
        for _ in range(iterations):
            start = time.perf_counter()
            self.step()
            synchronize(self.device)
            if timed:
                self.samples.append(time.perf_counter() - start)
        # Warm-up rounds allocate the optimizer's states, which the resident bytes already count.
        if timed and self.device.type == "cuda":
            self.rise = max(self.rise, torch.cuda.max_memory_allocated(self.device) - start_bytes)


def build_runtime(args: argparse.Namespace, shape: reference.GptShape, precision: str, info):
    """The runtime's session for the shape on this rank, and its model spec."""
    from megatron_auto.runtime import session

    model = uniform_model("bench", shape.num_layers, shape.hidden_size, shape.num_attention_heads,
                          shape.seq_length, shape.vocab_size)
    settings = runtime_settings(args, shape, precision)
    plan = runtime_plan(args, model)
    return session.build_session(plan, model, settings, info.backend, info.device), model


def build_reference(args: argparse.Namespace, shape: reference.GptShape, precision: str, device: torch.device):
    """The reference model, its optimizer, and its step as a closure."""
    torch.manual_seed(1234)
    model = reference.ReferenceGpt(shape).to(device)
    optimizer = reference.make_optimizer(model)
    generator = torch.Generator().manual_seed(1234)

    def step():
        return reference.train_step(model, optimizer, shape, args.micro_batch_size, args.global_batch_size,
                                    precision, generator)
    return model, optimizer, step


def run_benchmark(args: argparse.Namespace, shape: reference.GptShape, precision: str, info) -> list[Measured]:
    """Warm up ours, build and warm up the reference, then alternate timed rounds."""
    from megatron_auto.runtime import metrics, session

    job, model_spec = build_runtime(args, shape, precision, info)
    device = info.device
    ours = Timed("megatron-auto runtime", lambda: session.run_iteration(job), device)
    ours.round(args.warmup, timed=False)  # Adam's states appear in the first step
    ours_resident = allocated(device)
    ref_model, ref_optimizer, ref_step = build_reference(args, shape, precision, device)
    theirs = Timed("plain PyTorch", ref_step, device)
    theirs.round(args.warmup, timed=False)
    theirs_resident = reference.resident_bytes(ref_model, ref_optimizer) if device.type == "cuda" else 0
    for index in range(args.rounds):
        for timed in ((ours, theirs) if index % 2 == 0 else (theirs, ours)):
            timed.round(args.iters)
    flops = metrics.model_flops_per_iteration(model_spec, args.global_batch_size, job.padded_vocab)
    return [Measured(t.name, statistics.median(t.samples), flops / statistics.median(t.samples) / 1e12,
                     resident + t.rise) for t, resident in ((ours, ours_resident), (theirs, theirs_resident))]


def table(results: list[Measured], on_cuda: bool) -> str:
    """Markdown: both models and the ratio ours / torch."""
    def gib(value: float) -> str:
        return f"{value / GIB:.2f}" if on_cuda else "not measured on CPU"

    ours, theirs = results
    lines = ["| model | s / iteration | TFLOP/s per GPU | peak allocated GiB |", "|---|---|---|---|"]
    lines += [f"| {r.name} | {r.seconds:.4g} | {r.tflops_per_gpu:.4g} | {gib(r.peak_allocated_bytes)} |"
              for r in results]
    memory_ratio = f"{ours.peak_allocated_bytes / theirs.peak_allocated_bytes:.2f}" if on_cuda else "–"
    lines.append(f"| ours / torch | {ours.seconds / theirs.seconds:.2f} | "
                 f"{ours.tflops_per_gpu / theirs.tflops_per_gpu:.2f} | {memory_ratio} |")
    return "\n".join(lines) + "\n"


def describe(args: argparse.Namespace, shape: reference.GptShape, precision: str, device: torch.device) -> str:
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    return (f"{name}, torch {torch.__version__}; {shape.num_layers} layers, hidden {shape.hidden_size}, "
            f"{shape.num_attention_heads} heads, seq {shape.seq_length}, vocab {shape.vocab_size}; micro-batch "
            f"{args.micro_batch_size}, global batch {args.global_batch_size}, {precision}, recompute "
            f"{args.recompute}, runtime attention backend {args.attention_backend}, optimizer {args.optimizer_impl}, "
            f"bias fusions {args.bias_fusions}, grad accumulation fusion {args.grad_accumulation_fusion}"
            f"{', plan ' + args.plan if args.plan else ''}; {args.rounds} alternating rounds of {args.iters} "
            f"iterations after {args.warmup} warm-up iterations each.")


def _join_one_rank_job() -> None:
    """The torchrun variables of a one-rank job, where not set (a free port for the rendezvous)."""
    import socket

    for key, value in (("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0"), ("MASTER_ADDR", "127.0.0.1")):
        os.environ.setdefault(key, value)
    if "MASTER_PORT" not in os.environ:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(sock.getsockname()[1])


def on_one_rank(work):
    """(work(info), info): `work` run in a one-rank job on this host's device, megatron-core patched as the
    runtime patches it and the process group torn down after."""
    import patches
    from megatron_auto.runtime import distributed

    patches.apply_all()
    _join_one_rank_job()
    info = distributed.init_distributed(600.0)
    try:
        return work(info), info
    finally:
        distributed.shutdown()


def main(argv=None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    logging.getLogger("megatron").setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", category=UserWarning)
    shape = TINY_SHAPE if args.tiny else DEFAULT_SHAPE
    precision = args.precision or ("bf16" if torch.cuda.is_available() else "fp32")
    results, info = on_one_rank(lambda info: run_benchmark(args, shape, precision, info))
    on_cuda = info.device.type == "cuda"
    text = table(results, on_cuda)
    sys.stdout.write(describe(args, shape, precision, info.device) + "\n\n" + text)
    target = args.benchmarks or (str(ROOT / "docs" / "benchmarks.md") if on_cuda else None)
    if target:
        given = sys.argv[1:] if argv is None else argv
        command = " ".join(["python3 -m validation.bench_gpu_vs_torch", *given])
        body = (f"Command: `{command}` on a GPU machine (validation/bench_gpu_vs_torch.py says what is measured). "
                f"{describe(args, shape, precision, info.device)}\n\n{text}")
        write_section(Path(target), HEADING, f"{HEADING}\n\n{body}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
