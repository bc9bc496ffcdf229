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

import collections
import dataclasses
import errno
import functools
import logging
import os
import stat
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar

import trio

from airfs.origin.aio import AsyncOrigin
from airfs.origin.base import (
    SPECIAL_KINDS,
    Conflict,
    Entry,
    Kind,
    NotADir,
    NotFound,
    OriginError,
    join,
    split,
)
from airfs.readpath import ObjectRef, Reader, ReadPath
from airfs.writeback.staging import Staged, StagingArea

from .attrs import Attr, Owner, attr_of, attr_of_entry, kind_of_mode
from .context import Guard, current_caller
from .inodes import InodeTable, Node
from .listings import Listing, ListingCache
from .stats import CoreStats

log = logging.getLogger(__name__)

NAME_MAX = 255
#: committed files up to this size are copied into the block cache (small files written and
#: read back, e.g. a dataset being built); larger ones (checkpoints) are not: the extra copy
#: of a multi-GiB file on the local disk costs more than it is likely to save
ADOPT_MAX = 128 << 20
_COPY_CHUNK = 8 << 20

P = ParamSpec("P")
R = TypeVar("R")


def counted(fn: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
    """Count calls of a core operation in ``Filesystem.ops`` (shown by ``airfs status``)."""
    name = fn.__name__

    @functools.wraps(fn)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        self = args[0]
        self.ops[name] += 1  # type: ignore[attr-defined]
        return await fn(*args, **kwargs)

    return wrapper


def _err(code: int, msg: str) -> OSError:
    return OSError(code, msg)


@dataclass(eq=False)
class Handle:
    """An open file. Writers always have ``staged``; readers have it when the file was staged
    at open, else an origin ``reader``."""

    fh: int
    node: Node
    writable: bool
    staged: Staged | None
    reader: Reader | None = None
    #: origin version served by ``reader``
    version: str | None = None
    #: origin path pinned at open (the origin keeps that version readable until release)
    pinned: str | None = None


@dataclass(eq=False)
class DirHandle:
    fh: int
    node: Node
    entries: list[tuple[str, Kind, Entry | None, Staged | None]]
    listed_at: float


Emit = Callable[[str, Attr, int], bool]


class Filesystem:
    """The core. Every method runs on the trio loop; blocking origin calls go to threads."""

    def __init__(
        self,
        origin: AsyncOrigin,
        readpath: ReadPath,
        area: StagingArea,
        root_entry: Entry,
        *,
        ttl: float = 1.0,
        owner: Owner | None = None,
        write_wait_s: float = 30.0,
        allow_devices: bool = False,
        guard: Guard | None = None,
    ) -> None:
        self.origin = origin
        self.allow_devices = allow_devices
        self.guard = guard
        #: directories whose entries changed here (a staged create or unlink) at this time
        #: (ns): reported as their mtime/ctime until the origin reports a later one
        self._dir_times: dict[str, int] = {}
        self.readpath = readpath
        self.area = area
        self.ttl = ttl
        self.owner = owner or Owner(os.getuid(), os.getgid())
        self.write_wait_s = write_wait_s
        self.inodes = InodeTable(root_entry)
        self.handles: dict[int, Handle] = {}
        self.dirs: dict[int, DirHandle] = {}
        self._next_fh = 1
        self.ops: collections.Counter[str] = collections.Counter()
        self.listings = ListingCache(ttl)
        self._relisting: dict[str, trio.Event] = {}
        caps = origin.capabilities
        self._pin = origin.sync.pin if caps.pin else None  # type: ignore[attr-defined]
        self._unpin = origin.sync.unpin if caps.pin else None  # type: ignore[attr-defined]
        self._mtimes = caps.mtimes

    # -- helpers ---------------------------------------------------------------------------

    def _fh(self) -> int:
        fh = self._next_fh
        self._next_fh += 1
        return fh

    def _path(self, node: Node) -> str:
        if node.path is None:
            # ESTALE, not ENOENT: a path-based call (open, stat) that raced a rename-over
            # or an unlink is retried by the kernel with a fresh lookup
            raise _err(errno.ESTALE, f"inode {node.ino} was replaced or removed")
        return node.path

    def _child(self, parent_ino: int, name: str) -> str:
        parent = self.inodes.get(parent_ino)
        if parent.kind is not Kind.DIR:
            raise _err(errno.ENOTDIR, "not a directory")
        if len(os.fsencode(name)) > NAME_MAX:
            raise _err(errno.ENAMETOOLONG, "name too long")
        if name in ("", ".", "..") or "/" in name:
            raise _err(errno.EINVAL, f"invalid name {name!r}")
        return join(self._path(parent), name)

    def _new_child(self, parent_ino: int, name: str) -> str:
        """``_child`` for a name about to be created: also refused when the origin could not
        store it (EINVAL / ENAMETOOLONG, before anything is written)."""
        path = self._child(parent_ino, name)
        self.origin.sync.check_name(path)
        return path

    def _staged_attr(self, node: Node, st: Staged) -> Attr:
        owner = Owner(
            self.owner.uid if st.uid is None else st.uid,
            self.owner.gid if st.gid is None else st.gid,
        )
        return attr_of(
            node.ino,
            Kind.FILE,
            st.size,
            st.mtime_ns,
            st.mode,
            owner,
            atime_ns=st.atime_ns,
            ctime_ns=max(st.ctime_ns, st.mtime_ns),
        )

    def _entry_attr(self, node: Node, entry: Entry) -> Attr:
        """Attributes of an origin entry; a directory whose entries changed here reports
        that change's time until the origin reports a later one."""
        if entry.kind is Kind.DIR and node.path is not None:
            t = self._dir_times.get(node.path)
            if t is not None:
                if t > entry.mtime_ns:
                    ctime = max(t, entry.ctime_ns or 0)
                    entry = dataclasses.replace(entry, mtime_ns=t, ctime_ns=ctime)
                else:
                    del self._dir_times[node.path]
        return attr_of_entry(node.ino, entry, self.owner)

    def _dir_changed(self, path: str) -> None:
        """An entry of directory ``path`` was created, removed or renamed."""
        self._dir_times[split(path)[0]] = time.time_ns()

    def _attr(self, node: Node) -> Attr:
        st = self.area.get(node.path) if node.path is not None else node.staged
        if st is not None:
            return self._staged_attr(node, st)
        if node.entry is None:
            raise _err(errno.ENOENT, "no such file")
        return self._entry_attr(node, node.entry)

    def _fresh(self, node: Node) -> bool:
        """Whether ``node.entry`` may be used without asking the origin. A file with several
        names is always asked (a change through another name moves its link count)."""
        e = node.entry
        if e is None or (e.nlink > 1 and e.kind is not Kind.DIR):
            return False
        return time.monotonic() - node.fetched < self.ttl

    async def _check(self, op: str, path: str) -> None:
        """Ask the guard (governed volumes) whether the caller may do ``op`` on ``path``."""
        if self.guard is not None:
            await self.guard.check(current_caller(), op, path)

    def _new_owner(self, parent_ino: int) -> tuple[int, int, bool]:
        """(uid, gid, setgid) of an object the caller creates in ``parent_ino``: the caller's
        uid, and its gid unless the directory is setgid (then the directory's group, and new
        directories inherit the setgid bit)."""
        caller = current_caller()
        parent = self.inodes.get(parent_ino)
        try:
            pattr = self._attr(parent)
        except OSError:
            return caller.uid, caller.gid, False
        if pattr.mode & stat.S_ISGID:
            return caller.uid, pattr.gid, True
        return caller.uid, caller.gid, False

    async def _stat(self, path: str, *, fast: bool = False) -> Entry | None:
        try:
            return await self.origin.stat(path, fast=fast)
        except NotFound:
            return None

    async def origin_entry(self, path: str) -> tuple[Entry | None, float]:
        """The origin's entry for ``path`` (None: it does not exist) and the monotonic time it
        is valid from: from a fresh listing of its directory when there is one (a large
        expired listing is fetched again, one request for all its names), else from ``stat``."""
        if path:
            parent, name = split(path)
            listing = self.listings.fresh(parent)
            if listing is None and self.listings.worth_relisting(parent):
                listing = await self._relist(parent)
            if listing is not None:
                entry = listing.entries.get(name)
                if entry is None:
                    self.listings.negative_hits += 1
                else:
                    self.listings.hits += 1
                return entry, listing.at
        t0 = time.monotonic()
        return await self._stat(path, fast=True), t0

    async def _relist(self, dir_path: str) -> Listing | None:
        """Fetch ``dir_path``'s listing again (one fetch at a time per directory)."""
        busy = self._relisting.get(dir_path)
        if busy is not None:
            await busy.wait()
            return self.listings.fresh(dir_path)
        done = self._relisting[dir_path] = trio.Event()
        try:
            t0 = time.monotonic()
            try:
                entries = await self.origin.list(dir_path, fast=True)
            except (NotFound, NotADir):
                self.listings.drop(dir_path)
                return None
            self.listings.relists += 1
            listing = self.listings.put(dir_path, entries, t0)
            return listing if self.listings.fresh(dir_path) is listing else None
        finally:
            del self._relisting[dir_path]
            done.set()

    async def _refresh(self, node: Node) -> Entry | None:
        """Re-read ``node``'s origin entry if it is older than the TTL (None if gone)."""
        if self._fresh(node):
            return node.entry
        path = self._path(node)
        try:
            if node.entry is not None and node.entry.nlink > 1 and node.kind is not Kind.DIR:
                # several names: a listing's entry for this one is stale after a change
                # through another (a link count, a chmod)
                t0 = time.monotonic()
                entry = await self._stat(path, fast=True)
            else:
                entry, t0 = await self.origin_entry(path)
        except OriginError as exc:
            if not exc.transient or node.entry is None:
                raise
            # origin unreachable: keep serving what we know (cached data stays readable)
            log.warning("%s: origin unreachable, using the last known version: %s", path, exc)
            return node.entry
        if entry is None:
            return None
        if entry.kind is not node.kind:
            return None  # replaced by another kind of object: the old inode is gone
        if t0 >= node.fetched:  # else a commit updated the node while we asked
            node.entry = entry
            node.fetched = t0
        return node.entry

    async def committed(self, path: str, entry: Entry, st: Staged) -> None:
        """The uploader's ``on_committed`` hook: ``st`` is at the origin as ``entry``.

        Runs while the upload still holds ``st``, so the staged bytes are exactly that
        version's. Attributes set while it was being uploaded (``rsync`` sets owner, mode and
        times on its temporary file just before the rename) are set at the origin now. Where
        the origin keeps no mtimes, the entry takes the staged file's mtime, so a file's
        attributes never change by themselves at its commit."""
        caps = self.origin.capabilities
        mode = st.mode & 0o7777 if caps.modes and st.mode & 0o7777 != entry.mode else None
        mtime = st.mtime_ns if self._mtimes and st.mtime_ns != entry.mtime_ns else None
        uid = st.uid if caps.owners and st.uid is not None and st.uid != entry.uid else None
        gid = st.gid if caps.owners and st.gid is not None and st.gid != entry.gid else None
        if any(v is not None for v in (mode, mtime, uid, gid)):
            try:
                entry = await self.origin.set_attrs(path, mode, mtime, uid=uid, gid=gid)
            except OriginError as exc:
                log.warning("%s: attributes set during its commit not kept: %s", path, exc)
        if not self._mtimes:
            entry = dataclasses.replace(entry, mtime_ns=st.mtime_ns)
        self.listings.record(path, entry)
        node = self.inodes.at(path)
        if node is not None:
            if node.aliases:
                self.inodes.split(node)  # a new file at this name: the other names part
            node.entry = entry
            node.fetched = time.monotonic()
            if node.cached_version == f"staged:{st.id}" and not st.dirty:
                node.cached_version = entry.version
        adopt = getattr(self.readpath, "adopt", None)
        if adopt is not None and not st.dirty and entry.size == st.size <= ADOPT_MAX:
            try:
                await adopt(ObjectRef(path, entry.version, entry.size), st.file)
            except (OSError, ValueError) as exc:
                log.warning("could not keep %s in the cache after commit: %s", path, exc)

    # -- lookups and attributes ------------------------------------------------------------

    @counted
    async def lookup(self, parent_ino: int, name: str) -> Attr:
        """Resolve ``name`` in a directory; the kernel's lookup count goes up by one."""
        path = self._child(parent_ino, name)
        await self._check("lookup", path)
        st = self.area.get(path)
        if st is not None:
            bound = self.inodes.bind(path, Kind.FILE, None)
            bound.lookups += 1
            return self._staged_attr(bound, st)
        node = self.inodes.at(path)
        if node is None or not self._fresh(node):
            try:
                entry, t0 = await self.origin_entry(path)
            except OriginError as exc:
                known = node.entry if node is not None else self.inodes.last_known(path)
                if not exc.transient:
                    raise
                if known is None:
                    # a name never seen: answer "absent" so that new files can still be
                    # created (their commit is create-only: nothing at the origin is lost)
                    log.warning("%s: origin unreachable; not known here: %s", path, exc)
                    raise _err(errno.ENOENT, f"{path}: not known (origin unreachable)") from None
                log.warning("%s: origin unreachable, using the last known entry: %s", path, exc)
                if node is None:
                    node = self.inodes.bind(path, known.kind, known, at=0.0)  # stale: recheck
                node.lookups += 1
                return self._attr(node)
            if entry is None:
                if self.area.get(path) is not None:  # created while we asked
                    return await self.lookup(parent_ino, name)
                if node is not None and node.opens == 0:
                    self.inodes.unlink_name(path)
                raise _err(errno.ENOENT, f"{path}: no such file or directory")
            node = self.inodes.bind(path, entry.kind, entry, t0)
        node.lookups += 1
        return self._attr(node)

    def forget(self, items: list[tuple[int, int]]) -> None:
        for ino, count in items:
            self.inodes.forget(ino, count)

    @counted
    async def getattr(self, ino: int) -> Attr:
        node = self.inodes.get(ino)
        if node.path is not None:
            await self._check("getattr", node.path)
        if node.path is not None and self.area.get(node.path) is not None:
            return self._attr(node)
        if node.path is None:
            if node.staged is not None:  # unlinked while open: its handles keep working
                return self._staged_attr(node, node.staged)
            if node.entry is None:
                raise _err(errno.ESTALE, "replaced or removed")
            return self._entry_attr(node, node.entry)
        entry = await self._refresh(node)
        if entry is None:
            if node.opens and node.entry is not None:
                return self._entry_attr(node, node.entry)
            raise _err(errno.ENOENT, f"{node.path}: no such file or directory")
        return self._entry_attr(node, entry)

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
        node = self.inodes.get(ino)
        await self._check("write", self._path(node) if node.path is not None else "")
        if uid is not None or gid is not None:
            cur_attr = self._attr(node) if node.path is not None else None
            caller = current_caller()
            if (
                uid is not None
                and not caller.is_root
                and (cur_attr is None or uid != cur_attr.uid)
            ):
                raise _err(errno.EPERM, "only root can change the owner of a file")
            if (
                gid is not None
                and not caller.is_root
                and cur_attr is not None
                and gid != cur_attr.gid
                and (caller.uid != cur_attr.uid or not caller.in_group(gid))
            ):
                raise _err(errno.EPERM, "the group can be changed only to one of the owner's")
        if size is not None:
            if node.kind is Kind.DIR:
                raise _err(errno.EISDIR, "is a directory")
            if size < 0:
                raise _err(errno.EINVAL, "negative size")
            handle = self.handles.get(fh) if fh is not None else None
            async with node.lock:
                if handle is not None and handle.writable and handle.staged is not None:
                    st = await self._writable(handle)
                    temporary = False
                else:
                    live = await self._stage(node, truncate=size == 0)
                    st = await self.area.open_write(live, truncate=size == 0)
                    temporary = True
                st.refs += 1  # keep it while we wait below
                try:
                    # no space is reserved: an extension is a hole (staging counts allocated
                    # bytes); a size the staging filesystem cannot hold is its EFBIG
                    if size != st.size or size != 0:
                        self.area.truncate(st, size)
                finally:
                    st.refs -= 1
                    if temporary:
                        self.area.close_writer(st)
                    self.area.release(st)
                    self.area.notify()
        if any(v is not None for v in (mode, mtime_ns, uid, gid, atime_ns)):
            cur = self.area.get(node.path) if node.path is not None else node.staged
            new_mode = None if mode is None else stat.S_IMODE(mode)
            if cur is not None:
                self.area.set_attrs(
                    cur, mode=new_mode, mtime_ns=mtime_ns, uid=uid, gid=gid, atime_ns=atime_ns
                )
            if mtime_ns is not None and node.path is not None:
                self._dir_times.pop(node.path, None)  # a time set wins over our own
            at_origin = cur is None or not any(v.dirty for v in self.area.versions(cur))
            if at_origin and node.path is not None:
                entry = await self.origin.set_attrs(
                    node.path, new_mode, mtime_ns, uid=uid, gid=gid, atime_ns=atime_ns
                )
                node.entry = entry
                node.fetched = time.monotonic()
                self.listings.record(node.path, entry)
        if node.path is None and node.entry is not None and node.staged is None:
            return self._entry_attr(node, node.entry)
        return self._attr(node)

    @counted
    async def readlink(self, ino: int) -> str:
        node = self.inodes.get(ino)
        if node.kind is not Kind.SYMLINK:
            raise _err(errno.EINVAL, "not a symlink")
        await self._check("readlink", self._path(node))
        return await self.origin.readlink(self._path(node))

    @counted
    async def statfs(self) -> Any:
        return await self.origin.statfs()

    # -- directories -----------------------------------------------------------------------

    @counted
    async def opendir(self, ino: int) -> int:
        """Snapshot a directory listing (origin entries merged with staged files)."""
        node = self.inodes.get(ino)
        if node.kind is not Kind.DIR:
            raise _err(errno.ENOTDIR, "not a directory")
        path = self._path(node)
        await self._check("readdir", path)
        # Staged files first: one whose commit lands while we list would otherwise be in
        # neither snapshot.
        staged = self.area.children(path)
        t0 = time.monotonic()
        listed = await self.origin.list(path)
        self.listings.put(path, listed, t0)
        merged: dict[str, tuple[str, Kind, Entry | None, Staged | None]] = {
            e.name: (e.name, e.kind, e, None) for e in listed
        }
        for st in staged:
            assert st.path is not None
            name = st.path.rpartition("/")[2]
            merged[name] = (name, Kind.FILE, merged.get(name, (name, Kind.FILE, None, None))[2], st)
        if self.guard is not None:
            caller = current_caller()
            merged = {n: v for n, v in merged.items() if self.guard.visible(caller, path, n)}
        fh = self._fh()
        self.dirs[fh] = DirHandle(fh, node, sorted(merged.values(), key=lambda t: t[0]), t0)
        return fh

    @counted
    async def readdir(self, fh: int, start: int, emit: Emit) -> None:
        """Emit entries from index ``start``; each accepted entry adds a lookup reference
        (readdirplus). ``emit(name, attr, next_index)`` returns False when the kernel's
        buffer is full."""
        dh = self.dirs.get(fh)
        if dh is None:
            raise _err(errno.EBADF, "bad directory handle")
        base = self._path(dh.node)
        for i in range(start, len(dh.entries)):
            name, kind, entry, st = dh.entries[i]
            path = join(base, name)
            if st is not None and st.path == path:
                node = self.inodes.bind(path, Kind.FILE, entry, dh.listed_at)
                attr = self._staged_attr(node, st)
            elif entry is not None:
                node = self.inodes.bind(path, kind, entry, dh.listed_at)
                attr = (
                    self._attr(node)
                    if node.entry is not None
                    else self._entry_attr(node, entry)
                )
            else:
                continue  # a staged file deleted since the snapshot
            if not emit(name, attr, i + 1):
                self.inodes.maybe_drop(node)
                return
            node.lookups += 1

    def releasedir(self, fh: int) -> None:
        self.dirs.pop(fh, None)

    @counted
    async def mkdir(self, parent_ino: int, name: str, mode: int) -> Attr:
        path = self._new_child(parent_ino, name)
        await self._check("mkdir", path)
        if self.area.get(path) is not None:
            raise _err(errno.EEXIST, f"{path}: exists")
        uid, gid, setgid = self._new_owner(parent_ino)
        mode = stat.S_IMODE(mode) | (stat.S_ISGID if setgid else 0)
        entry = await self.origin.mkdir(path, mode, uid=uid, gid=gid)
        self._dir_changed(path)
        self.listings.record(path, entry)
        self.listings.put(path, [], time.monotonic())  # new and empty: names inside are local
        node = self.inodes.bind(path, Kind.DIR, entry)
        node.lookups += 1
        return self._entry_attr(node, entry)

    @counted
    async def rmdir(self, parent_ino: int, name: str) -> None:
        path = self._child(parent_ino, name)
        await self._check("rmdir", path)
        if self.area.get(path) is not None:
            raise _err(errno.ENOTDIR, f"{path}: not a directory")
        if self.area.under(path):
            raise _err(errno.ENOTEMPTY, f"{path}: directory not empty")
        await self.origin.rmdir(path)
        self._dir_changed(path)
        self.listings.record(path, None)
        self.listings.drop(path)
        node = self.inodes.at(path)
        if node is not None:
            self.inodes.detach(node)

    # -- names -----------------------------------------------------------------------------

    @counted
    async def unlink(self, parent_ino: int, name: str) -> None:
        path = self._child(parent_ino, name)
        await self._check("unlink", path)
        await self._settle(path)
        st = self.area.get(path)
        at_origin = st is None or st.base_version is not None
        if st is not None:
            self.area.discard(st)
        if at_origin:
            try:
                await self.origin.delete(path)
            except NotFound:
                if st is None:
                    raise
            self.listings.record(path, None)
        self._dir_changed(path)
        node = self.inodes.at(path)
        if node is not None:
            self.inodes.unlink_name(path)
            if node.path is not None:  # the file's other names: its link count moved
                node.fetched = 0.0

    @counted
    async def rename(
        self,
        old_parent: int,
        old_name: str,
        new_parent: int,
        new_name: str,
        *,
        noreplace: bool = False,
        exchange: bool = False,
    ) -> None:
        """Rename a file or directory. Replacing an existing file is atomic at the origin for
        files that exist there; a staged (not yet committed) file is renamed locally and
        commits to its new name, *If-Match* whatever it replaced there (the origin's object,
        or the version a staged file it replaced was going to replace), journaled in the same
        step. ``RENAME_EXCHANGE`` is not supported (EINVAL)."""
        if exchange:
            raise _err(errno.EINVAL, "RENAME_EXCHANGE is not supported")
        old = self._child(old_parent, old_name)
        new = self._new_child(new_parent, new_name)
        await self._check("rename_from", old)
        await self._check("rename_to", new)
        if old == new:
            return
        same = self.inodes.at(old)
        if same is not None and same is self.inodes.at(new) and same.kind is not Kind.DIR:
            return  # two names of one file: rename(2) does nothing
        held = self.area.hold(old, new)  # no commit starts on these names meanwhile
        try:
            await self._settle(old)
            await self._settle(new)
            await self._rename(old, new, noreplace=noreplace)
        finally:
            self.area.unhold(held)
        self._dir_changed(old)
        self._dir_changed(new)

    async def _rename(self, old: str, new: str, *, noreplace: bool) -> None:
        st_src = self.area.get(old)
        st_dst = self.area.get(new)
        dst_entry = None if st_dst is not None else await self._stat(new)
        if noreplace and (st_dst is not None or dst_entry is not None):
            raise _err(errno.EEXIST, f"{new}: exists")
        local_only = st_src is not None and st_src.base_version is None
        src_entry: Entry | None = None
        if local_only:
            if dst_entry is not None and dst_entry.kind is Kind.DIR:
                raise _err(errno.EISDIR, f"{new}: is a directory")
            # the moved file now replaces what is (or will be) at the origin under ``new``
            if st_dst is not None:
                base = st_dst.base_version
            else:
                base = dst_entry.version if dst_entry is not None else None
            self.area.move(old, new, rebase=True, base=base)
            self.inodes.move(old, new)
        else:
            src_entry = await self._stat(old) if st_src is None else None
            if st_src is None and src_entry is None:
                raise _err(errno.ENOENT, f"{old}: no such file or directory")
            if src_entry is not None and src_entry.kind is Kind.DIR:
                if st_dst is not None:
                    raise _err(errno.ENOTDIR, f"{new}: not a directory")
                if dst_entry is not None and dst_entry.kind is Kind.DIR and self.area.under(new):
                    raise _err(errno.ENOTEMPTY, f"{new}: directory not empty")
            elif dst_entry is not None and dst_entry.kind is Kind.DIR:
                raise _err(errno.EISDIR, f"{new}: is a directory")
            try:
                await self.origin.rename(old, new, replace=not noreplace)
            except NotFound:
                if st_src is None:
                    raise
            is_dir = src_entry is not None and src_entry.kind is Kind.DIR
            moved_entry = None if is_dir else await self._stat(new)
            if is_dir:
                self.area.move(old, new)
            else:
                # what the origin's rename put at ``new`` (an S3 copy has a new ETag)
                base = moved_entry.version if moved_entry is not None else None
                self.area.move(old, new, rebase=st_src is not None, base=base)
            self.inodes.move(old, new)
            node = self.inodes.at(new)
            if moved_entry is not None and node is not None:
                node.entry, node.fetched = moved_entry, time.monotonic()
            # forget the new parent's listing: its other names are not known without asking
            self.listings.discard(split(new)[0])
            if is_dir or src_entry is None:
                self.listings.drop(old)
                self.listings.drop(new)
            if moved_entry is not None:
                self.listings.record(new, moved_entry)
        self.listings.record(old, None)
        self.area.notify()

    @counted
    async def symlink(self, parent_ino: int, name: str, target: str) -> Attr:
        path = self._new_child(parent_ino, name)
        await self._check("symlink", path)
        if self.area.get(path) is not None:
            raise _err(errno.EEXIST, f"{path}: exists")
        uid, gid, _ = self._new_owner(parent_ino)
        entry = await self.origin.symlink(path, target, uid=uid, gid=gid)
        self._dir_changed(path)
        self.listings.record(path, entry)
        node = self.inodes.bind(path, Kind.SYMLINK, entry)
        node.lookups += 1
        return self._entry_attr(node, entry)

    @counted
    async def mknod(self, parent_ino: int, name: str, mode: int, rdev: int = 0) -> Attr:
        """Create a FIFO, a socket or (only when the mount allows devices) a device node, at
        the origin (ENOTSUP where it keeps no special files; EPERM for a device node on a
        mount without ``allow_devices``). A regular file is created like ``create``."""
        kind = kind_of_mode(mode)
        if kind is Kind.FILE:
            fh, attr = await self.create(parent_ino, name, mode, os.O_WRONLY | os.O_EXCL)
            await self.flush(fh)
            await self.release(fh)
            return attr
        if kind not in SPECIAL_KINDS:
            raise _err(errno.EINVAL, f"mknod of file type {stat.S_IFMT(mode):o}")
        path = self._new_child(parent_ino, name)
        await self._check("mknod", path)
        if kind in (Kind.CHAR, Kind.BLOCK) and not self.allow_devices:
            raise _err(errno.EPERM, "device nodes are not allowed on this mount")
        if not self.origin.capabilities.special_files:
            raise _err(errno.EOPNOTSUPP, f"{self.origin.url}: no special files at this origin")
        if self.area.get(path) is not None:
            raise _err(errno.EEXIST, f"{path}: exists")
        uid, gid, _ = self._new_owner(parent_ino)
        entry = await self.origin.mknod(path, kind, stat.S_IMODE(mode), rdev, uid=uid, gid=gid)
        self._dir_changed(path)
        self.listings.record(path, entry)
        node = self.inodes.bind(path, kind, entry)
        node.lookups += 1
        return self._entry_attr(node, entry)

    @counted
    async def link(self, ino: int, new_parent_ino: int, new_name: str) -> Attr:
        """Give file ``ino`` a new name. Real hard links where the origin has them (a staged
        source is committed first, and waited for); an atomic create-if-absent copy where
        the origin makes links as copies (S3: EEXIST when the name exists on any node).
        EPERM elsewhere, and for directories."""
        caps = self.origin.capabilities
        node = self.inodes.get(ino)
        if node.kind is Kind.DIR:
            raise _err(errno.EPERM, "hard links to directories are not allowed")
        if not (caps.hard_links or caps.link_copies):
            raise _err(errno.EPERM, f"{self.origin.url}: no hard links at this origin")
        src = self._path(node)
        dst = self._new_child(new_parent_ino, new_name)
        await self._check("link", dst)
        if self.area.get(dst) is not None:
            raise _err(errno.EEXIST, f"{dst}: exists")
        st = self.area.get(src)
        if st is not None:
            # what is written so far is committed and linked, as by fsync (object_store links
            # its temporary file while it is still open); bytes written after the link commit
            # to ``src`` alone later (a commit writes a new file: the names then part)
            if st.dirty:
                self.area.journal_closed(st)
            await self.commit_now(st)
        held = self.area.hold(src, dst)
        try:
            await self._settle(src)
            entry = await self.origin.link(src, dst)
        finally:
            self.area.unhold(held)
        self._dir_changed(dst)
        self.listings.record(dst, entry)
        if caps.hard_links:
            # one file, one node: the kernel sees the new name as the same inode
            node.entry, node.fetched = entry, time.monotonic()
            self.listings.record(src, entry)
            self.inodes.alias(dst, node)
            node.lookups += 1
            return self._entry_attr(node, entry)
        new = self.inodes.bind(dst, entry.kind, entry)  # a copy: a file of its own
        new.lookups += 1
        return self._entry_attr(new, entry)

    # -- files -----------------------------------------------------------------------------

    async def _settle(self, path: str) -> None:
        """Wait for in-flight commits at or under ``path`` to land, so a name operation
        never races an upload to the old name."""
        while busy := [
            v for st in self.area.under(path) for v in self.area.versions(st) if v.uploading
        ]:
            await self._wait_upload(busy[0])

    async def _wait_upload(self, st: Staged) -> None:
        while st.uploading:
            await st.upload_done.wait()

    async def _stage(self, node: Node, *, truncate: bool) -> Staged:
        """The live staged file of ``node``, created (with the origin's content copied in
        unless ``truncate``) if there is none. Open it with ``area.open_write`` to write.
        Caller holds ``node.lock``."""
        path = self._path(node)
        st = self.area.get(path)
        if st is not None:
            return st
        entry = await self._refresh(node) if node.entry is not None else await self._stat(path)
        if entry is not None and entry.kind is not Kind.FILE:
            raise _err(errno.EISDIR if entry.kind is Kind.DIR else errno.EINVAL, path)
        st = self.area.create(
            path,
            base_version=entry.version if entry is not None else None,
            mode=entry.mode if entry is not None else 0o644,
        )
        if entry is not None:
            st.mtime_ns = entry.mtime_ns
            st.uid, st.gid = entry.uid, entry.gid
        else:
            caller = current_caller()
            st.uid, st.gid = caller.uid, caller.gid
        if entry is not None and not truncate and entry.size:
            try:
                await self.area.reserve(st, entry.size, self.write_wait_s)
                await self._copy_up(st, ObjectRef(path, entry.version, entry.size))
            except BaseException:
                self.area.discard(st)
                raise
            st.mtime_ns = entry.mtime_ns
        if entry is not None and (not truncate or entry.size == 0):
            st.committed_gen = st.gen  # same bytes as the origin: nothing to commit yet
        return st

    async def _writable(self, h: Handle) -> Staged:
        """The staged file a write through ``h`` goes to: a closed (journaled) version is
        never written again, its writers move to a copy."""
        st = h.staged
        assert st is not None
        if not (st.closed_version or st.uploading):
            return st
        new = await self.area.fork(st)
        for other in self.handles.values():
            if other.writable and other.staged is st:
                other.staged = new
                st.refs -= 1
                new.refs += 1
        if h.node.staged is st:
            h.node.staged = new
        self.area.release(st)
        return new

    async def _copy_up(self, st: Staged, obj: ObjectRef) -> None:
        reader = self.readpath.open(obj)
        try:
            off = 0
            while off < obj.size:
                data = await reader.read(off, min(_COPY_CHUNK, obj.size - off))
                if not data:
                    raise _err(errno.EIO, f"{obj.path}: origin returned less than its size")
                self.area.write(st, off, data)
                off += len(data)
        finally:
            reader.close()

    @counted
    async def open(self, ino: int, flags: int) -> tuple[int, bool]:
        """Open a file; returns (fh, keep_cache)."""
        node = self.inodes.get(ino)
        if node.kind is Kind.DIR:
            raise _err(errno.EISDIR, "is a directory")
        if node.path is None:
            # replaced or removed after the kernel resolved the name: ESTALE makes the
            # kernel look the name up again (an open racing a rename-over finds the new file)
            raise _err(errno.ESTALE, f"inode {ino} was replaced")
        acc = flags & os.O_ACCMODE
        writable = acc in (os.O_WRONLY, os.O_RDWR)
        trunc = bool(flags & os.O_TRUNC) and writable
        await self._check("open_write" if writable else "open_read", node.path)
        async with node.lock:
            if writable:
                live = await self._stage(node, truncate=trunc)
                wst = await self.area.open_write(live, truncate=trunc)
                if trunc:
                    wst.touch()  # O_TRUNC of an existing file is a change (mtime, ctime)
                st: Staged | None = wst
            else:
                st = self.area.get(self._path(node))
            if st is not None:
                st.refs += 1
                key = f"staged:{st.id}"
                keep = node.cached_version == key and not trunc
                node.cached_version = key
                node.staged = st
                handle = Handle(self._fh(), node, writable, st)
            else:
                handle = await self._open_origin(node)
                keep = node.cached_version == handle.version
                node.cached_version = handle.version
        node.opens += 1
        self.handles[handle.fh] = handle
        return handle.fh, keep

    async def _open_origin(self, node: Node) -> Handle:
        path = self._path(node)
        for _attempt in range(3):
            entry = await self._refresh(node)
            if entry is None:
                raise _err(errno.ENOENT, f"{path}: no such file")
            if self._pin is None:
                obj = ObjectRef(path, entry.version, entry.size)
                return Handle(self._fh(), node, False, None, self.readpath.open(obj), entry.version)
            try:
                await self.origin.call(
                    self._pin, path, entry.version, what=f"open {path}", op="pin"
                )
            except Conflict:
                # changed within the TTL (or the listing we answered from is older than a
                # change): ask the origin itself, not a listing
                fresh = await self._stat(path)
                if fresh is None:
                    raise _err(errno.ENOENT, f"{path}: no such file") from None
                node.entry, node.fetched = fresh, time.monotonic()
                self.listings.record(path, fresh)
                continue
            obj = ObjectRef(path, entry.version, entry.size)
            return Handle(
                self._fh(), node, False, None, self.readpath.open(obj), entry.version, path
            )
        raise _err(errno.EIO, f"{path}: keeps changing at the origin")

    @counted
    async def create(self, parent_ino: int, name: str, mode: int, flags: int) -> tuple[int, Attr]:
        """Create and open a new file (staged only until its first commit). A file created
        with ``O_RDONLY`` (lock files) is committed like any other once closed."""
        path = self._new_child(parent_ino, name)
        await self._check("create", path)
        existing = self.area.get(path)
        if existing is not None and flags & os.O_EXCL:
            raise _err(errno.EEXIST, f"{path}: exists")
        writable = flags & os.O_ACCMODE != os.O_RDONLY
        uid, gid, _ = self._new_owner(parent_ino)
        mode = stat.S_IMODE(mode)
        caller = current_caller()
        if mode & stat.S_ISGID and not caller.is_root and not caller.in_group(gid):
            mode &= ~stat.S_ISGID  # as the kernel does for a group the creator is not in
        node = self.inodes.bind(path, Kind.FILE, None)
        async with node.lock:
            base = existing.base_version if existing is not None else None
            st = self.area.create(path, base_version=base, mode=mode)
            st.uid, st.gid = uid, gid
            if flags & os.O_EXCL and self.origin.capabilities.conditional_put:
                node.entry, node.fetched = await self._claim(st, path), time.monotonic()
            self._dir_changed(path)
            if writable:
                st = await self.area.open_write(st, truncate=False)
            st.refs += 1
        handle = Handle(self._fh(), node, writable, st)
        node.cached_version = f"staged:{st.id}"
        node.staged = st
        node.lookups += 1
        node.opens += 1
        self.handles[handle.fh] = handle
        return handle.fh, self._staged_attr(node, st)

    async def _claim(self, st: Staged, path: str) -> Entry:
        """``O_EXCL`` across nodes: the name is taken at the origin now, empty and
        create-if-absent (EEXIST when another node or tool has it), so that two nodes never
        both believe they created it (lock files, ``mkstemp``, object_store's temporary
        files). The file's content commits over this empty version like any rewrite."""
        try:
            entry = await self.origin.put(
                path, st.file, "", mode=st.mode, mtime_ns=st.mtime_ns, uid=st.uid, gid=st.gid
            )
        except Conflict:
            self.area.discard(st)
            raise _err(errno.EEXIST, f"{path}: exists") from None
        except BaseException:
            self.area.discard(st)
            raise
        assert st.ps is not None
        st.ps.base = entry.version
        st.committed_gen = st.gen  # what is at the origin: nothing to commit until written
        self.listings.record(path, entry)
        return entry

    def _handle(self, fh: int) -> Handle:
        h = self.handles.get(fh)
        if h is None:
            raise _err(errno.EBADF, "bad file handle")
        return h

    @counted
    async def read(self, fh: int, offset: int, size: int) -> bytes:
        h = self._handle(fh)
        # the live staged content at the file's path (rewrites by other processes are seen
        # at once), else the version this handle opened (an unlinked or replaced file)
        st = self.area.get(h.node.path) if h.node.path is not None else None
        if st is None:
            st = h.staged
        if st is not None:
            return os.pread(st.fd, size, offset)
        if h.reader is None:
            raise _err(errno.EIO, "no reader")
        return await h.reader.read(offset, size)

    @counted
    async def write(self, fh: int, offset: int, data: bytes) -> int:
        h = self._handle(fh)
        if not h.writable or h.staged is None:
            raise _err(errno.EBADF, "file not open for writing")
        st = await self._writable(h)
        # a write allocates at most its own length (one far past the end leaves a hole)
        end = min(offset + len(data), st.size + len(data))
        await self.area.reserve(st, end, self.write_wait_s)
        return self.area.write(st, offset, data)

    @counted
    async def flush(self, fh: int) -> None:
        """``close()`` of a file descriptor: when no other descriptor writes the file, its
        content is journaled (it survives a daemon crash from here on)."""
        h = self._handle(fh)
        st = h.staged
        if st is not None and st.dirty and st.writers <= (1 if h.writable else 0):
            self.area.journal_closed(st)

    @counted
    async def release(self, fh: int) -> None:
        h = self.handles.pop(fh, None)
        if h is None:
            return
        st = h.staged
        try:
            if st is not None:
                if h.writable:
                    self.area.close_writer(st)
                elif st.writers == 0:
                    self.area.journal_closed(st)
        finally:
            if st is not None:
                st.refs -= 1
                self.area.release(st)
                self.area.notify()
            if h.reader is not None:
                h.reader.close()
            if h.pinned is not None and self._unpin is not None:
                self._unpin(h.pinned, h.version)
            h.node.opens -= 1
            if h.node.opens < 0:
                raise AssertionError(f"inode {h.node.ino}: open count went negative")
            if h.node.opens == 0:
                h.node.staged = None
            self.inodes.maybe_drop(h.node)

    @counted
    async def fsync(self, fh: int) -> None:
        """Return once this file's content (and the closed versions before it) is committed
        at the origin; EIO naming the file if it cannot be, or lost a conflict."""
        h = self._handle(fh)
        st = h.staged
        if st is None or st.path is None:
            return
        if st.dirty:
            self.area.journal_closed(st)  # later writes go to a new version
        await self.commit_now(st)

    async def commit_now(self, st: Staged) -> None:
        """Commit ``st`` and the closed versions before it now, and wait."""
        targets = [(v, v.gen) for v in self.area.versions(st) if v.dirty]
        await self.area.wait_committed(targets)

    # -- status ----------------------------------------------------------------------------

    def statistics(self) -> CoreStats:
        ls = self.listings.statistics()
        return CoreStats(
            inodes=len(self.inodes),
            open_files=len(self.handles),
            listings=ls["listings"],
            listing_hits=ls["listing_hits"],
            listing_negative_hits=ls["listing_negative_hits"],
            relists=ls["relists"],
            ops=dict(self.ops),
        )
