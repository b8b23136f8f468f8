"""The switch for the search's stage floors and shared caches (issue 37, item 6), and those caches' lifetime.

Both only leave out what cannot win, or reuse what was priced before, so the search returns the same plan
with them or without them; tests/test_search_speed.py runs small searches both ways and compares them.
The caches made by `search_cache` live for one search_plan call (it empties them first): they share work
between the searches of its --recompute-modules sets, and never carry a module setting (the splits searched,
say) from one call into the next.
"""
from __future__ import annotations

from contextlib import contextmanager
from functools import lru_cache
from typing import Callable, Iterator

_state = {"enabled": True}
_CACHES: list = []


def enabled() -> bool:
    """Whether the stage floors (search/stage_bound.py) and the shared caches are used."""
    return _state["enabled"]


@contextmanager
def unpruned() -> Iterator[None]:
    """Run the `with` body as the search ran before issue 37: only the older bounds, no shared caches."""
    before = _state["enabled"]
    _state["enabled"] = False
    try:
        yield
    finally:
        _state["enabled"] = before


def search_cache(maxsize: int) -> Callable:
    """functools.lru_cache(maxsize) of a pure function, emptied by clear_search_caches."""
    def decorate(function: Callable) -> Callable:
        cached = lru_cache(maxsize=maxsize)(function)
        _CACHES.append(cached.cache_clear)
        return cached
    return decorate


def search_memo() -> dict:
    """A dict memo, emptied by clear_search_caches."""
    memo: dict = {}
    _CACHES.append(memo.clear)
    return memo


def clear_search_caches() -> None:
    """Empty every cache made by search_cache and search_memo (search_plan does, before it searches)."""
    for clear in _CACHES:
        clear()
