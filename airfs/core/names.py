"""Directories and names: opendir/readdir, mkdir/rmdir, unlink, rename, symlink, mknod and
link, layered on :class:`~airfs.core.files.FileOps`."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import stat
import time

import trio

from airfs.origin.base import (
    SPECIAL_KINDS,
    Entry,
    Kind,
    NotFound,
    join,
    split,
)
from airfs.writeback import unsure
from airfs.writeback.staging import PathState

from .attrs import Attr, kind_of_mode
from .base import ADOPT_MAX, Core, counted
from .context import current_caller
from .files import Files
from .handles import DirEntry, DirHandle, Emit, err
from .inodes import Node
from .listings import HEADS_MAX
from .readpath import ObjectRef

#: an unlinked staged file of this many bytes or more is deleted before the unlink answers
FREE_AT_ONCE = 1 << 20
#: origin ``stat``s at once when a renamed directory's staged files are rebased
REBASE_JOBS = 16

log = logging.getLogger(__name__)


class Names:
    """Directory listings and every change of a name. Holds no state of its own (the
    directory handles and inodes are the :class:`~airfs.core.base.Core`'s); a change of a name
    that closes or creates a file goes through ``files``."""

    def __init__(self, core: Core, files: Files) -> None:
        self.core = core
        self.files = files

    # -- directories -----------------------------------------------------------------------

    @counted
    async def opendir(self, ino: int) -> int:
        """Snapshot a directory listing (origin entries merged with staged files)."""
        node = self.core.inodes.get(ino)
        if node.kind is not Kind.DIR:
            raise err(errno.ENOTDIR, "not a directory")
        path = self.core.path_of(node)
        await self.core.check("readdir", path)
        # Staged files first: one whose commit lands while we list would otherwise be in
        # neither snapshot.
        staged = self.core.area.children(path)
        trusted = self.core.trusts(path)
        kept = self.core.listings.fresh(path) if trusted else None
        if kept is not None:  # immutable: the listing is trusted until `airfs refresh`
            t0, listed = kept.at, list(kept.entries.values())
        else:
            t0 = time.monotonic()
            # an adapter that can answer names alone: a big directory's objects are not each
            # asked their attributes (S3: a HEAD per object) to list it; its names are
            # answered bare, and those looked up afterwards are asked by name
            heads = HEADS_MAX if self.core.bare_entries else None
            listed = await self.core.origin.list(path, heads_max=heads)
            if trusted:  # what is known of a name is kept (until `airfs refresh`)
                listed = [self.known(path, e) for e in listed]
            self.core.put_listing(path, listed, t0)
        merged: dict[str, DirEntry] = {e.name: DirEntry(e.name, e.kind, e, None) for e in listed}
        for st in staged:
            # (unlinked, renamed over or moved out while the origin listed: not here now)
            if st.path is None or split(st.path)[0] != path:
                continue
            name = split(st.path)[1]
            old = merged.get(name)
            merged[name] = DirEntry(name, Kind.FILE, old.entry if old is not None else None, st)
        per_caller = self.core.guard is not None and self.core.guard.filters(path)
        if self.core.guard is not None:
            caller = current_caller()
            merged = {n: v for n, v in merged.items() if self.core.guard.visible(caller, path, n)}
        fh = self.core.new_fh()
        entries = sorted(merged.values(), key=lambda d: d.name)
        self.core.dirs[fh] = DirHandle(fh, node, entries, t0, per_caller)
        return fh

    def known(self, dir_path: str, entry: Entry) -> Entry:
        """``--immutable``: the entry this mount trusts for the name of ``entry`` (listed
        in ``dir_path``) when it has one, else ``entry``."""
        node = self.core.inodes.at(join(dir_path, entry.name))
        if node is not None and node.entry is not None and self.core.fresh(node):
            return node.entry
        return entry

    @counted
    async def readdir(self, fh: int, start: int, emit: Emit) -> None:
        """Emit entries from index ``start``; each accepted entry adds a lookup reference
        (readdirplus), except a name whose attributes are not known (a guessed entry of a
        bare listing, with no fresh node): it is emitted with ``known`` False.
        ``emit(name, attr, next_index, known)`` returns False when the kernel's buffer is
        full."""
        dh = self.core.dirs.get(fh)
        if dh is None:
            raise err(errno.EBADF, "bad directory handle")
        base = self.core.path_of(dh.node)
        for i in range(start, len(dh.entries)):
            de = dh.entries[i]
            name, kind, entry, st = de.name, de.kind, de.entry, de.staged
            path = join(base, name)
            if st is not None and st.path == path:
                node = self.core.inodes.bind(path, Kind.FILE, entry, dh.listed_at)
                attr = self.core.staged_attr(node, st)
            elif entry is not None and entry.guessed:
                known = self.core.inodes.at(path)
                if known is not None and known.kind is kind and self.core.fresh(known):
                    node, attr = known, self.core.attr(known)
                else:
                    # its inode number only (the one a lookup will answer), no attributes
                    node = self.core.inodes.named(path, kind)
                    if not emit(name, self.core.entry_attr(node, entry), i + 1, False):
                        return
                    continue
            elif entry is not None:
                node = self.core.inodes.bind(path, kind, entry, dh.listed_at)
                attr = (
                    self.core.attr(node)
                    if node.entry is not None
                    else self.core.entry_attr(node, entry)
                )
            else:
                continue  # a staged file deleted since the snapshot
            if not emit(name, attr, i + 1, True):
                self.core.inodes.maybe_drop(node)
                return
            node.lookups += 1

    def releasedir(self, fh: int) -> None:
        self.core.dirs.pop(fh, None)

    @counted
    async def mkdir(self, parent_ino: int, name: str, mode: int) -> Attr:
        path = self.core.new_child(parent_ino, name)
        await self.core.check("mkdir", path)
        if self.core.area.get(path) is not None:
            raise err(errno.EEXIST, f"{path}: exists")
        uid, gid, setgid = self.core.new_owner(parent_ino)
        mode = stat.S_IMODE(mode) | (stat.S_ISGID if setgid else 0)
        entry = await self.core.origin.mkdir(path, mode, uid=uid, gid=gid)
        self.core.dir_changed(path, +1)
        self.core.listings.record(path, entry)
        self.core.listings.put(path, [], time.monotonic())  # new and empty: names inside are local
        node = self.core.inodes.bind(path, Kind.DIR, entry)
        node.lookups += 1
        return self.core.entry_attr(node, entry)

    @counted
    async def rmdir(self, parent_ino: int, name: str) -> None:
        path = self.core.child(parent_ino, name)
        await self.core.check("rmdir", path)
        if self.core.area.get(path) is not None:
            raise err(errno.ENOTDIR, f"{path}: not a directory")
        if self.core.area.under(path):
            raise err(errno.ENOTEMPTY, f"{path}: directory not empty")
        await self.core.origin.rmdir(path)
        self.core.dir_changed(path, -1)
        self.core.listings.record(path, None)
        self.core.listings.drop(path)
        node = self.core.inodes.at(path)
        if node is not None:
            self.core.inodes.detach(node)

    # -- names -----------------------------------------------------------------------------

    @counted
    async def unlink(self, parent_ino: int, name: str) -> None:
        path = self.core.child(parent_ino, name)
        await self.core.check("unlink", path)
        held = self.core.area.hold(path)  # no commit starts on it (an upload stopped stays so)
        try:
            await self._unlink(path)
        finally:
            self.core.area.unhold(held)

    async def _unlink(self, path: str) -> None:
        await self.core.settle(path, stop=True)
        st = self.core.area.get(path)
        at_origin = st is None or st.base_version is not None
        # a file never committed may still have left a put that failed after it landed
        leftovers = list(st.ps.unsure) if st is not None and st.ps is not None else []
        if st is not None:
            staged_bytes = sum(v.size for v in self.core.area.versions(st))
            self.core.area.discard(st)
            if staged_bytes >= FREE_AT_ONCE:
                # its staging files deleted before the unlink answers, as a local disk
                # gives the space back (not left to the journal's next batch, a second)
                with contextlib.suppress(OSError):  # (journal full: retried every second)
                    await self.core.area.settle(files=True)
        if at_origin:
            try:
                await self.core.origin.delete(path)
            except NotFound:
                if st is None:
                    raise
        elif leftovers:
            await unsure.drop_leftover(self.core.origin, path, leftovers)
        if at_origin or leftovers:
            self.core.listings.record(path, None)
            self.core.readpath.discard(path)
        self.core.dir_changed(path)
        node = self.core.inodes.at(path)
        if node is not None:
            self.core.inodes.unlink_name(path)
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
            raise err(errno.EINVAL, "RENAME_EXCHANGE is not supported")
        old = self.core.child(old_parent, old_name)
        new = self.core.new_child(new_parent, new_name)
        await self.core.check("rename_from", old)
        await self.core.check("rename_to", new)
        self.core.one_storage(old, new, "rename")
        if old == new:
            return
        same = self.core.inodes.at(old)
        if same is not None and same is self.core.inodes.at(new) and same.kind is not Kind.DIR:
            return  # two names of one file: rename(2) does nothing
        held = self.core.area.hold(old, new)  # no commit starts on these names meanwhile
        try:
            await self.core.settle(old, stop=True)
            await self.core.settle(new, stop=True)
            moved_dir, replaced = await self._rename(old, new, noreplace=noreplace)
        finally:
            self.core.area.unhold(held)
        moves = moved_dir and split(old)[0] != split(new)[0]
        self.core.dir_changed(old, -1 if moves else 0)
        self.core.dir_changed(new, +1 if moves and not replaced else 0)

    async def _carry(self, src: Entry, old: str, moved: Entry, new: str) -> None:
        """A file renamed at the origin by a copy that kept its version: what the cache holds
        of it moves with it (readers opened on ``new`` before its next replacement then
        never need the origin's copy of a version that is gone by then). Only where open
        files are not pinned (S3): a pinning origin keeps a replaced version for its
        readers, and the local copy would cost more than it saves."""
        if self.core.pin is not None:
            return
        if moved.version != src.version or not src.version or src.size > ADOPT_MAX:
            return
        try:
            await self.core.readpath.carry(
                ObjectRef(old, src.version, src.size), ObjectRef(new, moved.version, moved.size)
            )
        except (OSError, ValueError) as exc:
            log.warning("could not keep %s in the cache after its rename: %s", new, exc)

    async def _rebase_moved(self, new: str) -> None:
        """The staged files of a directory just renamed at the origin to ``new`` that
        replace a committed version now replace what the rename put at their new names
        (an S3 rename copies each object, and a copy may get a new version tag: AWS gives
        the copy of a multipart object one); else their commits would lose a conflict
        with their own old bytes. One origin ``stat`` per such file, up to
        :data:`REBASE_JOBS` at once. Never raises (the origin has renamed already): a file
        whose ``stat`` fails is logged and keeps its old base, so its commit loses a
        conflict and its bytes are kept in ``conflicts/``, reported, never lost."""
        todo = [
            (ps, path)
            for st in self.core.area.under(new)
            if (ps := st.ps) is not None and ps.base is not None and (path := ps.path)
        ]
        limit = trio.CapacityLimiter(REBASE_JOBS)

        async def rebase(ps: PathState, path: str) -> None:
            try:
                async with limit:
                    entry = await self.core.origin.stat(path)
            except NotFound:
                return
            except OSError as exc:  # OriginError too
                log.warning("%s: version after the rename unknown (%s): kept as it was", path, exc)
                return
            if ps.path == path:  # (not moved or deleted meanwhile)
                self.core.area.rebase(ps, entry.version)

        async with trio.open_nursery() as nursery:
            for ps, path in todo:
                nursery.start_soon(rebase, ps, path)

    def _name_nodes(self, *paths: str) -> list[Node]:
        """The distinct inodes bound at ``paths``, in inode order (the order their locks are
        taken in, so that two renames never wait for each other)."""
        found = {n.ino: n for n in (self.core.inodes.at(p) for p in paths) if n is not None}
        return [found[i] for i in sorted(found)]

    async def _rename(self, old: str, new: str, *, noreplace: bool) -> tuple[bool, bool]:
        """Rename ``old`` to ``new``; returns (a directory was moved, something was replaced)."""
        st_src = self.core.area.get(old)
        st_dst = self.core.area.get(new)
        dst_entry = None if st_dst is not None else await self.core.stat(new)
        if noreplace and (st_dst is not None or dst_entry is not None):
            raise err(errno.EEXIST, f"{new}: exists")
        local_only = st_src is not None and st_src.base_version is None
        src_entry: Entry | None = None
        if local_only:
            if dst_entry is not None and dst_entry.kind is Kind.DIR:
                raise err(errno.EISDIR, f"{new}: is a directory")
            # the moved file now replaces what is (or will be) at the origin under ``new``
            if st_dst is not None:
                base = st_dst.base_version
            else:
                base = dst_entry.version if dst_entry is not None else None
            leftovers = list(st_src.ps.unsure) if st_src and st_src.ps else []
            self.core.area.move(old, new, rebase=True, base=base)
            self.core.inodes.move(old, new)
            # what a put of it that failed after it landed may have left at the old name
            await unsure.drop_leftover(self.core.origin, old, leftovers)
        else:
            src_entry = await self.core.stat(old) if st_src is None else None
            if st_src is None and src_entry is None:
                raise err(errno.ENOENT, f"{old}: no such file or directory")
            if src_entry is not None and src_entry.kind is Kind.DIR:
                if st_dst is not None:
                    raise err(errno.ENOTDIR, f"{new}: not a directory")
                if (
                    dst_entry is not None
                    and dst_entry.kind is Kind.DIR
                    and self.core.area.under(new)
                ):
                    raise err(errno.ENOTEMPTY, f"{new}: directory not empty")
            elif dst_entry is not None and dst_entry.kind is Kind.DIR:
                raise err(errno.EISDIR, f"{new}: is a directory")
            # opens of either name wait until the mount has taken the new name: the copy
            # replaces the destination's version at once, and an open meanwhile would read
            # that gone version (EIO); after the move it finds the old inode renamed away
            # (ESTALE: the kernel looks the name up again) and opens the new one
            async with contextlib.AsyncExitStack() as locks:
                for n in self._name_nodes(old, new):
                    await locks.enter_async_context(n.lock)
                try:
                    await self.core.origin.rename(old, new, replace=not noreplace)
                except NotFound:
                    if st_src is None:
                        raise
                is_dir = src_entry is not None and src_entry.kind is Kind.DIR
                moved_entry = None if is_dir else await self.core.stat(new)
                if is_dir:
                    self.core.area.move(old, new)
                    await self._rebase_moved(new)
                else:
                    # what the origin's rename put at ``new`` (an S3 copy has a new ETag)
                    base = moved_entry.version if moved_entry is not None else None
                    self.core.area.move(old, new, rebase=st_src is not None, base=base)
                self.core.inodes.move(old, new)
                node = self.core.inodes.at(new)
                if moved_entry is not None and node is not None:
                    node.entry, node.fetched = moved_entry, time.monotonic()
                # forget the new parent's listing: its other names are not known without asking
                self.core.listings.discard(split(new)[0])
                if is_dir or src_entry is None:
                    self.core.listings.drop(old)
                    self.core.listings.drop(new)
                if moved_entry is not None:
                    self.core.listings.record(new, moved_entry)
                    if src_entry is not None:
                        await self._carry(src_entry, old, moved_entry, new)
                self.core.readpath.discard(old)
                self.core.readpath.discard(new, keep=moved_entry.version if moved_entry else None)
        self.core.listings.record(old, None)
        self.core.area.notify()
        moved_dir = src_entry is not None and src_entry.kind is Kind.DIR
        return moved_dir, st_dst is not None or dst_entry is not None

    @counted
    async def symlink(self, parent_ino: int, name: str, target: str) -> Attr:
        path = self.core.new_child(parent_ino, name)
        await self.core.check("symlink", path)
        if self.core.area.get(path) is not None:
            raise err(errno.EEXIST, f"{path}: exists")
        uid, gid, _ = self.core.new_owner(parent_ino)
        entry = await self.core.origin.symlink(path, target, uid=uid, gid=gid)
        self.core.dir_changed(path)
        self.core.listings.record(path, entry)
        node = self.core.inodes.bind(path, Kind.SYMLINK, entry)
        node.lookups += 1
        return self.core.entry_attr(node, entry)

    @counted
    async def mknod(self, parent_ino: int, name: str, mode: int, rdev: int = 0) -> Attr:
        """Create a FIFO, a socket or (only when the mount allows devices) a device node, at
        the origin (ENOTSUP where it keeps no special files; EPERM for a device node on a
        mount without ``allow_devices``). A regular file is created like ``create``."""
        kind = kind_of_mode(mode)
        if kind is Kind.FILE:
            fh, attr = await self.files.create(parent_ino, name, mode, os.O_WRONLY | os.O_EXCL)
            await self.files.flush(fh)
            await self.files.release(fh)
            return attr
        if kind not in SPECIAL_KINDS:
            raise err(errno.EINVAL, f"mknod of file type {stat.S_IFMT(mode):o}")
        path = self.core.new_child(parent_ino, name)
        await self.core.check("mknod", path)
        if kind in (Kind.CHAR, Kind.BLOCK) and not self.core.allow_devices:
            raise err(errno.EPERM, "device nodes are not allowed on this mount")
        if not self.core.origin.capabilities.special_files:
            raise err(errno.EOPNOTSUPP, f"{self.core.origin.url}: no special files at this origin")
        if self.core.area.get(path) is not None:
            raise err(errno.EEXIST, f"{path}: exists")
        uid, gid, _ = self.core.new_owner(parent_ino)
        entry = await self.core.origin.mknod(path, kind, stat.S_IMODE(mode), rdev, uid=uid, gid=gid)
        self.core.dir_changed(path)
        self.core.listings.record(path, entry)
        node = self.core.inodes.bind(path, kind, entry)
        node.lookups += 1
        return self.core.entry_attr(node, entry)

    @counted
    async def link(self, ino: int, new_parent_ino: int, new_name: str) -> Attr:
        """Give file ``ino`` a new name. Real hard links where the origin has them (a staged
        source is committed first, and waited for); an atomic create-if-absent copy where
        the origin makes links as copies (S3: EEXIST when the name exists on any node).
        EPERM elsewhere, and for directories."""
        caps = self.core.origin.capabilities
        node = self.core.inodes.get(ino)
        if node.kind is Kind.DIR:
            raise err(errno.EPERM, "hard links to directories are not allowed")
        if not (caps.hard_links or caps.link_copies):
            raise err(errno.EPERM, f"{self.core.origin.url}: no hard links at this origin")
        src = self.core.path_of(node)
        dst = self.core.new_child(new_parent_ino, new_name)
        await self.core.check("link", dst)
        self.core.one_storage(src, dst, "link")
        await self.core.check("link_from", src)  # the new name must not give what src does not
        if self.core.area.get(dst) is not None:
            raise err(errno.EEXIST, f"{dst}: exists")
        st = self.core.area.get(src)
        if st is not None:
            # what is written so far is committed and linked, as by fsync (object_store links
            # its temporary file while it is still open); bytes written after the link commit
            # to ``src`` alone later (a commit writes a new file: the names then part)
            await self.core.area.io.quiesce(st)
            self.core.area.close_version(st, barrier=True)
            await self.core.commit_now(st)
        held = self.core.area.hold(src, dst)
        try:
            await self.core.settle(src)
            entry = await self.core.origin.link(src, dst)
        finally:
            self.core.area.unhold(held)
        self.core.dir_changed(dst)
        self.core.listings.record(dst, entry)
        if caps.hard_links:
            # one file, one node: the kernel sees the new name as the same inode
            node.entry, node.fetched = entry, time.monotonic()
            self.core.listings.record(src, entry)
            self.core.inodes.alias(dst, node)
            node.lookups += 1
            return self.core.entry_attr(node, entry)
        new = self.core.inodes.bind(dst, entry.kind, entry)  # a copy: a file of its own
        new.lookups += 1
        return self.core.entry_attr(new, entry)
