"""A stand-in for the `torch` name inside chosen megatron-core modules on CPU hosts.

Not a patch itself: the patches in this package put a `CpuTorch` object in the
globals of the megatron-core modules they fix, in place of `torch`. Functions
there then resolve `torch.cuda.current_device()`, `torch.cuda.synchronize()`,
streams and `device="cuda"` tensor factories to CPU equivalents at call time,
while every other attribute is the real `torch`. Nothing outside those modules
sees a difference.
"""
from __future__ import annotations

import contextlib
import functools
from typing import Any

import torch

CPU = torch.device("cpu")

# Tensor factories that take a `device` keyword which megatron-core hard-codes to "cuda".
_FACTORIES = ("empty", "zeros", "ones", "full", "tensor", "arange", "rand", "randn", "as_tensor")


def cpu_device(device: Any) -> Any:
    """Map any CUDA device spelling (`"cuda"`, `"cuda:0"`, `0`, a cuda `torch.device`) to the CPU."""
    if device is None:
        return None
    if isinstance(device, int) and not isinstance(device, bool):
        return CPU
    if isinstance(device, str) and device.startswith("cuda"):
        return CPU
    if isinstance(device, torch.device) and device.type == "cuda":
        return CPU
    return device


def _factory_on_cpu(factory):
    @functools.wraps(factory)
    def wrapper(*args, **kwargs):
        if "device" in kwargs:
            kwargs["device"] = cpu_device(kwargs["device"])
        return factory(*args, **kwargs)

    return wrapper


class _NullEvent:
    """A CUDA event that is always complete: on CPU every op is already ordered."""

    def synchronize(self) -> None:
        pass

    def wait(self, stream: Any = None) -> None:
        pass

    def query(self) -> bool:
        return True


class _NullStream:
    """A CUDA stream that never waits: on CPU every op is already ordered."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def wait_stream(self, other: Any) -> None:
        pass

    def wait_event(self, event: Any) -> None:
        pass

    def record_event(self, event: Any = None) -> _NullEvent:
        return event if event is not None else _NullEvent()

    def synchronize(self) -> None:
        pass


class CpuCuda:
    """`torch.cuda` as megatron-core's data-movement code uses it, answered on the CPU."""

    Stream = _NullStream

    def __getattr__(self, name: str) -> Any:
        return getattr(torch.cuda, name)

    @staticmethod
    def current_device() -> torch.device:
        return CPU

    @staticmethod
    def synchronize(device: Any = None) -> None:
        pass

    @staticmethod
    def current_stream(device: Any = None) -> _NullStream:
        return _NullStream()

    @staticmethod
    def default_stream(device: Any = None) -> _NullStream:
        return _NullStream()

    @staticmethod
    def stream(stream: Any) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    @staticmethod
    def is_available() -> bool:
        return False


class CpuTorch:
    """`torch` with `.cuda` answered by `CpuCuda` and CUDA devices in factories mapped to CPU."""

    def __init__(self, cuda: CpuCuda | None = None) -> None:
        self.cuda = cuda or CpuCuda()
        for name in _FACTORIES:
            setattr(self, name, _factory_on_cpu(getattr(torch, name)))

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)

    def __repr__(self) -> str:
        return "<CpuTorch proxy of torch>"


def install(module: Any, cuda: CpuCuda | None = None) -> None:
    """Point `module`'s global name `torch` at a CpuTorch proxy (idempotent)."""
    current = module.__dict__.get("torch")
    if isinstance(current, CpuTorch):
        return
    if current is not torch:
        raise RuntimeError(f"{module.__name__}: expected its global `torch` to be the torch module, found {current!r}")
    module.torch = CpuTorch(cuda)


def is_installed(module: Any) -> bool:
    return isinstance(module.__dict__.get("torch"), CpuTorch)


def module_swap_patch(name: str, versions: tuple[str, ...], targets: tuple[tuple[str, str], ...]):
    """check, apply and is_applied for a patch that installs the CPU stand-in for `torch`
    inside each target module, after checking that the module still contains its marker text."""
    import importlib

    from ._checks import require_text, require_version

    def check() -> list:
        """Raise PatchTargetChanged unless the version and every target's marker text still match."""
        require_version(name, versions)
        return [require_text(module, text, name) for module, text in targets]

    def apply() -> None:
        for module in check():
            install(module)

    def is_applied() -> bool:
        return all(is_installed(importlib.import_module(module)) for module, _ in targets)

    return check, apply, is_applied
