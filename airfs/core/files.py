"""File handles: open, create, read, write, flush, release and fsync (the write-back path's
entry points), layered on :class:`~airfs.core.base.CoreBase`."""

from __future__ import annotations

import errno
import logging
import os
import stat
import time

from airfs.origin.base import (
    Conflict,
    Entry,
    Kind,
)
from airfs.writeback.staging import Staged

from .attrs import Attr
from .base import Core, counted
from .context import current_caller
from .handles import Handle, err
from .inodes import Node
from .readpath import LocalFile, ObjectRef, ReadBuffer

log = logging.getLogger(__name__)

#: bytes copied at a time when a committed file is staged for writing (copy-up)
COPY_CHUNK = 8 << 20
#: a cached file up to this size is taken from the block cache at open (loaded and verified
#: if need be: it is read whole by then anyway) rather than pinned at the origin; a larger
#: one is taken only when that costs nothing (:meth:`ReadPath.local_file_now`)
VERIFY_AT_OPEN_MAX = 8 << 20


class Files:
    """Open files: staged (written) content and origin readers. Holds no state of its own:
    the handles, inodes and staging area are the :class:`~airfs.core.base.Core`'s."""

    def __init__(self, core: Core) -> None:
        self.core = core

    async def stage(self, node: Node, *, truncate: bool) -> Staged:
        """The live staged file of ``node``, created (with the origin's content copied in
        unless ``truncate``) if there is none. Open it with ``opens.open`` to use it.
        Caller holds ``node.lock``."""
        path = self.core.path_of(node)
        st = self.core.area.get(path)
        if st is not None:
            return st
        entry = (
            await self.core.refresh(node) if node.entry is not None else await self.core.stat(path)
        )
        if node.path != path:
            # unlinked or renamed over while the origin answered: staging it now would bring
            # it back at that name (ESTALE: the kernel looks the name up again)
            raise err(errno.ESTALE, f"inode {node.ino} was replaced or removed")
        if entry is not None and entry.kind is not Kind.FILE:
            raise err(errno.EISDIR if entry.kind is Kind.DIR else errno.EINVAL, path)
        st = await self.core.area.create(
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
                await self.core.area.io.reserve(st, entry.size, self.core.write_wait_s)
                await self._copy_up(st, ObjectRef(path, entry.version, entry.size))
            except BaseException:
                self.core.area.discard(st)
                raise
            st.mtime_ns = entry.mtime_ns
        if entry is not None and (not truncate or entry.size == 0):
            st.committed_gen = st.gen  # same bytes as the origin: nothing to commit yet
        self.core.area.records.describe(st)
        return st

    async def writable(self, h: Handle) -> Staged:
        """The staged version a write through ``h`` goes to (a closed one is never written
        again: :meth:`~airfs.writeback.opens.Opens.writable`)."""
        assert h.opened is not None
        return await self.core.opens.writable(h.opened, in_place=self.core.passthrough.in_place)

    async def _copy_up(self, st: Staged, obj: ObjectRef) -> None:
        reader = self.core.readpath.open(obj)
        try:
            off = 0
            while off < obj.size:
                data = await reader.read(off, min(COPY_CHUNK, obj.size - off))
                if not data:
                    raise err(errno.EIO, f"{obj.path}: origin returned less than its size")
                await self.core.area.io.write(st, off, data)
                off += len(data)
        finally:
            reader.close()

    @counted
    async def open(self, ino: int, flags: int) -> tuple[int, bool]:
        """Open a file; returns (fh, keep_cache)."""
        node = self.core.inodes.get(ino)
        if node.kind is Kind.DIR:
            raise err(errno.EISDIR, "is a directory")
        if node.path is None:
            # replaced or removed after the kernel resolved the name: ESTALE makes the
            # kernel look the name up again (an open racing a rename-over finds the new file)
            raise err(errno.ESTALE, f"inode {ino} was replaced")
        acc = flags & os.O_ACCMODE
        writable = acc in (os.O_WRONLY, os.O_RDWR)
        trunc = bool(flags & os.O_TRUNC) and writable
        await self.core.check("open_write" if writable else "open_read", node.path)
        path = node.path
        if path is None:  # renamed over or removed while the guard decided (it may wait)
            raise err(errno.ESTALE, f"inode {ino} was replaced")
        if not writable and not node.lock.locked():
            fast = self._open_local(node, path)
            if fast is not None:
                return fast
        async with node.lock:
            if node.path is None:  # renamed over while we waited for the lock (see rename)
                raise err(errno.ESTALE, f"inode {ino} was replaced")
            live = (
                await self.stage(node, truncate=trunc)
                if writable
                else self.core.area.get(self.core.path_of(node))
            )
            if live is not None:
                tok = await self.core.opens.open(live, node.ino, writable=writable, truncate=trunc)
                st = self.core.opens.version(tok)
                if trunc:
                    st.touch()  # O_TRUNC of an existing file is a change (mtime, ctime)
                key = f"staged:{st.id}"
                keep = node.cached_version == key and not trunc
                node.cached_version = key
                handle = Handle(self.core.new_fh(), node, writable, tok)
            else:
                handle = await self._open_origin(node)
                keep = node.cached_version == handle.version
                node.cached_version = handle.version
                if node.path is not None:
                    self.core.ahead.opened(node.path)
        node.opens += 1
        self.core.handles[handle.fh] = handle
        return handle.fh, keep

    def _open_local(self, node: Node, path: str) -> tuple[int, bool] | None:
        """The fast open (answered inline: no lock, no origin call, no thread, no pin): a
        read-only open of a file not staged here whose entry is fresh and whose version is
        complete and verified in the block cache. None: take the ordinary way."""
        entry = node.entry
        if entry is None or not self.core.fresh(node) or self.core.area.get(path) is not None:
            return None
        obj = ObjectRef(path, entry.version, entry.size)
        local = self.core.readpath.local_file_now(obj)
        if local is None:
            return None
        handle = self._reader(node, obj, local=local)
        keep = node.cached_version == handle.version
        node.cached_version = handle.version
        node.opens += 1
        self.core.handles[handle.fh] = handle
        self.core.fast_opens += 1
        self.core.ahead.opened(path)
        return handle.fh, keep

    def _reader(
        self,
        node: Node,
        obj: ObjectRef,
        *,
        local: LocalFile | None = None,
        pinned: str | None = None,
    ) -> Handle:
        """A read-only handle on origin version ``obj.version``: its bytes in the cache file
        ``local`` (no pin), or read through the read path with the origin holding the version
        at ``pinned`` (None: the origin cannot pin)."""
        return Handle(
            self.core.new_fh(),
            node,
            False,
            None,
            self.core.readpath.open(obj),
            obj.version,
            pinned,
            local=local,
        )

    async def _open_origin(self, node: Node) -> Handle:
        path = self.core.path_of(node)
        for _attempt in range(3):
            entry = await self.core.refresh(node)
            if entry is None:
                raise err(errno.ENOENT, f"{path}: no such file")
            obj = ObjectRef(path, entry.version, entry.size)
            local = self.core.readpath.local_file_now(obj)
            if local is None and 0 < obj.size <= VERIFY_AT_OPEN_MAX:
                # its block map not loaded yet (the first open after a restart) or never
                # verified: one job instead of a pin now and the same job for passthrough
                local = await self.core.readpath.local_file(obj)
            if local is not None:  # every byte is local: no pin
                return self._reader(node, obj, local=local)
            if self.core.pin is None:
                return self._reader(node, obj)
            try:
                await self.core.origin.call(
                    self.core.pin, path, entry.version, what=f"open {path}", op="pin"
                )
            except Conflict:
                # changed within the TTL (or the listing we answered from is older than a
                # change): ask the origin itself, not a listing
                fresh = await self.core.stat(path)
                if fresh is None:
                    raise err(errno.ENOENT, f"{path}: no such file") from None
                node.entry, node.fetched = fresh, time.monotonic()
                self.core.listings.record(path, fresh)
                continue
            return self._reader(node, obj, pinned=path)
        raise err(errno.EIO, f"{path}: keeps changing at the origin")

    @counted
    async def create(self, parent_ino: int, name: str, mode: int, flags: int) -> tuple[int, Attr]:
        """Create and open a new file (staged only until its first commit). A file created
        with ``O_RDONLY`` (lock files) is committed like any other once closed."""
        path = self.core.new_child(parent_ino, name)
        await self.core.check("create", path)
        existing = self.core.area.get(path)
        if existing is not None and flags & os.O_EXCL:
            raise err(errno.EEXIST, f"{path}: exists")
        writable = flags & os.O_ACCMODE != os.O_RDONLY
        uid, gid, _ = self.core.new_owner(parent_ino)
        mode = stat.S_IMODE(mode)
        caller = current_caller()
        if mode & stat.S_ISGID and not caller.is_root and not caller.in_group(gid):
            mode &= ~stat.S_ISGID  # as the kernel does for a group the creator is not in
        node = self.core.inodes.bind(path, Kind.FILE, None)
        async with node.lock:
            base = existing.base_version if existing is not None else None
            st = await self.core.area.create(path, base_version=base, mode=mode)
            st.uid, st.gid = uid, gid
            self.core.area.records.describe(st)
            if flags & os.O_EXCL and self.core.origin.capabilities.conditional_put:
                node.entry, node.fetched = await self._claim(st, path), time.monotonic()
            self.core.dir_changed(path)
            tok = await self.core.opens.open(st, node.ino, writable=writable)
            st = self.core.opens.version(tok)
        handle = Handle(self.core.new_fh(), node, writable, tok)
        node.cached_version = f"staged:{st.id}"
        node.lookups += 1
        node.opens += 1
        self.core.handles[handle.fh] = handle
        return handle.fh, self.core.staged_attr(node, st)

    async def _claim(self, st: Staged, path: str) -> Entry:
        """``O_EXCL`` across nodes: the name is taken at the origin now, empty and
        create-if-absent (EEXIST when another node or tool has it), so that two nodes never
        both believe they created it (lock files, ``mkstemp``, object_store's temporary
        files). The file's content commits over this empty version like any rewrite."""
        try:
            entry = await self.core.origin.put(
                path,
                st.file,
                "",
                mode=st.mode,
                mtime_ns=st.mtime_ns,
                uid=st.uid,
                gid=st.gid,
                fast=True,  # while the origin is down: EIO at once, not after the retries
            )
        except Conflict:
            self.core.area.discard(st)
            raise err(errno.EEXIST, f"{path}: exists") from None
        except BaseException:
            self.core.area.discard(st)
            raise
        assert st.ps is not None
        self.core.area.rebase(st.ps, entry.version)
        st.committed_gen = st.gen  # what is at the origin: nothing to commit until written
        self.core.listings.record(path, entry)
        return entry

    def _handle(self, fh: int) -> Handle:
        h = self.core.handles.get(fh)
        if h is None:
            raise err(errno.EBADF, "bad file handle")
        return h

    @counted
    async def read(self, fh: int, offset: int, size: int) -> ReadBuffer:
        h = self._handle(fh)
        # the live staged content at the file's path (rewrites by other processes are seen
        # at once), else the version this handle opened (an unlinked or replaced file)
        st = self.core.area.get(h.node.path) if h.node.path is not None else None
        if st is None:
            st = self.core.opens.staged(h.opened)
        if st is not None:
            return await self.core.area.io.read(st, offset, size)
        if h.reader is None:
            raise err(errno.EIO, "no reader")
        return await h.reader.read(offset, size)

    @counted
    async def write(self, fh: int, offset: int, data: bytes) -> int:
        h = self._handle(fh)
        if not h.writable or h.opened is None:
            raise err(errno.EBADF, "file not open for writing")
        st = await self.writable(h)
        # a write allocates at most its own length (one far past the end leaves a hole)
        end = min(offset + len(data), st.size + len(data))
        await self.core.area.io.reserve(st, end, self.core.write_wait_s)
        if st.closed_version or st.uploading:
            # journaled (an fsync, a close of another descriptor) while we waited for space:
            # its bytes stay as journaled, the write goes to a new version
            st = await self.writable(h)
        return await self.core.area.io.write(st, offset, data)

    @counted
    async def flush(self, fh: int) -> None:
        """``close()`` of a file descriptor: when no other descriptor writes the file, its
        content is journaled (it survives a daemon crash from here on)."""
        h = self._handle(fh)
        if h.opened is not None:
            self.core.passthrough.sync(self.core.opens.version(h.opened))
            await self.core.opens.flush(h.opened)

    @counted
    async def release(self, fh: int) -> None:
        h = self.core.handles.pop(fh, None)
        if h is None:
            return
        self.core.passthrough.release(h)
        try:
            if h.opened is not None:
                await self.core.opens.close(h.opened)
        finally:
            if h.reader is not None:
                h.reader.close()
            if h.local is not None:
                h.local.release()
                h.local = None
            if h.pinned is not None and self.core.unpin is not None:
                self.core.unpin(h.pinned, h.version)
            h.node.opens -= 1
            if h.node.opens < 0:
                raise AssertionError(f"inode {h.node.ino}: open count went negative")
            self.core.inodes.maybe_drop(h.node)

    async def passthrough_source(self, fh: int, *, rdwr: bool = False) -> tuple[int, str] | None:
        """For a transport with FUSE passthrough, right after ``open``/``create`` returned
        ``fh``: the local file (fd, key naming its content) that may serve all of the handle's
        reads and writes in the kernel, or None to serve it here. ESTALE (after which the
        caller releases ``fh``) when the inode's other opens pass through other bytes. See
        :mod:`airfs.core.passthrough`."""
        return await self.core.passthrough.source(self._handle(fh), rdwr=rdwr)

    @counted
    async def fsync(self, fh: int) -> None:
        """Return once this file's content (and the closed versions before it) is committed
        at the origin; EIO naming the file if it cannot be, or lost a conflict."""
        h = self._handle(fh)
        st = self.core.opens.staged(h.opened)
        self.core.passthrough.sync(st)
        if st is None or st.path is None:
            return
        await self.core.area.io.quiesce(st)
        self.core.area.close_version(st, barrier=True)  # later writes go to a new version
        await self.core.commit_now(st)
