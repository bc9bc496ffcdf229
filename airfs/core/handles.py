"""Open handles of the core (files and directories), the callback a directory listing emits
entries through, and :func:`err`, how every core operation makes the ``OSError`` it fails
with (the errno the transports answer). A module of its own so that the core's parts
(:mod:`.base`, :mod:`.passthrough`, :mod:`.files`, :mod:`.names`) share them without an
import circle."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from airfs.origin.base import Entry, Kind
from airfs.writeback.opens import Opened
from airfs.writeback.versions import Staged

from .attrs import Attr
from .inodes import Node
from .readpath import LocalFile, Reader

__all__ = ["DirEntry", "DirHandle", "Emit", "Handle", "err"]


def err(code: int, msg: str) -> OSError:
    """The error a core operation fails with: ``errno`` ``code``, ``msg`` for the log."""
    return OSError(code, msg)


@dataclass(eq=False)
class Handle:
    """An open file. Writers always have ``opened`` (their hold on the staged file; the
    version it uses is :meth:`~airfs.writeback.opens.Opens.version`'s to say); readers have
    it when the file was staged at open, else an origin ``reader``."""

    fh: int
    node: Node
    writable: bool
    opened: Opened | None
    reader: Reader | None = None
    #: origin version served by ``reader``
    version: str | None = None
    #: origin path pinned at open (the origin keeps that version readable until release)
    pinned: str | None = None
    #: the complete cache file of ``version`` held since the open (no origin pin is needed:
    #: every byte is local and the cache keeps it while held); passthrough takes it over
    local: LocalFile | None = None


@dataclass(frozen=True, slots=True)
class DirEntry:
    """One name of a directory snapshot: its kind, the origin's entry (None: only staged),
    and the staged file that was at that name when the snapshot was taken (None: none)."""

    name: str
    kind: Kind
    entry: Entry | None
    staged: Staged | None


@dataclass(eq=False)
class DirHandle:
    """An open directory: the snapshot of its names taken at ``opendir`` (sorted by name),
    and when the origin was listed for it."""

    fh: int
    node: Node
    entries: list[DirEntry]
    listed_at: float
    #: the listing was filtered for its caller (governed volumes): the kernel must not keep
    #: it for other callers
    per_caller: bool = False


#: ``emit(name, attr, next_index, known)`` -> False when the reply is full. ``known`` False:
#: only the name, the kind (in ``attr.mode``) and the inode number are right (a name of a
#: bare listing): the adapter answers the name without attributes and the kernel takes no
#: lookup reference for it
Emit = Callable[[str, Attr, int, bool], bool]
