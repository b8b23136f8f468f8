"""tools/profile_gpu_step.py end to end on CPU (--tiny) and its kernel kinds."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import profile_gpu_step  # noqa: E402


def test_kernel_names_are_sorted_into_kinds():
    assert profile_gpu_step.kernel_kind("nvjet_sm90_tst_192x192_64x3_2x1_v_bz_coopB_NNN") == "gemm"
    assert profile_gpu_step.kernel_kind("cudnn_generated_fort_native_sdpa_sm90_flash_bprop") == "attention"
    assert profile_gpu_step.kernel_kind("triton_poi_fused_add_mul_tanh_0") == "triton (compiled fusions)"
    assert profile_gpu_step.kernel_kind("void at::native::vectorized_elementwise_kernel<8>") == "element-wise"
    assert profile_gpu_step.kernel_kind("aten::_fused_adamw_") == "adam"
    assert profile_gpu_step.kernel_kind("something new") == "other"


def test_tiny_profile_reports_both_models():
    done = subprocess.run([sys.executable, "tools/profile_gpu_step.py", "--tiny", "--warmup", "1", "--rows", "5"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-3000:]
    for name in ("### megatron-auto runtime", "### plain PyTorch"):
        section = done.stdout.split(name)[1]
        assert "s wall" in section and "| gemm |" in section
