"""validation/gemm_rates.py without a GPU: its comparison against the cost model's GEMM rates, and its refusal to
measure where there is no CUDA device."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from megatron_auto.cost.flops import Gemm
from megatron_auto.cost.fp8 import fp8_gemm_time
from megatron_auto.cost.kernel_rates import gemm_compute_time
from megatron_auto.cost.moe import expert_gemm_time
from validation import gemm_rates

ROOT = Path(__file__).resolve().parents[1]
H100 = gemm_rates.CLUSTER


def _measured(kind, m, k, n, groups, seconds, **extra):
    return dict(kind=kind, name=f"{kind} case", m=m, k=k, n=n, groups=groups, seconds=seconds,
                tflops=2.0 * groups * m * k * n / seconds / 1e12, **extra)


def test_each_kind_is_priced_by_the_cost_models_own_function():
    dense, fp8 = _measured("dense", 4096, 8192, 8192, 1, 1.0), _measured("fp8", 4096, 8192, 8192, 1, 1.0)
    grouped = _measured("grouped", 1024, 2048, 1536, 16, 1.0)
    assert gemm_rates.predicted_seconds(dense) == gemm_compute_time(Gemm(4096, 8192, 8192), H100)
    assert gemm_rates.predicted_seconds(fp8) == fp8_gemm_time(Gemm(4096, 8192, 8192), H100)
    assert gemm_rates.predicted_seconds(grouped) == expert_gemm_time((Gemm(1024, 2048, 1536, batch=16),), True, H100)
    assert gemm_rates.predicted_seconds(fp8) < gemm_rates.predicted_seconds(dense)  # FP8's peak is twice bf16's


def test_the_table_puts_each_measurement_beside_its_prediction(tmp_path):
    """A row measured at exactly the predicted time reads 1.000; one twice as slow 0.500; a sustained window at
    90% of the first reads 0.900 of it; a shape the GPU refused keeps its error."""
    exact = _measured("dense", 2048, 12288, 9216, 1, gemm_compute_time(Gemm(2048, 12288, 9216), H100))
    slow = _measured("grouped", 4096, 768, 2048, 16,
                     2 * expert_gemm_time((Gemm(4096, 768, 2048, batch=16),), True, H100))
    first = _measured("sustained", 8192, 8192, 8192, 1, 0.002, sm_clock_mhz=1980.0, power_w=690.0,
                      temperature_c=60.0)
    later = _measured("sustained", 8192, 8192, 8192, 1, 0.002 / 0.9)
    refused = dict(kind="fp8", name="odd", m=8, k=8, n=8, groups=1, error="mat2 must be col-major")
    path = tmp_path / "rates.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in (exact, slow, first, later, refused)))
    done = subprocess.run([sys.executable, "-m", "validation.gemm_rates", "--compare", str(path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    rows = [line.split("|")[1:-1] for line in done.stdout.splitlines()[2:]]
    cube = gemm_compute_time(Gemm(8192, 8192, 8192), H100) / 0.002  # the law's rate over the first window's
    assert [row[5].strip() for row in rows] == ["1.000", "0.500", f"{cube:.3f}", f"{0.9 * cube:.3f}", "-"]
    assert "0.900 of the first window" in rows[3][6] and "1980 MHz" in rows[2][6]
    assert "col-major" in rows[4][6]


@pytest.mark.parametrize("argv", [["--out", "x.jsonl"], [], ["--compare", "missing.jsonl"]])
def test_bad_input_or_no_cuda_gets_one_line_and_status_2(tmp_path, argv):
    done = subprocess.run([sys.executable, "-m", "validation.gemm_rates", *argv], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)})
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not (tmp_path / "x.jsonl").exists()
