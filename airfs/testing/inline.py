"""Tests of operations the core answers *inline* (the fast open, its release): run a
coroutine to its end on the spot, and fail if it would have waited."""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def inline(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` to its end without an event loop and return its result; raise
    ``AssertionError`` if it yields to trio (it would have waited: a lock, a thread, I/O)."""
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    coro.close()
    raise AssertionError("the call waited (yielded to trio)")
