"""File attributes as the core reports them (the FUSE adapter turns them into
``pyfuse3.EntryAttributes``)."""

from __future__ import annotations

import stat
from dataclasses import dataclass

from airfs.origin.base import Entry, Kind

_TYPE_BITS = {Kind.FILE: stat.S_IFREG, Kind.DIR: stat.S_IFDIR, Kind.SYMLINK: stat.S_IFLNK}

#: Preferred I/O size reported to tools (``cp`` and friends size their buffers from it).
BLKSIZE = 1 << 20


@dataclass(frozen=True, slots=True)
class Owner:
    """Who owns every file of a mount (origins have no owners the mount could trust)."""

    uid: int
    gid: int


@dataclass(frozen=True, slots=True)
class Attr:
    """``stat`` of one inode. ``mode`` includes the file-type bits."""

    ino: int
    mode: int
    size: int
    mtime_ns: int
    uid: int
    gid: int
    nlink: int = 1

    @property
    def blocks(self) -> int:
        return (self.size + 511) // 512


def attr_of(ino: int, kind: Kind, size: int, mtime_ns: int, mode: int, owner: Owner) -> Attr:
    """Build an :class:`Attr` from origin-style fields (``mode`` = permission bits)."""
    return Attr(
        ino=ino,
        mode=_TYPE_BITS[kind] | stat.S_IMODE(mode),
        size=size,
        mtime_ns=mtime_ns,
        uid=owner.uid,
        gid=owner.gid,
        nlink=2 if kind is Kind.DIR else 1,
    )


def attr_of_entry(ino: int, entry: Entry, owner: Owner) -> Attr:
    return attr_of(ino, entry.kind, entry.size, entry.mtime_ns, entry.mode, owner)
