"""LRU eviction under a byte limit and a free-disk floor.

The cache may hold ``min(cache_size, used + free_disk - min_free)`` bytes (:class:`SpaceLimit`).
Before data is written to the cache its bytes are *reserved*; when they do not fit,
:func:`plan_eviction` picks what goes, in two passes over objects from least to most recently
used:

1. whole objects that nobody uses (no open reader, no warm/adopt, no fetch or file operation in
   flight) — the common case;
2. only if that is not enough: single blocks of objects that *are* in use, but never blocks
   inside a reader's active range (:meth:`airfs.cache.prefetch.Stream.active_range`: its position,
   a seek tolerance behind it, and its prefetch horizon), nor blocks of an object being warmed
   or adopted, nor blocks being fetched, nor blocks of a file that was a passthrough backing
   file (a process may still have it mapped; whole-object eviction unlinks, which a mapping
   survives). This is what lets a file larger than the cache be
   streamed through it.

If both passes together cannot free enough, the reservation fails and the fetched data is
served to its readers without being cached. Nothing is ever pulled from under an open reader's
current position. Dirty data never lives here (the write path keeps its own staging files).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from .store import CachedObject

__all__ = ["EvictionPlan", "SpaceLimit", "plan_eviction"]


class SpaceLimit:
    """How many bytes the cache may hold now: ``cache_size``, lowered when the file system's free
    space would drop under ``min_free``.

    Free space is measured with ``statvfs`` at most every ``interval`` seconds (a cheap system
    call) and estimated in between from the bytes the cache itself added since.
    """

    def __init__(
        self,
        path: str,
        cache_size: int,
        min_free: int,
        *,
        interval: float = 1.0,
        statvfs: Callable[[str], os.statvfs_result] = os.statvfs,
    ) -> None:
        self.path = path
        self.cache_size = cache_size
        self.min_free = min_free
        self.interval = interval
        self._statvfs = statvfs
        self._at = -1e18
        self._free = 0
        self._used_at = 0

    def free_bytes(self) -> int:
        """Free disk space at the last measurement."""
        return self._free

    def limit(self, used: int) -> int:
        """The most the cache may hold, given that it holds ``used`` bytes now."""
        if self.min_free <= 0:
            return self.cache_size
        now = time.monotonic()
        if now - self._at >= self.interval:
            st = self._statvfs(self.path)
            self._free = st.f_bavail * st.f_frsize
            self._at = now
            self._used_at = used
        est_free = self._free - (used - self._used_at)
        return max(0, min(self.cache_size, used + est_free - self.min_free))

    def invalidate(self) -> None:
        """Measure again at the next :meth:`limit` (e.g. after files were deleted)."""
        self._at = -1e18


@dataclass
class EvictionPlan:
    """What to evict: whole objects, and block indices of objects in use."""

    objects: list[CachedObject] = field(default_factory=list)
    blocks: list[tuple[CachedObject, list[int]]] = field(default_factory=list)
    nbytes: int = 0


def _protected(obj: CachedObject) -> list[tuple[int, int]]:
    """Block ranges ``[b0, b1)`` of ``obj`` that must stay."""
    bs = obj.block_size
    out = []
    for reader in obj.readers:
        lo, hi = reader.active_range()
        out.append((lo // bs, -(-hi // bs) + 1))
    return out


def plan_eviction(
    lru: Iterable[CachedObject], need: int, exclude: CachedObject | None = None
) -> EvictionPlan:
    """Choose at least ``need`` bytes to evict (fewer if that is all there is), least recently
    used first; see the module docstring for the rules. ``exclude`` (the object the space is
    for) gives up blocks only in pass 2, like any object in use. Does nothing itself."""
    plan = EvictionPlan()
    in_use: list[CachedObject] = []
    for obj in lru:
        if plan.nbytes >= need:
            return plan
        if obj.cached <= 0:
            continue
        if obj is exclude or obj.busy():
            in_use.append(obj)
            continue
        plan.objects.append(obj)
        plan.nbytes += obj.cached
    for obj in in_use:
        if plan.nbytes >= need:
            break
        have = obj.have
        if have is None or obj.pins or obj.passed_through:
            continue
        ranges = _protected(obj)
        picked = []
        b = _next_present(have, 0)
        while b >= 0 and plan.nbytes < need:
            if b not in obj.inflight and not any(lo <= b < hi for lo, hi in ranges):
                picked.append(b)
                plan.nbytes += obj.block_len(b)
            b = _next_present(have, b + 1)
        if picked:
            plan.blocks.append((obj, picked))
    return plan


def _next_present(have: bytearray, start: int) -> int:
    """Index of the first present block at or after ``start``, or -1."""
    a = have.find(1, start)
    b = have.find(2, start)
    if a < 0:
        return b
    return a if b < 0 else min(a, b)
