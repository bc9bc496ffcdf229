"""The bytes of staged versions and the space they take: reads, writes and truncates (long
ones in worker threads, counted *in flight* so that a version is never journaled while a
change of its bytes runs), and the space reservation writers wait on.

:class:`StagedBytes` is a collaborator of :class:`~airfs.writeback.staging.StagingArea`
(``area.io``); what it needs of the area is the :class:`SpaceOwner` protocol.
"""

from __future__ import annotations

import builtins
import errno
import os
from collections.abc import Callable
from typing import Protocol

import trio

from .space import DiskFloor
from .stagefiles import pwrite_all, read_cached
from .versions import Staged

__all__ = ["WRITE_HOP_MIN", "SpaceOwner", "StagedBytes", "allocated"]

#: writes at least this long are made in a worker thread (a shorter one costs less than the
#: round trip to the thread on this machine: 2 us against 150-600 us for 4 KiB; 33 us for
#: 128 KiB; docs/benchmarks.md, "The write path off the event loop")
WRITE_HOP_MIN = 64 << 10


def allocated(st: Staged) -> int:
    """The bytes ``st``'s file takes on disk (its size, holes aside). One ``fstat``."""
    try:
        return min(st.size, os.fstat(st.fd).st_blocks * 512)
    except OSError:
        return st.size


class SpaceOwner(Protocol):
    """What :class:`StagedBytes` needs of the staging area."""

    dir: str
    limit: int
    #: the free-disk floor of the staging filesystem (:mod:`airfs.writeback.space`)
    floor: DiskFloor
    #: bytes the staged versions take (allocated, so a sparse file costs what it stores)
    bytes: int

    def notify(self) -> None:
        """Wake every task waiting for a change."""
        ...

    def change_event(self) -> trio.Event:
        """An event set at the next change."""
        ...

    def release(self, st: Staged) -> bool:
        """Drop ``st`` if it is clean, closed and unreferenced."""
        ...

    def close_version(self, st: Staged, *, other_writers: int = 0, barrier: bool = False) -> None:
        """Journal ``st`` if it is closed now (:func:`~airfs.writeback.versions.close_due`)."""
        ...


class StagedBytes:
    """Byte I/O and space of staged versions, for the staging area ``area`` (trio loop
    only)."""

    def __init__(self, area: SpaceOwner) -> None:
        self.area = area

    async def read(self, st: Staged, offset: int, size: int) -> builtins.bytes:
        """Read staged bytes: on the loop when they are all in the page cache
        (``RWF_NOWAIT``), else in a worker thread. Short at the end of the file."""
        data = read_cached(st.fd, offset, size)
        if data is not None:
            return data
        st.refs += 1  # its descriptor stays open meanwhile
        try:
            return await trio.to_thread.run_sync(os.pread, st.fd, size, offset)
        finally:
            st.refs -= 1
            self.area.release(st)

    async def write(self, st: Staged, offset: int, data: builtins.bytes | memoryview) -> int:
        """Write ``data`` at ``offset`` of ``st`` (in a worker thread from
        :data:`WRITE_HOP_MIN` bytes). While it is in flight ``st`` is changed (its
        generation moved) but never journaled (a close waits for it: ``close_wanted``)."""
        if st.closed_version and st.path is not None:
            raise AssertionError(f"staged {st.id}: a closed version is never written")
        if len(data) < WRITE_HOP_MIN:
            n = os.pwrite(st.fd, data, offset)
        else:
            st.touch()
            n = await self._in_flight(st, pwrite_all, st.fd, data, offset)
        end = offset + n
        if end > st.size:
            self.area.bytes += end - st.size
            st.size = end
        st.touch()
        return n

    async def truncate(self, st: Staged, size: int) -> None:
        """Set ``st``'s size (in a worker thread: freeing blocks can take a while)."""
        if st.closed_version and st.path is not None:
            raise AssertionError(f"staged {st.id}: a closed version is never truncated")
        st.touch()
        before = allocated(st)
        await self._in_flight(st, os.ftruncate, st.fd, size)
        st.size = size
        self.area.bytes += allocated(st) - before
        st.touch()

    async def _in_flight(self, st: Staged, fn: Callable[..., int | None], *args: object) -> int:
        """Run a change of ``st``'s bytes in a worker thread; ``st`` is referenced (its
        descriptor stays open) and counted in flight meanwhile."""
        st.inflight += 1
        st.refs += 1
        try:
            return await trio.to_thread.run_sync(fn, *args) or 0
        finally:
            st.inflight -= 1
            st.refs -= 1
            if st.inflight == 0:
                if st.close_wanted:  # a close decided meanwhile, made now
                    st.close_wanted = False
                    self.area.close_version(st, barrier=True)
                self.area.notify()
            self.area.release(st)

    async def quiesce(self, st: Staged) -> None:
        """Wait until no change of ``st``'s bytes is in flight (before journaling it)."""
        while st.inflight:
            ev = self.area.change_event()
            if st.inflight:
                await ev.wait()

    async def reserve(self, st: Staged, end: int, wait_s: float) -> None:
        """Wait until growing ``st`` to ``end`` bytes fits the space limits (the staging
        limit, and the free-disk floor: :mod:`airfs.writeback.space`); ENOSPC, before
        anything is written, after ``wait_s`` seconds of waiting for commits to free space.
        No system call when it fits (the floor's measurement is cached)."""
        grow = end - st.size
        if grow <= 0 or self._fits(grow):
            return
        with trio.move_on_after(wait_s):
            while True:
                ev = self.area.change_event()
                if self._fits(grow):
                    return
                with trio.move_on_after(self.area.floor.interval):  # space freed by others too
                    await ev.wait()
        a = self.area
        if a.bytes + grow > a.limit:
            msg = f"staging area full ({a.bytes} bytes of {a.limit} waiting for commit)"
        else:
            msg = (
                f"cache filesystem of {a.dir} nearly full: {a.floor.free(a.bytes)} "
                f"bytes free, {grow} more would go under the staging floor of "
                f"{a.floor.min_free} (--staging-min-free); {a.bytes} staged bytes "
                "waiting for commit"
            )
        raise OSError(errno.ENOSPC, msg)

    def _fits(self, grow: int) -> bool:
        a = self.area
        return a.bytes + grow <= a.limit and a.floor.fits(grow, a.bytes)
