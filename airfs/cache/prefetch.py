"""Sequential-stream detection, the prefetch window, and the global in-flight byte budget.

One :class:`Stream` belongs to one reader (one open file handle), so two processes reading the
same file each keep their own stream. The stream only *decides*; the block cache
(:mod:`airfs.cache.blockcache`, :mod:`airfs.cache.fetch`) turns its decisions into part
fetches and owns the data.

How the window behaves
----------------------

* **Detection.** A stream starts out *random*. It turns *sequential* when the first read of the
  handle is at offset 0 (the common "read the file from the start" case), or when contiguous
  reads (each starting exactly where the previous one ended) have covered ``min_run`` bytes.
  One read of a program arrives as several contiguous requests (the kernel cuts a 1 MiB
  ``read`` at a random offset into 128 KiB READs, or adds its own readahead window of
  ``read_ahead_kb`` to it: up to 3 MiB in a row), so two contiguous requests prove nothing; a
  run longer than the kernel makes of one read does (4 MiB by default). Random reads never
  prefetch: they fetch only the blocks they touch.
* **Growth.** A sequential stream keeps ``window`` bytes requested ahead of its read position
  (``ahead`` is the end of what it has requested). When less than half a window is left ahead
  of the reader, it requests more up to ``position + window``. The window doubles, up to
  ``max_window``, each time the reader has read half a window since it last grew (or since
  the first request). With the defaults the first prefetch is 1 MiB (on top of the block the
  first read itself needs), then 2, 4, ... 128 MiB.
* **Cells.** With ``align`` (the cache passes its part size), once the window is at least
  ``align`` the stream works in whole cells of an ``align`` grid: the horizon is rounded up
  to a multiple of ``align``, and it is topped up as soon as one whole cell of the window is
  free (not at half a window), so the window stays full while the reader moves instead of
  being fetched in waves that all finish at once; the cache cuts parts on the same grid
  (:func:`split_runs`). Every full part is then one aligned range of the object, which an
  object store serves cheaper (SeaweedFS keeps 4 MiB chunks: a misaligned 8 MiB GET costs
  its server a quarter more CPU and 20% more bytes between its own processes; AWS advises
  ranged GETs aligned to the parts of a multipart object).
* **Jumps.** While sequential, a read that lands within ``seek_tolerance`` behind the furthest
  position read, or anywhere up to ``seek_tolerance`` past what has already been requested,
  keeps the stream (concurrent kernel read-ahead requests arrive slightly out of order; readers
  skip small gaps). Anything further *resets* it: the window goes back to ``initial_window``,
  ``epoch`` is bumped (parts requested for the old position that have not started yet are
  abandoned by the cache), and the stream is random again until reads are contiguous.
* **Backpressure.** A stream never requests more than ``window`` bytes (plus less than
  ``align`` for the rounding) past its reader, so a
  reader that stops reading stops its prefetch. Across all readers, every part acquires its
  bytes from one :class:`ByteBudget` before it is fetched and releases them once the data is in
  the cache file; prefetch parts wait while the budget is spent, so memory held by fetches in
  flight stays under the budget (a demand fetch — one a read is waiting on — never waits: it is
  counted but admitted at once, and a waiting prefetch part that a read now needs is promoted).
  A part keeps its bytes until they are written, also after its reads were answered from them,
  so beyond the budget a reader holds at most the part its read waits for and the one before.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import trio

__all__ = ["ByteBudget", "Stream", "split_runs"]


class Stream:
    """Sequential-read detector and prefetch window of one reader. Pure logic, no I/O."""

    __slots__ = (
        "ahead",
        "align",
        "epoch",
        "grown_at",
        "initial_window",
        "last_end",
        "last_offset",
        "max_window",
        "max_window_seen",
        "min_run",
        "next_offset",
        "requests",
        "resets",
        "run_start",
        "seek_tolerance",
        "sequential",
        "window",
    )

    def __init__(
        self,
        *,
        initial_window: int = 1 << 20,
        max_window: int = 128 << 20,
        seek_tolerance: int = 4 << 20,
        min_run: int = 4 << 20,
        align: int = 0,
    ) -> None:
        if initial_window <= 0 or max_window < initial_window:
            raise ValueError("need 0 < initial_window <= max_window")
        if min_run < 0:
            raise ValueError("need min_run >= 0")
        if align < 0:
            raise ValueError("need align >= 0")
        #: Grid of the horizon once the window is at least this (0: none).
        self.align = align
        self.initial_window = initial_window
        self.min_run = min_run
        self.max_window = max_window
        self.seek_tolerance = seek_tolerance
        #: Size of the next prefetch request (doubles per request while sequential).
        self.window = initial_window
        #: Furthest end offset read so far in this stream (``None`` before the first read).
        self.next_offset: int | None = None
        #: End of what has been requested from the cache (prefetch horizon).
        self.ahead = 0
        self.sequential = False
        #: Bumped on every reset; parts requested under an older epoch may be abandoned.
        self.epoch = 0
        self.resets = 0
        self.requests = 0
        #: Where the reader was when the window last grew (or its first request).
        self.grown_at = 0
        self.max_window_seen = 0
        self.last_offset = 0
        self.last_end = 0
        #: Where the current run of contiguous reads started (while random).
        self.run_start = 0

    def on_read(self, offset: int, size: int, limit: int) -> tuple[int, int] | None:
        """Account for a read of ``size`` bytes at ``offset`` of an object of ``limit`` bytes.

        Returns the byte range ``[start, end)`` to prefetch now, or ``None``.
        """
        end = offset + size
        self.last_offset, self.last_end = offset, end
        nxt = self.next_offset
        if self.sequential:
            assert nxt is not None
            keep = nxt - self.seek_tolerance <= offset <= max(nxt, self.ahead) + self.seek_tolerance
        else:
            keep = offset == 0 if nxt is None else offset == nxt
        if not keep:
            if self.sequential:
                self.resets += 1
                self.epoch += 1
            self.sequential = False
            self.window = self.initial_window
            self.next_offset = end
            self.ahead = end
            self.requests = 0
            self.run_start = offset
            return None
        if not self.sequential and nxt is not None and end - self.run_start < self.min_run:
            self.next_offset = end  # contiguous, but not longer than one read could be
            self.ahead = max(self.ahead, end)
            return None
        if not self.sequential:
            self.sequential = True
            self.window = self.initial_window
            self.requests = 0
            self.ahead = max(self.ahead, end)
        pos = end if nxt is None else max(nxt, end)
        self.next_offset = pos
        if self.ahead >= limit:
            return None
        if self.requests and pos - self.grown_at >= self.window // 2:
            self.window = min(self.max_window, self.window * 2)
            self.grown_at = pos
        cell = self.align if self.align and self.window >= self.align else 0
        if cell:
            if self.ahead - pos > self.window - cell:
                return None  # not a whole cell of the window free yet
        elif self.ahead - pos >= self.window // 2:
            return None
        start = max(self.ahead, pos)
        horizon = pos + self.window
        if cell:
            horizon = -(-horizon // cell) * cell
        new_ahead = min(limit, horizon)
        if new_ahead <= start:
            return None
        if not self.requests:
            self.grown_at = pos
        self.ahead = new_ahead
        self.requests += 1
        self.max_window_seen = max(self.max_window_seen, self.window)
        return start, new_ahead

    def active_range(self) -> tuple[int, int]:
        """Bytes this reader is using: from a little behind its position (the backward seek
        tolerance) to its prefetch horizon; just the last read when random. The cache does not
        evict blocks in this range."""
        if not self.sequential or self.next_offset is None:
            return self.last_offset, self.last_end
        lo = min(self.last_offset, max(0, self.next_offset - self.seek_tolerance))
        return lo, max(self.ahead, self.next_offset)


class ByteBudget:
    """A byte-counting semaphore bounding the bytes of all fetches in flight.

    :meth:`acquire` waits while admitting ``n`` would exceed ``limit`` (a request larger than
    the whole budget is admitted when nothing else is in flight). :meth:`take` admits at once
    (demand fetches). Trio-only; not thread-safe.
    """

    def __init__(self, limit: int) -> None:
        if limit <= 0:
            raise ValueError("budget must be positive")
        self.limit = limit
        self.used = 0
        self.peak = 0
        self.waits = 0
        self._wakeup = trio.Event()

    def take(self, n: int) -> None:
        self.used += n
        self.peak = max(self.peak, self.used)

    def release(self, n: int) -> None:
        self.used -= n
        self.poke()

    def poke(self) -> None:
        """Wake waiters so they re-check (after a release, a promotion or an abandonment)."""
        ev, self._wakeup = self._wakeup, trio.Event()
        ev.set()

    async def acquire(
        self,
        n: int,
        *,
        give_up: Callable[[], bool] = lambda: False,
        urgent: Callable[[], bool] = lambda: False,
    ) -> bool:
        """Wait until ``n`` bytes fit (or ``urgent()``), then take them and return True; return
        False without taking anything as soon as ``give_up()`` is true."""
        waited = False
        while True:
            if give_up():
                return False
            if urgent() or self.used == 0 or self.used + n <= self.limit:
                self.take(n)
                return True
            if not waited:
                self.waits += 1
                waited = True
            await self._wakeup.wait()


def split_runs(
    b0: int, b1: int, per_part: int, skip: Callable[[int], bool]
) -> Iterator[tuple[int, int]]:
    """Maximal runs of blocks in ``[b0, b1)`` for which ``skip(b)`` is false, cut at every
    multiple of ``per_part`` (so at most ``per_part`` blocks each, and a run that starts on
    that grid and is not cut short covers one whole cell of it)."""
    b = b0
    while b < b1:
        if skip(b):
            b += 1
            continue
        e = b + 1
        while e < b1 and e % per_part and not skip(e):
            e += 1
        yield b, e
        b = e
