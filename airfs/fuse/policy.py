"""What both transports (the kernel one and the pyfuse3 adapter) answer alike: how long the
kernel may keep an entry or attributes, and how loudly a core error is logged. One place, so
that the two adapters stay thin and cannot drift apart."""

from __future__ import annotations

import errno
import logging
import stat

from airfs.core.attrs import Attr
from airfs.core.fs import Filesystem

__all__ = ["NAME_MAX", "attr_timeout", "entry_timeout", "error_level"]

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
