"""Rewrite one megatron-core function from its own source, with checked replacements.

Not a patch itself: patches use `rewrite_function` when the CUDA assumption sits
inside an expression (e.g. `param.type() == 'torch.cuda.FloatTensor'`) that no
module-level substitution can reach. Every replacement states how often its old
text must occur, so a changed upstream fails at apply time instead of silently
running the unpatched code.
"""
from __future__ import annotations

import importlib
import inspect
import textwrap
from dataclasses import dataclass
from typing import Any

from ._checks import PatchTargetChanged, require_version

__all__ = ["PatchTargetChanged", "Replacement", "has_replacements", "patched_source", "rewrite_function",
           "source_rewrite_patch"]


@dataclass(frozen=True)
class Replacement:
    """Replace `old` by `new`, which must occur exactly `count` times."""

    old: str
    new: str
    count: int = 1


def _raw_function(owner: Any, name: str) -> tuple[Any, Any]:
    """(function, wrapper kind) of `owner.name`, unwrapping staticmethod/classmethod."""
    raw = owner.__dict__.get(name) if hasattr(owner, "__dict__") else None
    if raw is None:
        raise PatchTargetChanged(f"{getattr(owner, '__name__', owner)}.{name} no longer exists")
    if isinstance(raw, (staticmethod, classmethod)):
        return raw.__func__, type(raw)
    return raw, None


def patched_source(owner: Any, name: str, replacements: tuple[Replacement, ...]) -> str:
    """The rewritten source text of `owner.name`, checking every replacement's count."""
    func, _ = _raw_function(owner, name)
    func = getattr(func, "__wrapped_original__", func)  # once rewritten, re-check the upstream text
    source = textwrap.dedent(inspect.getsource(func))
    where = f"{func.__module__}.{func.__qualname__}"
    for rep in replacements:
        found = source.count(rep.old)
        if found != rep.count:
            raise PatchTargetChanged(f"{where}: expected {rep.count} occurrence(s) of {rep.old!r}, found {found}")
        source = source.replace(rep.old, rep.new)
    return source


def rewrite_function(owner: Any, name: str, replacements: tuple[Replacement, ...],
                     rebind: tuple[Any, ...] = ()) -> Any:
    """Install the rewritten `owner.name` and return it; `rebind` lists modules that imported it by name.
    Patches that rewrite the same function compose: each rewrite starts again from the upstream source
    with the replacements already installed plus the new ones."""
    func, wrapper = _raw_function(owner, name)
    installed = getattr(func, "__megatron_auto_replacements__", ())
    if all(rep in installed for rep in replacements):
        return func
    replacements = installed + tuple(rep for rep in replacements if rep not in installed)
    source = patched_source(owner, name, replacements)
    # Compile inside a closure that defines __class__ so zero-argument super() keeps working.
    body = textwrap.indent(source, "    ")
    outer = f"def __megatron_auto_outer__(__class__):\n{body}\n    return {func.__name__}\n"
    namespace: dict[str, Any] = {}
    exec(compile(outer, f"<patched {func.__module__}.{func.__qualname__}>", "exec"), func.__globals__, namespace)
    new = namespace["__megatron_auto_outer__"](owner if inspect.isclass(owner) else None)
    new.__qualname__ = func.__qualname__
    new.__module__ = func.__module__
    new.__megatron_auto_patched__ = True
    new.__megatron_auto_replacements__ = replacements
    new.__wrapped_original__ = getattr(func, "__wrapped_original__", func)
    setattr(owner, name, wrapper(new) if wrapper else new)
    for module in rebind:
        if module.__dict__.get(name) is not func:
            raise PatchTargetChanged(f"{module.__name__}.{name} is not the function imported from {func.__module__}")
        setattr(module, name, new)
    return new


def source_rewrite_patch(name: str, versions: tuple[str, ...], module: str, owner: str,
                         targets: tuple[tuple[str, tuple[Replacement, ...]], ...]):
    """check, apply and is_applied for a patch that rewrites lines of `owner`'s methods
    (class `owner` in `module`), after checking each line still reads as expected."""

    def owner_class():
        return getattr(importlib.import_module(module), owner)

    def check() -> None:
        """Raise PatchTargetChanged unless the version and every line to replace still match."""
        require_version(name, versions)
        for function, replacements in targets:
            patched_source(owner_class(), function, replacements)

    def apply() -> None:
        check()
        for function, replacements in targets:
            rewrite_function(owner_class(), function, replacements)

    def is_applied() -> bool:
        return all(has_replacements(owner_class(), function, replacements) for function, replacements in targets)

    return check, apply, is_applied


def has_replacements(owner: Any, name: str, replacements: tuple[Replacement, ...]) -> bool:
    """Whether `owner.name` runs rewritten with all of `replacements` (a patch's is_applied)."""
    func, _ = _raw_function(owner, name)
    return all(rep in getattr(func, "__megatron_auto_replacements__", ()) for rep in replacements)
