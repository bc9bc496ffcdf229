"""Page-aligned buffers for fetched parts, reused while they are in use (:class:`PartBuffers`).

A fetched part's bytes need memory for as long as its readers are answered from it and its
worker thread writes it into the cache file. Taken fresh for every part (the origin client's
own buffer for each ranged GET), each byte lands on a page the process never touched: on a
virtual machine that gives freed memory back to its host (free page reporting), the host must
fault it in again, and the kernel clears it: ~1 CPU second per GiB where this was measured,
against 0.03 s for a copy into memory in use (``docs/benchmarks.md``, stop 41). A part read
into a buffer of this pool lands on pages already in place, and being page-aligned it is
written into the cache file with ``O_DIRECT`` as it is (no bounce copy,
:mod:`airfs.cache.direct`).

A buffer is *leased* as a writable ``memoryview`` (:meth:`PartBuffers.lease`). It goes back to
the pool only when nothing refers to it any more: the lease object exports the memory, every
view made of the lease (slices, read-only views, views held by a reply thread) keeps the lease
alive, and its finalizer returns the memory when the last one is gone. So a buffer is never
reused while any view of it can still be read. The pool keeps at most ``idle_max`` idle
buffers, and :meth:`PartBuffers.trim` unmaps those idle longer than a few seconds (a daemon
that stopped reading cold data gives its memory back). Thread-safe without a lock (the free
list is a ``deque``, whose appends and pops are atomic): a finalizer can run in any thread,
even one that is inside :meth:`lease`.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import mmap
import time

__all__ = ["PartBuffers"]

#: Alignment of every buffer (a page: what ``O_DIRECT`` asks of a buffer's address)
ALIGN = mmap.PAGESIZE


class PartBuffers:
    """Buffers of ``size`` bytes (rounded up to a page); at most ``idle_max`` kept idle."""

    def __init__(self, size: int, idle_max: int) -> None:
        self.size = -(-size // ALIGN) * ALIGN
        self.idle_max = idle_max
        self._free: collections.deque[tuple[mmap.mmap, float]] = collections.deque()
        self.made = 0  # buffers mapped so far (statistics: a pool that works maps few)
        self.leased = 0  # leases handed out so far
        pool = self

        class Lease(ctypes.c_char * self.size):  # type: ignore[misc]
            """Exports one pool buffer; gives it back when the last view of it is gone."""

            __slots__ = ("mm",)

            def __del__(self) -> None:
                with contextlib.suppress(Exception):  # at interpreter exit: nothing to keep
                    pool._give(self.mm)

        self._lease_type = Lease

    def lease(self, n: int) -> memoryview:
        """A writable view of ``n`` bytes (``0 < n <= size``) at the start of a page-aligned
        buffer, reused when the pool has one idle (the most recently returned: its pages are
        the likeliest still in place). The buffer returns to the pool when the returned view
        and every view made from it are gone."""
        if not 0 < n <= self.size:
            raise ValueError(f"lease of {n} bytes from a pool of {self.size}-byte buffers")
        try:
            mm = self._free.pop()[0]
        except IndexError:
            mm = self._map()
        self.leased += 1
        lease = self._lease_type.from_buffer(mm)
        lease.mm = mm
        return memoryview(lease).cast("B")[:n]

    def _map(self) -> mmap.mmap:
        """A new buffer: private anonymous memory in huge pages where the kernel has them
        (``MADV_HUGEPAGE``: 4 page faults per 8 MiB instead of 2,048; the pages are still
        cleared on first touch, which reuse is for)."""
        mm = mmap.mmap(-1, self.size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        advice = getattr(mmap, "MADV_HUGEPAGE", None)
        if advice is not None:
            with contextlib.suppress(OSError):  # no transparent huge pages: small ones
                mm.madvise(advice)
        self.made += 1
        return mm

    def _give(self, mm: mmap.mmap) -> None:
        """The finalizer of a lease: keep ``mm`` for the next lease, or let it be unmapped."""
        if len(self._free) < self.idle_max:
            self._free.append((mm, time.monotonic()))

    @property
    def idle(self) -> int:
        """Buffers idle in the pool now."""
        return len(self._free)

    def trim(self, idle_s: float) -> int:
        """Unmap the buffers idle for more than ``idle_s`` seconds (all of them with 0);
        returns how many."""
        cutoff = time.monotonic() - idle_s
        dropped = 0
        while True:
            try:
                mm, since = self._free.popleft()
            except IndexError:
                return dropped
            if since > cutoff:  # the rest are younger: keep them (back at the old end)
                self._free.appendleft((mm, since))
                return dropped
            dropped += 1
            with contextlib.suppress(BufferError):  # a finalizer still exports it: unmapped
                mm.close()  # when that is done
