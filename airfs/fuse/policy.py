"""What both transports (the kernel one and the pyfuse3 adapter) answer alike: how long the
kernel may keep an entry or attributes, which errno a failed request gets and how loudly it
is logged, and what statfs reports. One place, so that the two adapters stay thin and cannot
drift apart."""

from __future__ import annotations

import errno
import logging
import stat
from dataclasses import dataclass

from airfs.core.attrs import Attr
from airfs.core.fs import Filesystem
from airfs.origin.base import FsStats

__all__ = [
    "NAME_MAX",
    "Statvfs",
    "attr_timeout",
    "entry_timeout",
    "error_level",
    "failure_errno",
    "statvfs",
]

#: the longest name, as statfs reports it
NAME_MAX = 255


def attr_timeout(a: Attr, ttl: float) -> float:
    """How long the kernel may keep ``a``: the TTL, but 0 for a file with several names (a
    change through another name, an unlink, moves its link count)."""
    return 0.0 if a.nlink > 1 and not stat.S_ISDIR(a.mode) else ttl


def entry_timeout(fs: Filesystem, a: Attr, ttl: float) -> float:
    """How long the kernel may keep the name that led to ``a``: the TTL, but 0 at a governed
    level (the root, catalogs, schemas, volume roots: the name there is the caller's own
    answer, never kept for another caller: :meth:`Filesystem.per_caller`)."""
    return 0.0 if fs.per_caller(a.ino) else ttl


def error_level(code: int) -> int:
    """The log level of a request that failed with ``code``: EIO and ENOSPC are the
    daemon's own failures (errors); every other errno is the answer to a request (debug)."""
    return logging.ERROR if code in (errno.EIO, errno.ENOSPC) else logging.DEBUG


def failure_errno(log: logging.Logger, op: str, exc: Exception) -> int:
    """The errno to answer the request ``op`` that raised ``exc``, logged on ``log``: an
    ``OSError``'s own errno (EIO if it has none) at :func:`error_level`; anything else is a
    bug, logged with its traceback and answered EIO."""
    if isinstance(exc, OSError) and isinstance(exc.errno, int | None):
        code = exc.errno or errno.EIO
        log.log(error_level(code), "%s: %s", op, exc)
        return code
    # not an OSError, or one built wrong (its errno not a number): a bug, never a dead
    # daemon (a reply it cannot encode would end the session)
    log.error("%s failed", op, exc_info=exc)
    return errno.EIO


@dataclass(frozen=True, slots=True)
class Statvfs:
    """What ``statfs`` answers, in ``statvfs(3)``'s terms: blocks of ``frsize`` bytes (also
    the preferred I/O size), the free counts also available to unprivileged callers (the
    core keeps no reserve), names up to :data:`NAME_MAX` bytes."""

    bsize: int
    frsize: int
    blocks: int
    bfree: int
    bavail: int
    files: int
    ffree: int
    favail: int
    namemax: int


def statvfs(s: FsStats) -> Statvfs:
    """The reply of ``statfs`` from the core's :class:`FsStats`."""
    return Statvfs(
        bsize=s.block_size,
        frsize=s.block_size,
        blocks=s.total_blocks,
        bfree=s.free_blocks,
        bavail=s.free_blocks,
        files=s.total_files,
        ffree=s.free_files,
        favail=s.free_files,
        namemax=NAME_MAX,
    )
