"""Shared guards: every patch refuses to touch a megatron-core it was not written for."""
from __future__ import annotations

import importlib
import inspect
from types import ModuleType


class PatchTargetChanged(RuntimeError):
    """The megatron-core code a patch rewrites no longer looks as the patch expects."""


def megatron_core_version() -> str:
    """The installed megatron-core's version string (imported only when a patch is checked)."""
    import megatron.core

    return megatron.core.__version__


def require_version(patch: str, targets: tuple[str, ...]) -> None:
    """Raise unless the installed megatron-core is one the patch was checked against."""
    version = megatron_core_version()
    if version not in targets:
        raise PatchTargetChanged(
            f"patch {patch} targets megatron-core {', '.join(targets)}, but {version} is installed; "
            "re-check the patch against the new source and extend its TARGET_VERSIONS")


def require_text(module_name: str, text: str, patch: str) -> ModuleType:
    """Import `module_name` and raise unless its source still contains `text`."""
    module = importlib.import_module(module_name)
    if text not in inspect.getsource(module):
        raise PatchTargetChanged(f"patch {patch}: {module_name} no longer contains {text!r}; the patch may be obsolete")
    return module
