"""Import megatron-core without importing torch.compile's machinery until a compiled function first runs.

Why: megatron-core 0.16.1 sets `jit_fuser = torch.compile` (megatron/core/jit.py) and decorates its fusions
(bias-GeLU, GeGLU, SwiGLU, bias-dropout-add, ...) while `megatron.core` imports. Each decoration imports
torch._dynamo and torch._inductor: 1.8 s of every process's start on this project's CI machine (4.7 s
without this patch, 2.9 s with it: `time .venv/bin/python -c "import patches; from megatron.core.models.gpt
import GPTModel"` against the same line without `import patches;`), paid by
every rank of every run, also by runs that never call a fused function (the fusions are off on CPU and
with `--no-bias-*-fusion`).

What: while `megatron.core` imports, `torch.compile` is a stand-in that returns a function which calls the
real `torch.compile` with the same arguments at its first call and then the compiled function. torch.compile
itself compiles only at the first call, so what runs, and when it compiles, is unchanged on every device.
Outside that import `torch.compile` is the real one. When megatron.core is already imported this does nothing.
Targets: megatron-core 0.16.1 (`jit.py` binds `torch.compile` at import); harmless on any other version.
Removable when: megatron-core no longer decorates with torch.compile at import.
"""
from __future__ import annotations

import functools
import importlib
import sys
from typing import Any, Callable


def import_megatron_core() -> None:
    """Import megatron.core, with torch.compile deferred to each compiled function's first call."""
    if "megatron.core" in sys.modules:
        return
    import torch

    real_compile = torch.compile
    torch.compile = deferred(real_compile)
    try:
        importlib.import_module("megatron.core")
    finally:
        torch.compile = real_compile


def deferred(compile_fn: Callable[..., Any]) -> Callable[..., Any]:
    """A torch.compile look-alike that calls `compile_fn(model, **options)` when the result is first called."""

    def compile_later(model: Any = None, **options: Any) -> Any:
        if model is None:  # used as @torch.compile(mode=...)
            return lambda fn: compile_later(fn, **options)
        compiled = None

        @functools.wraps(model)
        def run(*args: Any, **kwargs: Any) -> Any:
            nonlocal compiled
            if compiled is None:
                compiled = compile_fn(model, **options)
            return compiled(*args, **kwargs)

        return run

    return compile_later
