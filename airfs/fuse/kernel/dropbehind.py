"""Drop-behind: the kernel's page cache of a file read once, sequentially, through the daemon
is given back behind its reader.

A cold read served by the daemon leaves every byte twice on the node: in airfs's cache file
(on disk, written with ``O_DIRECT``: :mod:`airfs.cache.direct`) and in the page cache of the
FUSE file, which the kernel fills as it reads ahead. The second copy has no later use when
passthrough is on: the next open of the whole cached file is served from the cache file by
the kernel itself. Keeping it costs memory the job wants for itself, and on a virtual machine
whose free memory goes back to the host (free page reporting) every new page is faulted in
from the host first: a cold read of 2 GiB took 2 GiB of new pages (see
``docs/benchmarks.md``, "Stop 35"). Dropping the pages a reader has passed keeps its page
cache to a window of recycled pages.

:class:`DropBehind` is the policy alone (no kernel, no I/O): the transport tells it which
handles qualify (:meth:`track`: read-only opens served by the daemon) and every ``READ`` of
them (:meth:`read`), and sends the range it returns as a ``FUSE_NOTIFY_INVAL_INODE`` of
those pages, from the notifier's thread (never the loop: the kernel locks each page it drops,
and a page being read waits for a reply only the loop can send). A range is only ever one
within the span that the handle's current sequential run read (reads at most ``jitter``
apart), ending at least ``keep`` bytes behind the furthest byte that run read: pages the
reader is still using, or that a random reader of the same handle came back to, are not
dropped. A dropped page that is read again is asked of the daemon again (which serves it
from the cache file): never wrong, only slower.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DropBehind", "DropStats"]

PAGE = 4096


@dataclass(frozen=True, slots=True)
class DropStats:
    """``DropBehind.statistics()``: ranges dropped and their bytes, handles tracked now."""

    drops: int
    dropped_bytes: int
    tracked: int


class _Run:
    """One handle's current sequential run: ``[start, end)`` read, ``[start, dropped)``
    dropped."""

    __slots__ = ("dropped", "end", "start")

    def __init__(self, start: int, end: int) -> None:
        self.start = self.dropped = start
        self.end = end


class DropBehind:
    """Which pages of which handles to drop behind their readers.

    ``keep``: bytes kept behind the furthest byte a run read (the kernel's readahead arrives
    up to a few MiB out of order, and a reader may look back a little); ``step``: the least
    that is dropped at once (one notification per ``step`` bytes read: each costs the kernel
    more than its pages do, measured: 32 MiB steps took 0.3 CPU s per GiB of a cold read
    through the mount, 128 MiB steps none that showed); ``jitter``: how far
    from its run's end a read may land and still continue it (readahead requests answered
    out of order). All multiples of the page size."""

    def __init__(self, *, keep: int = 64 << 20, step: int = 128 << 20, jitter: int = 8 << 20):
        for name, v in (("keep", keep), ("step", step), ("jitter", jitter)):
            if v <= 0 or v % PAGE:
                raise ValueError(f"{name} must be a positive multiple of {PAGE}: {v}")
        self.keep, self.step, self.jitter = keep, step, jitter
        self._runs: dict[int, _Run | None] = {}
        self._drops = 0
        self._dropped_bytes = 0

    def track(self, fh: int) -> None:
        """Handle ``fh`` qualifies (a read-only open served by the daemon)."""
        self._runs[fh] = None

    def forget(self, fh: int) -> None:
        """Handle ``fh`` was released (a no-op for one not tracked)."""
        self._runs.pop(fh, None)

    def read(self, fh: int, off: int, size: int) -> tuple[int, int] | None:
        """Record a read of ``size`` bytes at ``off`` through ``fh``; the byte range
        ``(offset, length)`` to drop now (page-aligned), or None."""
        if fh not in self._runs or size <= 0:
            return None
        run = self._runs[fh]
        end = off + size
        if run is None or not run.end - self.jitter <= off <= run.end + self.jitter:
            self._runs[fh] = _Run(off, end)  # a new run: nothing of it is read yet
            return None
        run.end = max(run.end, end)
        if off < run.start and run.dropped == run.start:  # an earlier request answered late
            run.start = run.dropped = off
        lo = -(-run.dropped // PAGE) * PAGE
        hi = (run.end - self.keep) // PAGE * PAGE
        if hi - lo < self.step:
            return None
        run.dropped = hi
        self._drops += 1
        self._dropped_bytes += hi - lo
        return lo, hi - lo

    def statistics(self) -> DropStats:
        return DropStats(self._drops, self._dropped_bytes, len(self._runs))
