"""Blocking file work of the staging area, run in worker threads (or, for
:func:`read_cached`, on the loop because it never waits for the disk), and the pool of spare
staging files made ahead of the creates (:class:`Spares`)."""

from __future__ import annotations

import contextlib
import errno
import os
import uuid

import trio

__all__ = ["SPARES", "Spares", "open_spares", "pwrite_all", "read_cached"]

#: empty staging files made at a time, ahead of the creates that use them
SPARES = 16


def open_spares(directory: str, n: int) -> list[tuple[str, str, int]]:
    """Create ``n`` empty staging files (0600) in ``directory``: (id, file, fd). Blocking."""
    out = []
    for _ in range(n):
        sid = uuid.uuid4().hex
        file = os.path.join(directory, sid)
        fd = os.open(file, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        out.append((sid, file, fd))
    return out


class Spares:
    """Empty staging files made :data:`SPARES` at a time in one worker-thread job, so that a
    create needs no thread of its own. Trio loop only."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self._files: list[tuple[str, str, int]] = []

    async def take(self) -> tuple[str, str, int]:
        """A spare file: (id, file, fd), made with the next :data:`SPARES` if none is left."""
        if not self._files:
            self._files = await trio.to_thread.run_sync(open_spares, self.directory, SPARES)
        return self._files.pop()

    def ids(self) -> set[str]:
        """The ids (file names) of the spare files."""
        return {sid for sid, _file, _fd in self._files}

    def close(self) -> None:
        """Delete the spare files (at close; recovery deletes those of a crash)."""
        files, self._files = self._files, []
        for _sid, file, fd in files:
            with contextlib.suppress(OSError):
                os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(file)


def pwrite_all(fd: int, data: bytes | memoryview, offset: int) -> int:
    """Write all of ``data`` at ``offset``. Blocking."""
    view = memoryview(data)
    done = 0
    while done < len(view):
        done += os.pwrite(fd, view[done:], offset + done)
    return done


def read_cached(fd: int, offset: int, size: int) -> bytes | None:
    """``size`` bytes at ``offset`` (fewer at the end of the file) if they are all in the
    page cache, else None (the caller reads in a worker thread). Never waits for the disk
    (``RWF_NOWAIT``)."""
    buf = bytearray(size)
    view = memoryview(buf)
    got = 0
    try:
        while got < size:
            n = os.preadv(fd, [view[got:]], offset + got, os.RWF_NOWAIT)
            if n == 0:  # end of file
                return bytes(view[:got])
            got += n
    except BlockingIOError:
        return None
    except OSError as exc:
        if exc.errno in (errno.EOPNOTSUPP, errno.EINVAL):
            return None
        raise
    return bytes(buf)
