"""validation/bench_gpu_vs_torch.py end to end on CPU (--tiny, fp32) and its table arithmetic."""
from __future__ import annotations

import re
from pathlib import Path

from megatron_auto.specs.training import GIB
from validation import bench_gpu_vs_torch as bench
from validation import torch_reference_gpt as reference
from validation.launcher import run_script

ROOT = Path(__file__).resolve().parents[1]


def test_reference_has_megatron_gpt_parameter_count():
    # Megatron's GPT with tied embeddings: V*h + s*h (embeddings) + L*(12h^2 + 13h) + 2h (final LayerNorm).
    shape = bench.TINY_SHAPE
    h, layers = shape.hidden_size, shape.num_layers
    expected = shape.vocab_size * h + shape.seq_length * h + layers * (12 * h * h + 13 * h) + 2 * h
    assert sum(p.numel() for p in reference.ReferenceGpt(shape).parameters()) == expected


def test_table_ratios_are_ours_over_torch():
    results = [bench.Measured("ours", 2.0, 100.0, 60 * GIB), bench.Measured("torch", 1.0, 200.0, 40 * GIB)]
    ratio_row = bench.table(results, on_cuda=True).splitlines()[-1]
    assert ratio_row == "| ours / torch | 2.00 | 0.50 | 1.50 |"
    assert "not measured on CPU" in bench.table(results, on_cuda=False)


def test_tiny_benchmark_runs_both_models_end_to_end(tmp_path):
    docs = tmp_path / "benchmarks.md"
    done = run_script(["-m", "validation.bench_gpu_vs_torch", "--tiny", "--rounds", "2", "--iters", "1", "--warmup",
                       "1", "--benchmarks", str(docs)],
                      {"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}, timeout_s=300)
    assert done.returncode == 0, done.stderr[-3000:]
    text = docs.read_text()
    assert bench.HEADING in text and "--tiny" in text
    rows = {m.group(1): (float(m.group(2)), float(m.group(3)))
            for m in re.finditer(r"^\| ([^|]+) \| ([0-9.e+-]+) \| ([0-9.e+-]+) \|", text, re.M)}
    assert set(rows) == {"megatron-auto runtime", "plain PyTorch", "ours / torch"}
    ours, theirs = rows["megatron-auto runtime"], rows["plain PyTorch"]
    assert ours[0] > 0 and theirs[0] > 0 and ours[1] > 0 and theirs[1] > 0
    # Same FLOP count for both: TFLOP/s x seconds agree up to the printing, 4 significant digits of each
    # of four numbers (at most 5e-4 relative each, 2e-3 together), so 3e-3.
    assert abs(ours[0] * ours[1] / (theirs[0] * theirs[1]) - 1) < 3e-3
