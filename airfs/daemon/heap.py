"""The daemon's C heap (glibc malloc): how many arenas it may use, and giving free memory back.

Why (issue 11, "Memory"; numbers in docs/benchmarks.md, "Daemon memory over load rounds"):
most of the memory the daemon keeps after a burst of work is not live objects but *free*
memory that glibc keeps in its arenas. glibc gives each thread that contends for the heap an
arena of its own, up to eight per core, and a free chunk inside an arena only goes back to the
system when it is at the very top of the main heap. The daemon's worker threads (trio's thread
cache, obstore's runtime) allocate and free many buffers of 1-64 MiB, so after a few load
rounds tens of MiB sit free in a dozen arenas (``mallinfo2().fordblks``), for good.

Two remedies, both applied by the daemon (:func:`airfs.daemon.process.run`) and both no-ops where
the C library is not glibc:

* :func:`limit_arenas` caps the arenas (``mallopt(M_ARENA_MAX)``) before any worker thread
  starts, unless ``MALLOC_ARENA_MAX`` is in the environment (then glibc's own reading of it
  stands);
* :func:`trim_when_idle` calls ``malloc_trim(0)`` (which returns the free pages of every
  arena, not just the top of the main heap) once the filesystem has been quiet for a while.
"""

from __future__ import annotations

import ctypes
import logging
import os
from collections.abc import Callable
from typing import Any

import trio

from .config import env_setting

log = logging.getLogger(__name__)

#: glibc's ``mallopt`` parameter number for the arena cap
M_ARENA_MAX = -8
#: the daemon's arena cap (see docs/benchmarks.md for what more arenas cost in memory)
DAEMON_ARENAS = 2
#: seconds without a filesystem request after which the heap is trimmed (``AIRFS_HEAP_TRIM_S``
#: overrides, 0 turns trimming off)
TRIM_IDLE_S = 5.0


def _libc() -> Any | None:
    try:
        libc = ctypes.CDLL(None)
        libc.mallopt  # noqa: B018 - glibc only
        libc.malloc_trim  # noqa: B018
    except (OSError, AttributeError):
        return None
    return libc


def limit_arenas(n: int = DAEMON_ARENAS) -> bool:
    """Cap glibc's malloc arenas at ``n`` (call before worker threads start: arenas already
    made stay). Does nothing (False) when ``MALLOC_ARENA_MAX`` is set or this is not glibc."""
    if n < 1:
        raise ValueError("the arena cap must be at least 1")
    libc = _libc()
    if libc is None or "MALLOC_ARENA_MAX" in os.environ:
        return False
    return bool(libc.mallopt(M_ARENA_MAX, n))


def trim() -> bool:
    """``malloc_trim(0)``: give the free pages of every arena back to the system. Blocking
    (milliseconds for a heap of a few hundred MiB): run it in a worker thread. False when
    nothing was released or this is not glibc."""
    libc = _libc()
    return bool(libc is not None and libc.malloc_trim(0))


def trim_idle_seconds() -> float:
    """:data:`TRIM_IDLE_S`, or ``AIRFS_HEAP_TRIM_S`` when set (a number of seconds, 0: off)."""
    return env_setting(
        "AIRFS_HEAP_TRIM_S", TRIM_IDLE_S, float, "a number of seconds",
        lambda v: v >= 0 and v != float("inf"), "must be >= 0 and finite",
    )  # fmt: skip


async def trim_when_idle(
    activity: Callable[[], int],
    idle_s: float,
    trimmer: Callable[[], bool] = trim,
    *,
    in_thread: bool = True,
) -> None:
    """Forever: every ``idle_s`` seconds read ``activity()`` (a counter that moves with the
    filesystem's work, e.g. requests served); when it has not moved for one whole period and
    moved since the last trim, call ``trimmer`` in a worker thread. So the heap is trimmed
    once after each burst of work, never while requests keep coming, and never again while
    the mount stays idle. ``idle_s`` 0: returns at once (trimming off). ``in_thread`` False
    (tests) calls ``trimmer`` on the loop."""
    if idle_s <= 0:
        return
    last = activity()
    trimmed_at = last
    while True:
        await trio.sleep(idle_s)
        now = activity()
        if now != last:
            last = now  # busy: look again one period later
            continue
        if now != trimmed_at:
            if in_thread:
                await trio.to_thread.run_sync(trimmer)
            else:
                trimmer()
            trimmed_at = now
