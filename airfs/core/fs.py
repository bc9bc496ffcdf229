"""The filesystem core: POSIX semantics over an origin, a read path and a staging area.

The FUSE adapter (:mod:`airfs.fuse.ops`) calls these methods and nothing else; tests drive them
directly, without a kernel mount. Methods raise ``OSError`` with the errno to reply with.

Consistency rules (the README's contract table is the user-facing version):

* attributes and entries from the origin are trusted for ``ttl`` seconds, then re-read;
* ``open()`` revalidates the version against the origin once the TTL has passed
  (close-to-open), and lets the kernel keep its page cache only when the version it holds is
  still the current one;
* staged content (files written on this node and not yet committed) always wins over the
  origin: lookups, ``getattr``, listings and reads of every process see it at once;
* metadata operations on origin objects (mkdir, rmdir, unlink, rename, symlink) go to the
  origin synchronously; renames and deletions of files that exist only in staging are local.
"""

from __future__ import annotations

import dataclasses
import errno
import logging
import stat
import time
from typing import Any

from airfs.origin.aio import AsyncOrigin
from airfs.origin.base import (
    Entry,
    Kind,
    OriginError,
)
from airfs.writeback.staging import StagingArea

from .attrs import Attr, Owner
from .base import ADOPT_MAX, Core, counted
from .context import Guard, current_caller
from .files import Files
from .handles import DirHandle, Handle, err
from .names import Names
from .readpath import ReadPath
from .stats import CoreStats

log = logging.getLogger(__name__)

__all__ = ["ADOPT_MAX", "DirHandle", "Filesystem", "Handle", "counted"]


class Filesystem:
    """The core the FUSE adapters drive. Every method runs on the trio loop; blocking origin
    calls go to threads.

    It holds its parts as collaborators: ``core`` (the state every part shares: inodes,
    handles, the staging area and its :class:`~airfs.writeback.opens.Opens`, listings,
    passthrough, statistics), ``files`` (open files: :class:`~airfs.core.files.Files`) and
    ``names`` (listings and changes of names: :class:`~airfs.core.names.Names`); lookups,
    attributes and statistics are its own. The parts' operations are its operations, bound
    once here (no extra call per request); the shared state is reachable under the same
    names as the core's."""

    def __init__(
        self,
        origin: AsyncOrigin,
        readpath: ReadPath,
        area: StagingArea,
        root_entry: Entry,
        *,
        ttl: float = 1.0,
        immutable: bool = False,
        owner: Owner | None = None,
        write_wait_s: float = 30.0,
        allow_devices: bool = False,
        guard: Guard | None = None,
    ) -> None:
        self.core = c = Core(
            origin,
            readpath,
            area,
            root_entry,
            ttl=ttl,
            immutable=immutable,
            owner=owner,
            write_wait_s=write_wait_s,
            allow_devices=allow_devices,
            guard=guard,
        )
        self.files = f = Files(c)
        self.names = n = Names(c, f)
        # the shared state, by the names the adapters, the daemon and tests use
        self.origin, self.readpath, self.area, self.guard = c.origin, c.readpath, c.area, c.guard
        self.inodes, self.handles, self.dirs, self.opens = c.inodes, c.handles, c.dirs, c.opens
        self.listings, self.passthrough, self.owner = c.listings, c.passthrough, c.owner
        self.kernel = c.kernel
        self.ops, self.latency, self.ttl = c.ops, c.latency, c.ttl
        self.per_caller, self.origin_entry = c.per_caller, c.origin_entry
        self.committed, self.commit_now = c.committed, c.commit_now
        # the parts' operations
        self.open, self.create, self.read, self.write = f.open, f.create, f.read, f.write
        self.flush, self.release, self.fsync = f.flush, f.release, f.fsync
        self.passthrough_source = f.passthrough_source
        self.opendir, self.readdir, self.releasedir = n.opendir, n.readdir, n.releasedir
        self.mkdir, self.rmdir, self.unlink, self.rename = n.mkdir, n.rmdir, n.unlink, n.rename
        self.symlink, self.mknod, self.link = n.symlink, n.mknod, n.link

    # -- lookups and attributes ------------------------------------------------------------

    @counted
    async def lookup(self, parent_ino: int, name: str) -> Attr:
        """Resolve ``name`` in a directory; the kernel's lookup count goes up by one."""
        path = self.core.child(parent_ino, name)
        await self.core.check("lookup", path)
        st = self.core.area.get(path)
        if st is not None:
            bound = self.core.inodes.bind(path, Kind.FILE, None)
            bound.lookups += 1
            return self.core.staged_attr(bound, st)
        node = self.core.inodes.at(path)
        if node is None or not self.core.fresh(node):
            try:
                entry, t0 = await self.core.origin_entry(path)
            except OriginError as exc:
                known = node.entry if node is not None else self.core.inodes.last_known(path)
                if not exc.transient:
                    raise
                if known is None:
                    # a name never seen: answer "absent" so that new files can still be
                    # created (their commit is create-only: nothing at the origin is lost)
                    log.warning("%s: origin unreachable; not known here: %s", path, exc)
                    raise err(errno.ENOENT, f"{path}: not known (origin unreachable)") from None
                log.warning("%s: origin unreachable, using the last known entry: %s", path, exc)
                if node is None:
                    node = self.core.inodes.bind(path, known.kind, known, at=0.0)  # stale: recheck
                node.lookups += 1
                return self.core.attr(node)
            if entry is None:
                if self.core.area.get(path) is not None:  # created while we asked
                    return await self.lookup(parent_ino, name)
                if node is not None and node.opens == 0:
                    self.core.inodes.unlink_name(path)
                raise err(errno.ENOENT, f"{path}: no such file or directory")
            node = self.core.inodes.bind(path, entry.kind, entry, t0)
        node.lookups += 1
        return self.core.attr(node)

    def forget(self, items: list[tuple[int, int]]) -> None:
        for ino, count in items:
            self.core.inodes.forget(ino, count)

    @counted
    async def getattr(self, ino: int) -> Attr:
        node = self.core.inodes.get(ino)
        if node.path is not None:
            await self.core.check("getattr", node.path)
        if node.path is not None and self.core.area.get(node.path) is not None:
            return self.core.attr(node)
        if node.path is None:
            # unlinked (or replaced) while open: its handles keep working; no name is left
            held = self.core.opens.of_file(node.ino)
            if held is not None:
                return dataclasses.replace(self.core.staged_attr(node, held), nlink=0)
            if node.entry is None:
                raise err(errno.ESTALE, "replaced or removed")
            return dataclasses.replace(self.core.entry_attr(node, node.entry), nlink=0)
        entry = await self.core.refresh(node)
        if entry is None:
            if node.opens and node.entry is not None:
                return self.core.entry_attr(node, node.entry)
            raise err(errno.ENOENT, f"{node.path}: no such file or directory")
        return self.core.entry_attr(node, entry)

    @counted
    async def setattr(
        self,
        ino: int,
        *,
        size: int | None = None,
        mode: int | None = None,
        mtime_ns: int | None = None,
        fh: int | None = None,
        uid: int | None = None,
        gid: int | None = None,
        atime_ns: int | None = None,
    ) -> Attr:
        """Truncate/extend, chmod, chown, set times. A mode, owner or time set on a staged
        file is journaled with it and kept through its commit; on an origin object it is set
        at the origin (where the origin keeps it). Ownership rules: only root gives a file to
        another user (EPERM); the group rules (owner, one of its groups) are the kernel's
        (``default_permissions``), which also clears setuid/setgid through ``mode``."""
        node = self.core.inodes.get(ino)
        await self.core.check("write", self.core.path_of(node) if node.path is not None else "")
        if uid is not None or gid is not None:
            cur_attr = self.core.attr(node) if node.path is not None else None
            caller = current_caller()
            if uid is not None and not caller.is_root and (cur_attr is None or uid != cur_attr.uid):
                raise err(errno.EPERM, "only root can change the owner of a file")
            if (
                gid is not None
                and not caller.is_root
                and cur_attr is not None
                and gid != cur_attr.gid
                and (caller.uid != cur_attr.uid or not caller.in_group(gid))
            ):
                raise err(errno.EPERM, "the group can be changed only to one of the owner's")
        if size is not None:
            if node.kind is Kind.DIR:
                raise err(errno.EISDIR, "is a directory")
            if size < 0:
                raise err(errno.EINVAL, "negative size")
            handle = self.core.handles.get(fh) if fh is not None else None
            async with node.lock:
                temporary = None
                if handle is not None and handle.writable and handle.opened is not None:
                    st = await self.files.writable(handle)
                else:
                    live = await self.files.stage(node, truncate=size == 0)
                    temporary = await self.core.opens.open(
                        live, None, writable=True, truncate=size == 0
                    )
                    st = self.core.opens.version(temporary)
                    self.core.passthrough.in_place(st)
                try:
                    # no space is reserved: an extension is a hole (staging counts allocated
                    # bytes); a size the staging filesystem cannot hold is its EFBIG
                    if size != st.size or size != 0:
                        await self.core.area.io.truncate(st, size)
                finally:
                    if temporary is not None:
                        self.core.opens.close_now(temporary)
        if any(v is not None for v in (mode, mtime_ns, uid, gid, atime_ns)):
            cur = (
                self.core.area.get(node.path)
                if node.path is not None
                else self.core.opens.of_file(node.ino)
            )
            if cur is not None:
                self.core.passthrough.sync(cur)  # writes the kernel made directly count as dirty
            new_mode = None if mode is None else stat.S_IMODE(mode)
            if cur is not None:
                self.core.area.set_attrs(
                    cur, mode=new_mode, mtime_ns=mtime_ns, uid=uid, gid=gid, atime_ns=atime_ns
                )
            if mtime_ns is not None and node.path is not None:
                self.core.dir_times.pop(node.path, None)  # a time set wins over our own
            at_origin = cur is None or not any(v.dirty for v in self.core.area.versions(cur))
            while (
                at_origin
                and cur is not None
                and (busy := [v for v in self.core.area.versions(cur) if v.uploading])
            ):
                # a commit that landed is still setting the attributes changed during its
                # upload (the uploader's committed hook): a change made at the origin now
                # would race it (both copy the object onto itself; the last one wins and
                # undoes the other's owner or mode), so it waits for it
                await self.core.wait_upload(busy[0])
                at_origin = not any(v.dirty for v in self.core.area.versions(cur))
            path = node.path  # (a rename during the origin call must not record None)
            if at_origin and path is not None:
                entry = await self.core.origin.set_attrs(
                    path, new_mode, mtime_ns, uid=uid, gid=gid, atime_ns=atime_ns
                )
                if cur is not None and cur.ps is not None and cur.ps.base is not None:
                    # our own change of the version the staged file replaces: its next
                    # commit replaces this one (If-Match), not a conflict
                    self.core.area.rebase(cur.ps, entry.version)
                node.entry = entry
                node.fetched = time.monotonic()
                self.core.listings.record(path, entry)
        if (
            node.path is None
            and node.entry is not None
            and self.core.opens.of_file(node.ino) is None
        ):
            return self.core.entry_attr(node, node.entry)
        return self.core.attr(node)

    @counted
    async def readlink(self, ino: int) -> str:
        node = self.core.inodes.get(ino)
        if node.kind is not Kind.SYMLINK:
            raise err(errno.EINVAL, "not a symlink")
        await self.core.check("readlink", self.core.path_of(node))
        return await self.core.origin.readlink(self.core.path_of(node))

    @counted
    async def statfs(self) -> Any:
        return await self.core.origin.statfs()

    # -- what a transport asks of an open directory --------------------------------------

    def listing_signature(self, fh: int) -> int | None:
        """A hash of the names, kinds and inode numbers of directory handle ``fh``'s listing
        (equal signatures: the kernel's cached listing of an earlier open is still right, so
        it may keep it: ``FOPEN_KEEP_CACHE``); None for a listing filtered for its caller or
        a directory no longer at its path."""
        d = self.core.dirs.get(fh)
        if d is None or d.node.path is None or d.per_caller:
            return None
        prefix = f"{d.node.path}/" if d.node.path else ""
        at = self.core.inodes.at
        return hash(
            tuple(
                (e.name, e.kind, node.ino if (node := at(prefix + e.name)) is not None else 0)
                for e in d.entries
            )
        )

    def dir_per_caller(self, fh: int) -> bool:
        """Whether directory handle ``fh``'s listing was filtered for its caller (governed
        levels): the kernel must not cache it for other callers."""
        d = self.core.dirs.get(fh)
        return d is not None and d.per_caller

    def refresh(self, path: str) -> dict[str, int]:
        """``airfs refresh PATH``: forget the listings of ``path`` and of every directory
        under it, and make every name known at or under it be asked of the origin at its
        next use (with ``immutable``, the only way a change made at the origin is seen
        before the next mount). Returns the names and listings forgotten."""
        return self.core.forget_known(path)

    # -- status ----------------------------------------------------------------------------

    def statistics(self) -> CoreStats:
        ls = self.core.listings.statistics()
        return CoreStats(
            inodes=len(self.core.inodes),
            open_files=len(self.core.handles),
            listings=ls.listings,
            listing_hits=ls.listing_hits,
            listing_negative_hits=ls.listing_negative_hits,
            relists=ls.relists,
            ahead_hits=self.core.listings.ahead_hits,
            fast_opens=self.core.fast_opens,
            fetched_ahead=self.core.ahead.submitted,
            joined_asks=self.core.joined_asks,
            kernel=self.core.kernel.statistics(),
            ops=dict(self.core.ops),
            latency=self.core.latency.snapshot(),
        )
