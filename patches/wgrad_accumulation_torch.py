"""Patch: Megatron's weight-gradient accumulation fusion without apex, on torch's GEMMs.

Why: with `gradient_accumulation_fusion`, Megatron-Core's linear layers add each
weight gradient straight into the parameter's fp32 `main_grad` inside their
backward (apex's `fused_weight_gradient_mlp_cuda.wgrad_gemm_accum_fp32`: one GEMM
with a 16-bit A and B and an fp32 C, beta = 1). Without apex the option is refused,
so every weight takes the long way: the GEMM writes a 16-bit `param.grad`, and
Megatron DDP's per-parameter backward hook adds it into `main_grad` in a second
kernel. On one H100 the GPT 1.7B shape ran 2336 such hooks per iteration, 95 ms of
host time and 59 ms of GPU time (torch.profiler, docs/benchmarks.md "Where the
runtime's time goes"). The patch gives `megatron.core.tensor_parallel.layers` a
stand-in module whose two functions do apex's arithmetic with torch:
- on CUDA, `torch.addmm(main_grad, dY^T, X, out_dtype=float32, out=main_grad)`
  (cuBLAS with 16-bit inputs, fp32 accumulation and an fp32 C, as apex's kernel);
- elsewhere (CPU), the same sum through an fp32 matmul of the upcast inputs, which is
  what the CUDA GEMM computes up to summation order (products of 16-bit numbers are
  exact in fp32).
Whether the fusion runs is the run's choice (`--grad-accumulation-fusion`,
runtime/kernels.py); the patch only makes the option available.
Targets: megatron-core 0.16.1.
Removable when: megatron-core accumulates weight gradients without apex, or apex
installs here.
Applied where apex's extension is absent: on CPU always, on GPUs when
`fused_weight_gradient_mlp_cuda` does not import (`applies_on_cuda`).
"""
from __future__ import annotations

import importlib
from types import SimpleNamespace

import torch

from ._checks import require_text, require_version
from ._source import PatchTargetChanged

NAME = "wgrad_accumulation_torch"
TARGET_VERSIONS = ("0.16.1",)
LAYERS = "megatron.core.tensor_parallel.layers"
MARKER = "fused_weight_gradient_mlp_cuda.wgrad_gemm_accum_fp32("


def wgrad_gemm_accum_fp32(total_input: torch.Tensor, grad_output: torch.Tensor, main_grad: torch.Tensor) -> None:
    """main_grad (fp32) += grad_output^T @ total_input, both 2-D [tokens, features], summed in fp32."""
    if total_input.dtype == torch.float32:
        main_grad.addmm_(grad_output.t(), total_input)
    elif main_grad.is_cuda:
        torch.addmm(main_grad, grad_output.t(), total_input, out_dtype=torch.float32, out=main_grad)
    else:
        main_grad.addmm_(grad_output.t().float(), total_input.float())


def wgrad_gemm_accum_fp16(total_input: torch.Tensor, grad_output: torch.Tensor, main_grad: torch.Tensor) -> None:
    """main_grad (16-bit, as the inputs) += grad_output^T @ total_input."""
    main_grad.addmm_(grad_output.t(), total_input)


TORCH_WGRAD = SimpleNamespace(wgrad_gemm_accum_fp32=wgrad_gemm_accum_fp32,
                              wgrad_gemm_accum_fp16=wgrad_gemm_accum_fp16, __name__=NAME)
"""What the layers call as `fused_weight_gradient_mlp_cuda` once the patch is applied."""

CHECK_SHAPE = (256, 64, 48)
"""Tokens, input and output features of the start-up check: 256 products per sum."""
CHECK_ATOL = 2e-3
"""fp32 sums of 256 exact products of 16-bit normal samples (sums up to ~60) differ from float64 by at most
256 * 2^-24 * 64 ~ 1e-3 in the worst order. A GEMM whose output is rounded to 16 bits is off by up to half an
ulp of those sums (0.125 in bf16, 0.016 in fp16 between 32 and 64), and one that overwrites main_grad instead
of adding into it by O(1); tests/runtime/test_wgrad_accumulation_patch.py checks that both fail."""


def accumulation_error(device: torch.device) -> str | None:
    """None when `wgrad_gemm_accum_fp32`, as the layers call it, adds grad_output^T @ total_input into an
    fp32 main_grad on `device` for bf16 and fp16 inputs, within CHECK_ATOL of float64 arithmetic; else
    what went wrong, in one line. Run once per run before `auto` turns the fusion on with this stand-in:
    its CUDA branch (torch.addmm with out_dtype into main_grad) cannot run in the CPU tests."""
    tokens, features_in, features_out = CHECK_SHAPE
    generator = torch.Generator().manual_seed(0)
    start = torch.randn(features_out, features_in, generator=generator)
    for dtype in (torch.bfloat16, torch.float16):
        total_input = torch.randn(tokens, features_in, generator=generator).to(dtype)
        grad_output = torch.randn(tokens, features_out, generator=generator).to(dtype)
        main_grad = start.to(device, copy=True)
        TORCH_WGRAD.wgrad_gemm_accum_fp32(total_input.to(device), grad_output.to(device), main_grad)
        expected = start.double() + grad_output.double().t() @ total_input.double()
        worst = (main_grad.double().cpu() - expected).abs().max().item()
        if not worst <= CHECK_ATOL:
            return (f"{NAME}: the {dtype} weight-gradient GEMM on {device} left main_grad {worst:.3g} from "
                    f"main_grad + dY^T X (at most {CHECK_ATOL:g} allowed)")
    return None


def _layers():
    return importlib.import_module(LAYERS)


def check() -> None:
    """Raise PatchTargetChanged unless the layers still call apex's two functions by the module's name."""
    require_version(NAME, TARGET_VERSIONS)
    layers = require_text(LAYERS, MARKER, NAME)
    if not hasattr(layers, "_grad_accum_fusion_available"):
        raise PatchTargetChanged(f"{NAME}: {LAYERS} no longer has _grad_accum_fusion_available")


def applies_on_cuda() -> bool:
    """True when apex's extension is missing (then Megatron refuses the fusion)."""
    layers = _layers()
    return not layers._grad_accum_fusion_available or is_applied()


def apply() -> None:
    check()
    layers = _layers()
    layers.fused_weight_gradient_mlp_cuda = TORCH_WGRAD
    layers._grad_accum_fusion_available = True


def is_applied() -> bool:
    return getattr(_layers(), "fused_weight_gradient_mlp_cuda", None) is TORCH_WGRAD

