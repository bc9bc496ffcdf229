"""The read side of the POSIX origin that holds state: versions kept readable while a reader
has them open (pins), and the ranged reads that use them."""

from __future__ import annotations

import contextlib
import os
import stat
import threading
from collections.abc import Callable, Iterator
from typing import TypeVar

from .base import Conflict, IsADir, from_oserror
from .beneath import open_beneath
from .posix_entry import version_of

T = TypeVar("T")


@contextlib.contextmanager
def open_file(dir_fd: int, path: str, version: str | None) -> Iterator[int]:
    """An fd of the regular file ``path`` under ``dir_fd`` (no link followed), checked to be
    ``version`` when given (:class:`Conflict` else; :class:`IsADir` for a directory)."""
    try:
        fd = open_beneath(dir_fd, path or ".", os.O_RDONLY)
    except OSError as exc:
        raise from_oserror(exc, path) from None
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise IsADir(f"{path}: is a directory")
        if version is not None and version_of(st) != version:
            raise Conflict(f"{path}: changed at the origin (version {version} is gone)")
        yield fd
    finally:
        os.close(fd)


class Pins:
    """Files kept open while a reader has them open, so that a reader keeps its version even
    when the path is replaced or removed meanwhile (POSIX keeps an open file's data).
    ``(path, version) -> [fd, refs]``; thread-safe (origin calls run in worker threads)."""

    def __init__(self, dir_fd: int) -> None:
        self.dir_fd = dir_fd
        self._pins: dict[tuple[str, str], list[int]] = {}
        self._lock = threading.Lock()

    def pin(self, path: str, version: str) -> None:
        """Keep ``version`` of ``path`` readable by :meth:`read_range` until :meth:`unpin`.
        Raises :class:`Conflict` if ``path`` is no longer that version."""
        key = (path, version)
        with self._lock:
            ent = self._pins.get(key)
            if ent is not None:
                ent[1] += 1
                return
        with open_file(self.dir_fd, path, version) as fd:
            dup = os.dup(fd)
        with self._lock:
            ent = self._pins.get(key)
            if ent is not None:
                ent[1] += 1
                os.close(dup)
            else:
                self._pins[key] = [dup, 1]

    def unpin(self, path: str, version: str) -> None:
        """One :meth:`pin` of ``(path, version)`` is over (the file is closed at the last)."""
        key = (path, version)
        with self._lock:
            ent = self._pins.get(key)
            if ent is None:
                return
            ent[1] -= 1
            if ent[1] == 0:
                del self._pins[key]
                os.close(ent[0])

    def read_range(self, path: str, offset: int, size: int, version: str | None) -> bytes:
        """``size`` bytes at ``offset`` of ``version`` of ``path``: from its pinned file when
        it is pinned, else from the path (checked to be ``version``)."""
        return self._read(path, version, lambda fd: os.pread(fd, size, offset))

    def read_range_into(self, path: str, offset: int, buf: memoryview, version: str | None) -> int:
        """:meth:`read_range` of ``len(buf)`` bytes into ``buf``; how many were read."""
        return self._read(path, version, lambda fd: pread_into(fd, buf, offset))

    def _read(self, path: str, version: str | None, read: Callable[[int], T]) -> T:
        """``read(fd)`` of ``version`` of ``path`` (its pinned file when it is pinned)."""
        if version is not None:
            with self._lock:
                ent = self._pins.get((path, version))
                if ent is not None:
                    ent[1] += 1
            if ent is not None:
                try:
                    return read(ent[0])
                except OSError as exc:
                    raise from_oserror(exc, path) from None
                finally:
                    self.unpin(path, version)
        with open_file(self.dir_fd, path, version) as fd:
            try:
                return read(fd)
            except OSError as exc:
                raise from_oserror(exc, path) from None

    def close(self) -> None:
        """Close every pinned file."""
        with self._lock:
            for fd, _refs in self._pins.values():
                os.close(fd)
            self._pins.clear()


def pread_into(fd: int, buf: memoryview, offset: int) -> int:
    """Read ``len(buf)`` bytes at ``offset`` of ``fd`` into ``buf`` (fewer only at the end of
    the file); how many."""
    pos, size = 0, len(buf)
    while pos < size:
        n = os.preadv(fd, [buf[pos:]], offset + pos)
        if n == 0:
            break
        pos += n
    return pos
