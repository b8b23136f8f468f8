"""validation/profile_gpu_step.py end to end on CPU (--tiny) and its kernel kinds."""
from __future__ import annotations

from pathlib import Path

from validation import profile_gpu_step
from validation.launcher import run_script

ROOT = Path(__file__).resolve().parents[1]


def test_kernel_names_are_sorted_into_kinds():
    assert profile_gpu_step.kernel_kind("nvjet_sm90_tst_192x192_64x3_2x1_v_bz_coopB_NNN") == "gemm"
    assert profile_gpu_step.kernel_kind("cudnn_generated_fort_native_sdpa_sm90_flash_bprop") == "attention"
    assert profile_gpu_step.kernel_kind("triton_poi_fused_add_mul_tanh_0") == "triton (compiled fusions)"
    assert profile_gpu_step.kernel_kind("void at::native::vectorized_elementwise_kernel<8>") == "element-wise"
    assert profile_gpu_step.kernel_kind("aten::_fused_adamw_") == "adam"
    assert profile_gpu_step.kernel_kind("something new") == "other"


def test_tiny_profile_reports_both_models():
    done = run_script(["-m", "validation.profile_gpu_step", "--tiny", "--warmup", "1", "--rows", "5", "--iters", "1",
                       "--time-bias-fusions", "--time-grad-accumulation-fusion"],
                      {"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}, timeout_s=300)
    assert done.returncode == 0, done.stderr[-3000:]
    for name in ("### megatron-auto runtime", "### plain PyTorch"):
        section = done.stdout.split(name)[1]
        assert "s wall" in section and "| gemm |" in section
    for switch in ("bias fusions", "grad accumulation fusion"):
        rows = done.stdout.split(f"### megatron-auto runtime: {switch}")[1].split("###")[0]
        assert [row.split("|")[1].strip() for row in rows.strip().splitlines()[2:]] == ["on", "off", "on"]


def test_grad_accumulation_fusion_switches_every_linear_layer():
    import torch

    chunk = torch.nn.Sequential(torch.nn.Linear(1, 1), torch.nn.Linear(1, 1), torch.nn.ReLU())
    chunk[0].gradient_accumulation_fusion = chunk[1].gradient_accumulation_fusion = False
    profile_gpu_step.switch_grad_accumulation_fusion([chunk], True)
    assert chunk[0].gradient_accumulation_fusion and chunk[1].gradient_accumulation_fusion
    assert not hasattr(chunk[2], "gradient_accumulation_fusion")


def test_bias_fusions_switch_on_every_config_of_the_model():
    import torch

    from types import SimpleNamespace

    gelu = SimpleNamespace(add_bias_linear=True, gated_linear_unit=False, bias_activation_fusion=False,
                           bias_dropout_fusion=False)
    no_bias = SimpleNamespace(add_bias_linear=False, gated_linear_unit=False, bias_activation_fusion=False,
                              bias_dropout_fusion=False)
    chunk = torch.nn.Sequential(torch.nn.Linear(1, 1), torch.nn.Linear(1, 1))
    chunk[0].config, chunk[1].config = gelu, no_bias
    profile_gpu_step.switch_bias_fusions([chunk], True)
    assert (gelu.bias_activation_fusion, gelu.bias_dropout_fusion) == (True, True)
    assert (no_bias.bias_activation_fusion, no_bias.bias_dropout_fusion) == (False, True)  # GeLU fusion needs a bias
    profile_gpu_step.switch_bias_fusions([chunk], False)
    assert not gelu.bias_activation_fusion and not no_bias.bias_dropout_fusion
