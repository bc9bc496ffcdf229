"""The cache's data files as the trio side sees them: descriptors, creation, and the file worker.

:class:`CacheFiles` owns ``<cache_dir>/data`` (layout: :mod:`airfs.cache.store`). Opening an
existing cache file is done inline (a few microseconds); creating one (0.1-0.3 ms on ext4),
deleting evicted files and punching evicted blocks run in worker threads. Deletions and punches
are queued (:meth:`CacheFiles.queue_unlink`, :meth:`CacheFiles.queue_punch`) and done in order
by one background task (:meth:`CacheFiles.run`); :meth:`CacheFiles.drain` does what is still
queued at shutdown. Three callbacks, given at construction, tell the owner of the object table
what happened: ``on_vanished(obj)`` (a cache file is gone: nothing of it is cached),
``on_punched(obj)`` (a punch finished: the object may be released) and ``on_freed()`` (files
were deleted: disk space changed).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable
from typing import Literal

import trio

from .store import CachedObject, create_file, punch

__all__ = ["CacheFiles"]

log = logging.getLogger(__name__)

#: A queued file operation: ("unlink", path) or ("punch", obj, [(offset, length), ...]).
_Unlink = tuple[Literal["unlink"], str]
_Punch = tuple[Literal["punch"], CachedObject, list[tuple[int, int]]]
FileOp = _Unlink | _Punch


class CacheFiles:
    """Descriptors and background file operations for the objects of one cache."""

    def __init__(
        self,
        data_dir: str,
        io_limiter: trio.CapacityLimiter,
        *,
        on_vanished: Callable[[CachedObject], None],
        on_punched: Callable[[CachedObject], None],
        on_freed: Callable[[], None],
    ) -> None:
        self.data_dir = data_dir
        self.io_limiter = io_limiter
        self._on_vanished = on_vanished
        self._on_punched = on_punched
        self._on_freed = on_freed
        self._send, self._recv = trio.open_memory_channel[FileOp](float("inf"))

    def make_dirs(self) -> None:
        """Create the 256 fan-out directories (blocking: call from a worker thread)."""
        for i in range(256):
            os.makedirs(os.path.join(self.data_dir, f"{i:02x}"), exist_ok=True)

    def path(self, obj: CachedObject) -> str:
        return os.path.join(self.data_dir, obj.file_name())

    def fd(self, obj: CachedObject) -> int:
        """The object's open cache file, or -1 when it has none (opened inline if it exists).
        A file that vanished is reported through ``on_vanished``."""
        if obj.fd >= 0 or not obj.file_created:
            return obj.fd
        try:
            obj.fd = os.open(self.path(obj), os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            log.warning("cache file of %s vanished; refetching", obj.path)
            self._on_vanished(obj)
            obj.file_created = False
        return obj.fd

    async def fd_for_write(self, obj: CachedObject) -> int:
        """The object's cache file, created in a worker thread if needed. Concurrent callers
        share one creation. Raises the :class:`OSError` of a failed creation."""
        while obj.fd < 0:
            if obj.creating is not None:
                await obj.creating.wait()
                continue
            if self.fd(obj) >= 0:
                break
            ev = obj.creating = trio.Event()
            obj.io += 1
            try:
                obj.fd = await trio.to_thread.run_sync(
                    create_file, self.path(obj), obj.size, limiter=self.io_limiter
                )
                obj.file_created = True
            finally:
                obj.io -= 1
                obj.creating = None
                ev.set()
        return obj.fd

    def close(self, obj: CachedObject) -> None:
        """Close the object's descriptor, if open (the caller checked nobody uses it)."""
        if obj.fd >= 0:
            os.close(obj.fd)
            obj.fd = -1

    def queue_unlink(self, obj: CachedObject) -> None:
        """Delete the object's file (if it made one) in the background; closes its fd now."""
        self.close(obj)
        if obj.file_created:
            self._send.send_nowait(("unlink", self.path(obj)))

    def queue_punch(self, obj: CachedObject, ranges: list[tuple[int, int]]) -> None:
        """Punch ``ranges`` out of the object's file in the background. Until done, the
        object counts one more ``io`` and ``obj.punch_done`` is an event that fetches about to
        write wait for (see :func:`punches_done`)."""
        obj.io += 1
        obj.punches += 1
        if obj.punch_done is None:
            obj.punch_done = trio.Event()
        self._send.send_nowait(("punch", obj, ranges))

    async def run(self) -> None:
        """The file worker: does queued operations in order (deletions batched), forever."""
        async for op in self._recv:
            ops = [op]
            with contextlib.suppress(trio.WouldBlock):
                while len(ops) < 256:
                    ops.append(self._recv.receive_nowait())
            await self._do(ops)

    async def drain(self) -> None:
        """Do every operation still queued (at shutdown, shielded by the caller)."""
        ops: list[FileOp] = []
        while True:
            try:
                ops.append(self._recv.receive_nowait())
            except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
                break
        await self._do(ops)

    async def _do(self, ops: list[FileOp]) -> None:
        unlinks = [op[1] for op in ops if op[0] == "unlink"]
        if unlinks:
            await self.unlink_all(unlinks)
        for op in ops:
            if op[0] == "punch":
                await self._punch(op[1], op[2])

    async def unlink_all(self, paths: list[str]) -> None:
        """Delete ``paths`` (missing ones are fine) in a worker thread."""
        try:
            await trio.to_thread.run_sync(_unlink_all, paths, limiter=self.io_limiter)
        except OSError as exc:
            log.warning("cache: cannot delete evicted files: %s", exc)
        self._on_freed()

    async def _punch(self, obj: CachedObject, ranges: list[tuple[int, int]]) -> None:
        try:
            ok = await trio.to_thread.run_sync(punch, obj.fd, ranges, limiter=self.io_limiter)
            if not ok:
                log.warning("cache: file system cannot punch holes; space is freed late")
        except OSError as exc:
            log.warning("cache: punching %s failed: %s", obj.path, exc)
        finally:
            obj.io -= 1
            obj.punches -= 1
            if obj.punches == 0 and obj.punch_done is not None:
                obj.punch_done.set()
                obj.punch_done = None
            self._on_punched(obj)

    async def list_files(self) -> list[str]:
        """Every cache file under the data directory (in a worker thread)."""
        return await trio.to_thread.run_sync(_list_files, self.data_dir, limiter=self.io_limiter)


async def punches_done(obj: CachedObject) -> None:
    """Wait until hole punches queued for ``obj`` are done, so that one cannot land after (and
    zero) data about to be written into a block that was evicted and is refetched."""
    while obj.punch_done is not None:
        await obj.punch_done.wait()


def _unlink_all(paths: list[str]) -> None:
    for p in paths:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(p)


def _list_files(data_dir: str) -> list[str]:
    out: list[str] = []
    for sub in os.scandir(data_dir):
        if sub.is_dir(follow_symlinks=False):
            out.extend(e.path for e in os.scandir(sub.path) if e.is_file(follow_symlinks=False))
    return out
