"""File copying shared by the POSIX origin (commits) and the staging area (new versions):
in the kernel where the filesystems allow it, and never filling a hole."""

from __future__ import annotations

import errno
import os

__all__ = ["copy_sparse"]

#: bytes handed to one ``copy_file_range`` call
COPY_CHUNK = 64 << 20


def copy_sparse(src: int, dst: int, size: int | None = None) -> None:
    """Copy the first ``size`` bytes (default: all) of file ``src`` into empty file ``dst``,
    skipping holes (``dst`` gets the same holes), in the kernel where possible. Blocking."""
    size = os.fstat(src).st_size if size is None else size
    pos = 0
    while pos < size:
        try:
            start = os.lseek(src, pos, os.SEEK_DATA)
        except OSError as exc:
            if exc.errno == errno.ENXIO:  # only a hole from here on
                break
            raise
        if start >= size:
            break
        end = min(size, os.lseek(src, start, os.SEEK_HOLE))
        off = start
        while off < end:
            try:
                n = os.copy_file_range(src, dst, min(COPY_CHUNK, end - off), off, off)
            except OSError as exc:
                # another filesystem (NFS origin, local cache) or no in-kernel copy: copy here
                if exc.errno not in (errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL):
                    raise
                data = os.pread(src, min(8 << 20, end - off), off)
                n = os.pwrite(dst, data, off) if data else 0
            if n == 0:
                break
            off += n
        pos = end
    os.ftruncate(dst, size)
