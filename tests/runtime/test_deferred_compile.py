"""Importing megatron-core through `patches` defers torch.compile to each fused function's first call.

The point is start-up time (torch._dynamo and torch._inductor stay unimported until something compiled
runs); what runs must not change: the first call compiles with the options megatron-core gave, and the
compiled function computes what the plain one does.
"""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from patches.deferred_compile import deferred

ROOT = Path(__file__).resolve().parents[2]


def test_a_deferred_function_compiles_once_at_its_first_call_with_the_given_options():
    calls = []

    def recording_compile(model, **options):
        calls.append(options)
        return lambda x: ("compiled", model(x))

    compile_later = deferred(recording_compile)

    def double(x):
        return 2 * x

    by_call = compile_later(double, dynamic=True)
    by_decorator = compile_later(mode="max-autotune")(double)
    assert calls == [] and by_call.__name__ == "double"
    assert by_call(3) == ("compiled", 6) and by_call(4) == ("compiled", 8)
    assert by_decorator(5) == ("compiled", 10)
    assert calls == [{"dynamic": True}, {"mode": "max-autotune"}]


PROBE = textwrap.dedent("""
    import sys
    import torch

    real_compile = torch.compile
    compiled = []

    def eager_compile(model=None, **options):  # the real torch.compile, on a backend that needs no C compiler
        compiled.append(model.__name__)
        return real_compile(model, backend="eager", **options)

    torch.compile = eager_compile
    import patches  # imports megatron.core
    from megatron.core.fusions import fused_bias_geglu

    assert torch.compile is eager_compile, "torch.compile must be put back after the import"
    assert "torch._inductor" not in sys.modules and "torch._dynamo" not in sys.modules
    assert compiled == []
    y = torch.randn(4, 6)
    y1, y2 = torch.chunk(y, 2, -1)
    expected = y1 * 0.5 * (1.0 + torch.tanh(0.79788456 * y1 * (1 + 0.044715 * y1 * y1))) * y2
    assert torch.equal(fused_bias_geglu.geglu(y), expected)
    assert compiled == ["geglu"] and "torch._dynamo" in sys.modules
    fused_bias_geglu.geglu(y)
    assert compiled == ["geglu"]
    print("ok")
""")


def test_megatron_core_imports_without_the_compiler_and_its_fusions_compile_when_first_called():
    result = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().endswith("ok")
