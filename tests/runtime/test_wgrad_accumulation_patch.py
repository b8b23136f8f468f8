"""patches/wgrad_accumulation_torch: apex's weight-gradient accumulation, done with torch, inside Megatron's linear.

The CUDA branch (torch.addmm with out_dtype) runs only on GPUs; here the CPU branch is checked
against float64 arithmetic, and Megatron's own autograd function is run with the stand-in.
"""
from __future__ import annotations

import pytest
import torch

import patches
from patches import wgrad_accumulation_torch as patch

TOKENS, IN, OUT = 37, 24, 16
# fp32 sums of 37 products (exact for 16-bit inputs): relative error below 37 * 2^-24 ~ 2e-6 per element,
# absolute against sums of magnitude ~6: 1e-5 leaves margin. A 16-bit GEMM output would be rounded to
# 2^-8 (bf16) relative, some 1e-2 absolute here, and a missed or doubled micro-batch is O(1) off.
FP32_ATOL = 1e-5


@pytest.fixture(scope="module", autouse=True)
def applied():
    return patches.apply_all(force=True)


def _pair(seed: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(TOKENS, IN, generator=generator).to(dtype),
            torch.randn(TOKENS, OUT, generator=generator).to(dtype))


def _exact(total_input: torch.Tensor, grad_output: torch.Tensor) -> torch.Tensor:
    return grad_output.double().t() @ total_input.double()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_fp32_main_grad_gets_the_product_summed_in_fp32(dtype):
    total_input, grad_output = _pair(0, dtype)
    start = torch.randn(OUT, IN, generator=torch.Generator().manual_seed(1))
    main_grad = start.clone()
    patch.wgrad_gemm_accum_fp32(total_input, grad_output, main_grad)
    assert main_grad.dtype == torch.float32
    assert torch.allclose(main_grad.double(), start.double() + _exact(total_input, grad_output), rtol=0, atol=FP32_ATOL)


def test_start_up_check_passes_the_stand_in_and_fails_wrong_accumulations(monkeypatch):
    """accumulation_error (what `auto` runs once on a GPU before fusing with the stand-in) passes the stand-in
    here, and names a GEMM that overwrites main_grad or rounds its output to 16 bits."""
    cpu = torch.device("cpu")
    assert patch.accumulation_error(cpu) is None

    def overwrites(total_input, grad_output, main_grad):
        main_grad.copy_(grad_output.t().float() @ total_input.float())

    def rounds_to_16_bits(total_input, grad_output, main_grad):
        main_grad.add_((grad_output.t().float() @ total_input.float()).to(total_input.dtype).float())

    for wrong in (overwrites, rounds_to_16_bits):
        monkeypatch.setattr(patch.TORCH_WGRAD, "wgrad_gemm_accum_fp32", wrong)
        problem = patch.accumulation_error(cpu)
        assert problem is not None and "weight-gradient GEMM on cpu left main_grad" in problem


def test_16bit_main_grad_accumulates_in_its_own_type():
    total_input, grad_output = _pair(2, torch.bfloat16)
    main_grad = torch.zeros(OUT, IN, dtype=torch.bfloat16)
    patch.wgrad_gemm_accum_fp16(total_input, grad_output, main_grad)
    # bf16 result: rounded to 8 bits of mantissa, 2^-8 relative of the largest sums (~10): 0.08 absolute
    assert main_grad.dtype == torch.bfloat16
    assert torch.allclose(main_grad.double(), _exact(total_input, grad_output), rtol=0, atol=0.08)


@pytest.mark.parametrize("fusion", [True, False])
def test_megatron_linear_accumulates_micro_batches_into_main_grad(fusion):
    """Megatron's LinearWithGradAccumulationAndAsyncCommunication over two micro-batches: with the fusion
    the weight's fp32 main_grad holds the sum and no 16-bit .grad is made (DDP's hook has nothing to add);
    without it the 16-bit .grad holds the sum, as Megatron DDP's hook then adds it."""
    from megatron.core.tensor_parallel.layers import LinearWithGradAccumulationAndAsyncCommunication as Linear

    weight = torch.nn.Parameter(torch.randn(OUT, IN, generator=torch.Generator().manual_seed(3)).bfloat16())
    weight.main_grad = torch.zeros(OUT, IN)
    expected = torch.zeros(OUT, IN, dtype=torch.float64)
    for micro_batch in range(2):
        total_input, grad_output = _pair(10 + micro_batch, torch.bfloat16)
        out = Linear.apply(total_input, weight, None, fusion, False, False, None, 0, None)
        out.backward(grad_output)
        expected += _exact(total_input, grad_output)
    if fusion:
        assert weight.grad is None
        assert torch.allclose(weight.main_grad.double(), expected, rtol=0, atol=2 * FP32_ATOL)
    else:
        assert not weight.main_grad.any()
        # two bf16 GEMM outputs summed in bf16: 2^-8 relative of sums up to ~20
        assert torch.allclose(weight.grad.double(), expected, rtol=0, atol=0.2)


def test_the_patch_makes_megatrons_fusion_available_and_checks_its_target():
    from megatron.core.tensor_parallel import layers

    assert patch.is_applied() and layers._grad_accum_fusion_available
    assert layers.fused_weight_gradient_mlp_cuda.wgrad_gemm_accum_fp32 is patch.wgrad_gemm_accum_fp32
    patch.check()
