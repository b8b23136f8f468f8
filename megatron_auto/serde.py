"""JSON round-tripping for the frozen dataclass trees of specs, profiles and plans.

Each record is a frozen dataclass whose fields are ints, floats, strings, bools,
None, nested records, or tuples of those. `to_dict` writes every field;
`from_dict` rejects unknown keys, fills in defaults and checks the types, so a
malformed file fails with one clear `UserError` instead of a `KeyError` later.

It also checks every number it loads, so that no record needs to know the rule:
a float must be finite, and a number must not be negative (no field of these
records means anything below zero). A field declared with `checked(...)` must in
addition be positive (where zero would divide or mean nothing) or stay at most a
bound (fractions); a field added later gets the generic checks for free.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import math
import typing
from pathlib import Path
from typing import Any, Callable, Hashable, TypeVar

from .errors import UserError

T = TypeVar("T")
MAX_INT = 2**53
"""Largest integer a file may give: above it an int no longer converts to a float exactly, and the
cost model's products of sizes could overflow a float."""


def checked(*, positive: bool = False, at_most: float | None = None, **field_kwargs: Any) -> Any:
    """A dataclass field that `from_dict` also checks: > 0 when `positive`, <= `at_most` when given."""
    return dataclasses.field(metadata={"positive": positive, "at_most": at_most}, **field_kwargs)


def to_dict(record: Any) -> Any:
    """Plain JSON-ready data for a record, recursing into records and tuples."""
    if dataclasses.is_dataclass(record) and not isinstance(record, type):
        return {f.name: to_dict(getattr(record, f.name)) for f in dataclasses.fields(record)}
    if isinstance(record, (tuple, list)):
        return [to_dict(item) for item in record]
    return record


def dumps(record: Any) -> str:
    """Canonical JSON text: sorted keys, fixed indent, so equal records give equal bytes."""
    return json.dumps(to_dict(record), indent=2, sort_keys=True) + "\n"


def from_dict(cls: type[T], data: Any, where: str = "") -> T:
    """Build `cls` from parsed JSON, raising UserError on any mismatch."""
    where = where or cls.__name__
    if not isinstance(data, dict):
        raise UserError(f"{where}: expected a JSON object, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise UserError(f"{where}: unknown key(s) {', '.join(unknown)}")
    kwargs = {}
    for name, field in fields.items():
        if name in data:
            kwargs[name] = _convert(hints[name], data[name], f"{where}.{name}")
            _check_bounds(field, kwargs[name], f"{where}.{name}")
        elif field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
            raise UserError(f"{where}: missing required key '{name}'")
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as error:
        raise UserError(f"{where}: {error}") from None


def _convert(hint: Any, value: Any, where: str) -> Any:
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin is typing.Union:
        if value is None and type(None) in args:
            return None
        return _convert(next(a for a in args if a is not type(None)), value, where)
    if origin is tuple:
        if not isinstance(value, list):
            raise UserError(f"{where}: expected a list, got {type(value).__name__}")
        return tuple(_convert(args[0], item, f"{where}[{i}]") for i, item in enumerate(value))
    if dataclasses.is_dataclass(hint):
        return from_dict(hint, value, where)
    return _check_scalar(hint, value, where)


def _check_bounds(field: dataclasses.Field, value: Any, where: str) -> None:
    """The bounds that `checked(...)` declared on the field."""
    if value is None:
        return
    if field.metadata.get("positive") and not value > 0:
        raise UserError(f"{where}: must be positive, got {value!r}")
    at_most = field.metadata.get("at_most")
    if at_most is not None and value > at_most:
        raise UserError(f"{where}: must be at most {at_most}, got {value!r}")


def check_number(value: int | float, where: str) -> None:
    """What every number in a record obeys: finite, not negative, and an int at most MAX_INT."""
    if isinstance(value, float) and not math.isfinite(value):
        raise UserError(f"{where}: must be a finite number, got {value!r}")
    if value < 0:
        raise UserError(f"{where}: must not be negative, got {value!r}")
    if isinstance(value, int) and value > MAX_INT:
        raise UserError(f"{where}: must be at most 2**53, got {value!r}")


def _check_scalar(hint: Any, value: Any, where: str) -> Any:
    if hint is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        check_number(value, where)
        return float(value)
    if hint is int and isinstance(value, int) and not isinstance(value, bool):
        check_number(value, where)
        return value
    if hint in (str, bool) and isinstance(value, hint):
        return value
    if hint is typing.Any:
        return value
    raise UserError(f"{where}: expected {getattr(hint, '__name__', hint)}, got {value!r}")


def read_json(path: str | Path, what: str) -> Any:
    """Parse a JSON file, turning missing files, other encodings and bad syntax into UserError."""
    try:
        text = Path(path).read_bytes().decode("utf-8")
    except OSError as error:
        raise UserError(f"cannot read {what} file '{path}': {error.strerror or error}") from None
    except UnicodeDecodeError as error:
        raise UserError(f"{what} file '{path}' is not UTF-8 text (byte {error.start})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise UserError(f"{what} file '{path}' is not valid JSON: {error.msg} at line {error.lineno}") from None
    except RecursionError:
        raise UserError(f"{what} file '{path}' nests JSON too deeply") from None


def replaced_unchecked(record, **changes):
    """dataclasses.replace(record, **changes) without running __init__ and __post_init__ (a fifth of its cost), for
    frozen records whose checks read none of the changed fields. Only the fields are copied: no cached property
    outlives the change."""
    names = _field_names(type(record))
    unknown = changes.keys() - names
    if unknown:
        raise TypeError(f"{type(record).__name__} has no field {sorted(unknown)[0]!r}")
    state = record.__dict__
    copy = object.__new__(type(record))
    copy.__dict__.update({name: state[name] for name in names}, **changes)
    return copy


@functools.lru_cache(maxsize=None)
def _field_names(cls: type) -> frozenset:
    return frozenset(field.name for field in dataclasses.fields(cls))


def memoised_on(key: Callable[..., Hashable], maxsize: int) -> Callable:
    """Memoise a pure function on `key(*args)` rather than on all its arguments, emptied once it holds `maxsize`
    entries: for a function that reads less of an argument than the whole (a layer's per-micro-batch terms read
    no data-parallel degree, LayerStrategy.per_micro_batch_key), so that one entry serves every argument that
    differs only in what it does not read. The wrapper's cache_clear() empties it."""
    def decorate(function: Callable) -> Callable:
        memo: dict = {}

        @functools.wraps(function)
        def memoised(*args):
            entry = key(*args)
            found = memo.get(entry)
            if found is None:
                if len(memo) >= maxsize:
                    memo.clear()
                found = memo[entry] = function(*args)
            return found
        memoised.cache_clear = memo.clear
        return memoised
    return decorate


class CachedHash:
    """Mixin for frozen records used as cache keys: hash the fields once.

    The cost model memoises on (layer, strategy, cluster, training); re-hashing
    a 96-layer ModelSpec on every lookup dominated the search's run time.
    A dataclass(frozen=True) subclass must say `__hash__ = CachedHash.__hash__`
    in its body, or the decorator replaces this method with its own.
    """

    __slots__ = ()

    def __hash__(self) -> int:
        try:
            return self._cached_hash  # an attribute read is the cheapest lookup: the search does millions
        except AttributeError:
            cached = hash(tuple(getattr(self, f.name) for f in dataclasses.fields(self)))
            object.__setattr__(self, "_cached_hash", cached)
            return cached

    def __getstate__(self) -> dict:
        """Pickles without the cached hash: string hashes differ between processes."""
        state = dict(self.__dict__)
        state.pop("_cached_hash", None)
        return state
