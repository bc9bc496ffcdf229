"""Rebuilding the core's tables as a previous daemon left them in the kernel (a daemon that
takes over a live FUSE connection): the nodes the kernel may name, under their numbers and
with the kernel's lookup counts; the file and directory handles it holds open, under their
numbers. Transport-neutral: it is given plain records (:class:`SavedNode`, :class:`SavedOpen`).

Contract: after :func:`restore`, every node number and handle the kernel holds means what it
meant to the old daemon, with these limits (each logged, none raises):

* a node whose path is gone at the origin keeps its number (its requests answer ENOENT or
  ESTALE as for any node replaced behind the mount's back);
* a read-only file handle is opened again: it reads the version the origin (or the staging
  area, for a closed file not yet committed) has now;
* a handle open for writing is opened again on its file's live staged version: the one it
  was writing, which recovery adopted (``keep_open`` of
  :func:`airfs.writeback.recovery.recover`), or the closed version it had not written since
  (a ``close()`` of another descriptor, an exec, closed it): its later writes and its close
  go on as if no daemon had changed. Where the file has no staged version (recovery could
  not adopt the one open: its bytes are under ``recovered/``) it is not reopened
  (reopening it on the committed version would mix old and new bytes): its writes and its
  close answer EBADF;
* a handle that cannot be opened again is left out likewise.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass

import trio

from airfs.origin.base import Kind, OriginError

from .context import Caller, as_caller
from .fs import Filesystem
from .inodes import ROOT_INO

log = logging.getLogger(__name__)

#: origin look-ups run at once while nodes are rebuilt
PARALLEL = 16


@dataclass(frozen=True, slots=True)
class SavedNode:
    ino: int
    path: str | None
    kind: Kind
    lookups: int


@dataclass(frozen=True, slots=True)
class SavedOpen:
    fh: int
    ino: int
    flags: int
    directory: bool = False


@dataclass(frozen=True, slots=True)
class Restored:
    """What :func:`restore` rebuilt, and what it could not (handle numbers)."""

    nodes: int
    files: int
    dirs: int
    lost: tuple[int, ...]


def _staged(fs: Filesystem, ino: int) -> bool:
    """Whether the file of ``ino`` has a live staged version (the one its writers' handles
    reopen)."""
    path = fs.inodes.get(ino).path
    return path is not None and fs.core.area.get(path) is not None


async def restore(
    fs: Filesystem, nodes: Iterable[SavedNode], opens: Iterable[SavedOpen]
) -> Restored:
    """Rebuild ``fs``'s node table and handles (``fs`` is fresh: nothing served yet)."""
    as_caller(Caller(0, 0, 0))  # the handles were checked when they were opened
    todo = [n for n in nodes if n.ino != ROOT_INO]
    entries: dict[int, object] = {}
    limit = trio.Semaphore(PARALLEL)

    async def look(n: SavedNode) -> None:
        if n.path is None:
            return
        async with limit:
            try:
                entries[n.ino] = await fs.origin_entry(n.path)
            except (OriginError, OSError) as exc:
                log.warning("take-over: %s: %s", n.path, exc)

    async with trio.open_nursery() as nursery:
        for n in todo:
            nursery.start_soon(look, n)
    for n in sorted(todo, key=lambda n: n.ino):
        got = entries.get(n.ino)
        entry, at = got if isinstance(got, tuple) else (None, 0.0)
        node = fs.inodes.restore(n.ino, n.path, n.kind, entry, n.lookups)
        if entry is not None and entry.kind is not n.kind:
            fs.inodes.detach(node)  # replaced by another kind meanwhile
        elif entry is not None:
            node.fetched = at
    files = dirs = 0
    lost: list[int] = []
    top = 0
    for o in sorted(opens, key=lambda o: o.fh):
        top = max(top, o.fh)
        fs.core.set_next_fh(o.fh)
        try:
            if o.directory:
                got_fh = await fs.opendir(o.ino)
                dirs += 1
            elif o.flags & os.O_ACCMODE != os.O_RDONLY and not _staged(fs, o.ino):
                log.warning(
                    "take-over: handle %d (inode %d) was open for writing: not reopened "
                    "(what it wrote is kept under recovered/)",
                    o.fh,
                    o.ino,
                )
                lost.append(o.fh)
                continue
            else:
                # a writer joins the live staged version (never truncated again)
                got_fh, _ = await fs.open(o.ino, o.flags & ~(os.O_TRUNC | os.O_CREAT | os.O_EXCL))
                files += 1
        except OSError as exc:
            log.warning("take-over: handle %d of inode %d not reopened: %s", o.fh, o.ino, exc)
            lost.append(o.fh)
            continue
        if got_fh != o.fh:  # pragma: no cover - the core numbers handles in order
            raise AssertionError(f"handle {o.fh} reopened as {got_fh}")
    fs.core.set_next_fh(top + 1)
    return Restored(len(todo), files, dirs, tuple(lost))
