"""File attributes as the core reports them (the FUSE adapters pack them for the kernel)."""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass

from airfs.origin.base import Entry, Kind

_TYPE_BITS = {
    Kind.FILE: stat.S_IFREG,
    Kind.DIR: stat.S_IFDIR,
    Kind.SYMLINK: stat.S_IFLNK,
    Kind.FIFO: stat.S_IFIFO,
    Kind.SOCKET: stat.S_IFSOCK,
    Kind.CHAR: stat.S_IFCHR,
    Kind.BLOCK: stat.S_IFBLK,
}
_KIND_OF_TYPE = {bits: kind for kind, bits in _TYPE_BITS.items()}

#: Preferred I/O size (``st_blksize``) of staged files and directories: tools size their
#: buffers from it (``cp``, Python's ``open``), and writes arrive in requests this large.
BLKSIZE = 1 << 20
#: ``st_blksize`` of a file whose bytes come from the origin: Python's ``open`` reads a whole
#: buffer of this size after every ``seek``, so a random 4 KiB read costs at most this plus a
#: page, which touches one or two cache blocks (with 1 MiB, each such read pulled 1-2 MiB
#: from the origin). Sequential readers are served by the kernel's readahead either way.
ORIGIN_BLKSIZE = 64 << 10

#: permission bits with setuid, setgid and sticky (what ``chmod`` sets)
MODE_BITS = 0o7777


def allocated_blocks(fd: int) -> int | None:
    """The 512-byte blocks the open file ``fd`` has allocated (``st_blocks``); None if it
    cannot be asked (closed meanwhile)."""
    try:
        return os.fstat(fd).st_blocks
    except OSError:
        return None


def kind_of_mode(mode: int) -> Kind | None:
    """The :class:`Kind` of a full ``st_mode`` (None for an unknown file type)."""
    return _KIND_OF_TYPE.get(stat.S_IFMT(mode))


@dataclass(frozen=True, slots=True)
class Owner:
    """A uid/gid pair: the mount's default owner (of objects the origin keeps no owner for)."""

    uid: int
    gid: int


@dataclass(frozen=True, slots=True)
class Attr:
    """``stat`` of one inode. ``mode`` includes the file-type bits. ``atime_ns`` and
    ``ctime_ns`` default to ``mtime_ns`` where nothing else is known. ``ino`` is both the
    node id the kernel knows the inode by and its ``st_ino`` (the names of a hard-linked file
    share one node: :class:`~airfs.core.inodes.InodeTable`). ``blksize`` is ``st_blksize``
    (:data:`BLKSIZE`, or :data:`ORIGIN_BLKSIZE` for a file read from the origin). ``blocks``
    is the 512-byte blocks the file takes (``st_blocks``): what the staging file or the
    origin has allocated where that is known, so a sparse file's holes cost nothing; where
    nothing is known (-1, e.g. an S3 object) it is the size rounded up to 512 bytes."""

    ino: int
    mode: int
    size: int
    mtime_ns: int
    uid: int
    gid: int
    nlink: int = 1
    atime_ns: int = -1
    ctime_ns: int = -1
    rdev: int = 0
    blocks: int = -1
    blksize: int = BLKSIZE

    def __post_init__(self) -> None:
        if self.blocks < 0:
            object.__setattr__(self, "blocks", (self.size + 511) // 512)
        if self.atime_ns < 0:
            object.__setattr__(self, "atime_ns", self.mtime_ns)
        if self.ctime_ns < 0:
            object.__setattr__(self, "ctime_ns", self.mtime_ns)


def attr_of(
    ino: int,
    kind: Kind,
    size: int,
    mtime_ns: int,
    mode: int,
    owner: Owner,
    *,
    nlink: int | None = None,
    atime_ns: int | None = None,
    ctime_ns: int | None = None,
    rdev: int = 0,
    blocks: int | None = None,
    blksize: int = BLKSIZE,
) -> Attr:
    """Build an :class:`Attr` from origin-style fields (``mode`` = permission bits;
    ``blocks``: allocated 512-byte blocks, None where unknown)."""
    return Attr(
        ino=ino,
        mode=_TYPE_BITS[kind] | (mode & MODE_BITS),
        size=size,
        mtime_ns=mtime_ns,
        uid=owner.uid,
        gid=owner.gid,
        nlink=nlink if nlink is not None else (2 if kind is Kind.DIR else 1),
        atime_ns=atime_ns if atime_ns is not None else -1,
        ctime_ns=ctime_ns if ctime_ns is not None else -1,
        rdev=rdev,
        blocks=-1 if blocks is None else blocks,
        blksize=blksize,
    )


def attr_of_entry(ino: int, entry: Entry, owner: Owner) -> Attr:
    """The attributes of an origin entry; ``owner`` applies where the origin keeps none."""
    if entry.uid is not None or entry.gid is not None:
        owner = Owner(
            entry.uid if entry.uid is not None else owner.uid,
            entry.gid if entry.gid is not None else owner.gid,
        )
    nlink = entry.nlink if entry.kind is not Kind.DIR or entry.nlink >= 2 else 2
    return attr_of(
        ino,
        entry.kind,
        entry.size,
        entry.mtime_ns,
        entry.mode,
        owner,
        nlink=nlink,
        atime_ns=entry.atime_ns,
        ctime_ns=entry.ctime_ns,
        rdev=entry.rdev,
        blocks=entry.blocks,
        blksize=ORIGIN_BLKSIZE if entry.kind is Kind.FILE else BLKSIZE,
    )
