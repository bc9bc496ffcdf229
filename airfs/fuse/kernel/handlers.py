"""The request handlers of the kernel transport: unpack a request's arguments, call the core
exactly as the pyfuse3 adapter does, pack the reply (``OSError`` propagates to the session,
which answers ``-errno``). No file-system state lives here. What the transport must hold
because only it talks to the kernel: the backing ids of passthrough opens
(:class:`~.passthrough.BackingIds`, keyed by the core's name of the file; the core decides
which opens pass through and counts them), and the signature of the listing the kernel may
hold in each directory's page cache (what the kernel holds, not what the core holds), and
which read-only handles have their pages dropped behind their readers
(:class:`~.dropbehind.DropBehind`, where passthrough was negotiated).
"""

from __future__ import annotations

import errno
import logging
import os
import time
from collections.abc import Callable, Coroutine
from typing import Any

import trio

from airfs.core.attrs import Attr
from airfs.core.fs import Filesystem
from airfs.fuse.policy import attr_timeout, entry_timeout, statvfs

from . import proto
from .dropbehind import DropBehind
from .notify import Notifier
from .passthrough import BackingIds
from .proto import BadRequest, Op, Request
from .takeover import StateLog

log = logging.getLogger(__name__)

#: a reply: one buffer, or buffers written together (``writev``); views are never changed
Payload = bytes | memoryview | list[bytes] | list[bytes | memoryview]
#: returned by handlers of requests that take no reply (FORGET, BATCH_FORGET)
NO_REPLY: Any = object()
#: directories whose last listing signature is remembered (for FOPEN_KEEP_CACHE)
DIR_SIGNATURES_MAX = 4096


Handler = Callable[[Request], Coroutine[Any, Any, Any]]


class Handlers:
    """The handlers of one session, made once INIT settled the protocol: ``minor`` (the
    kernel's protocol minor: the size of a WRITE's header), ``backing`` (the backing ids of
    passthrough opens, on the device; None when passthrough was not negotiated); ``ttl``
    and ``negative_ttl`` are the entry/attribute and negative-entry timeouts; ``drop_behind``:
    drop the page cache behind sequential readers of read-only daemon-served handles (only
    with passthrough: then a cached file's later opens are served from the cache file, and
    the FUSE file's pages have no later use). The session sets ``notifier``."""

    def __init__(
        self,
        fs: Filesystem,
        *,
        ttl: float,
        negative_ttl: float,
        minor: int,
        backing: BackingIds | None,
        state: StateLog | None = None,
        drop_behind: bool = False,
    ) -> None:
        self.fs = fs
        fs.core.bare_entries = True  # a name can be answered without its attributes
        #: where what the kernel holds is recorded for a daemon taking over (None: nowhere)
        self.state = state
        self.ttl = ttl
        self.negative_ttl = negative_ttl
        self.minor = minor
        self.backing = backing
        #: how long the kernel may keep an inode's entry and attributes (a lease or the TTL)
        self.keep = fs.kernel.keep
        #: directory inode -> signature of the listing the kernel may hold in its cache
        self._dir_sigs: dict[int, int] = {}
        #: directory opens that let the kernel keep its cached listing
        self.dir_cache_kept = 0
        #: the page cache behind sequential readers (None: off)
        self.drop: DropBehind | None = DropBehind() if drop_behind and backing is not None else None
        #: writes the kernel notifications (set by the session once INIT settled)
        self.notifier: Notifier | None = None

    def table(self) -> dict[int, Handler]:
        """The handler of each opcode served through the core (others: see the session)."""
        return {
            Op.LOOKUP: self._lookup,
            Op.GETATTR: self._getattr,
            Op.SETATTR: self._setattr,
            Op.READLINK: self._readlink,
            Op.SYMLINK: self._symlink,
            Op.MKNOD: self._mknod,
            Op.LINK: self._link,
            Op.MKDIR: self._mkdir,
            Op.UNLINK: self._unlink,
            Op.RMDIR: self._rmdir,
            Op.RENAME: self._rename,
            Op.RENAME2: self._rename,
            Op.OPEN: self._open,
            Op.CREATE: self._create,
            Op.READ: self._read,
            Op.WRITE: self._write,
            Op.FLUSH: self._flush,
            Op.RELEASE: self._release,
            Op.FSYNC: self._fsync,
            Op.OPENDIR: self._opendir,
            Op.READDIR: self._readdir,
            Op.READDIRPLUS: self._readdir,
            Op.RELEASEDIR: self._releasedir,
            Op.FSYNCDIR: self._ok,
            Op.STATFS: self._statfs,
            Op.GETXATTR: self._getxattr,
            Op.LISTXATTR: self._listxattr,
            Op.FORGET: self._forget,
            Op.BATCH_FORGET: self._batch_forget,
        }

    def _attr_ttl(self, a: Attr) -> float:
        return attr_timeout(a, self.keep(a.ino))

    def _entry(self, a: Attr) -> bytes:
        if self.state is not None:
            self.state.looked_up(a.ino)
        keep = self.keep(a.ino)
        return proto.entry_out(a, entry_timeout(self.fs, a, keep), attr_timeout(a, keep))

    # -- handlers (unpack, call the core, pack) ------------------------------------------------

    async def _lookup(self, req: Request) -> Payload:
        nm = proto.name(req.body)
        try:
            return self._entry(await self.fs.lookup(req.nodeid, nm))
        except OSError as exc:
            if (
                exc.errno == errno.ENOENT
                and self.negative_ttl > 0
                and not self.fs.per_caller(req.nodeid, nm)
            ):  # a governed "no such name" may be "not for you": never kept for others
                return proto.negative_entry(self.negative_ttl)
            raise

    async def _forget(self, req: Request) -> Any:
        (n,) = proto.unpack(proto.FORGET_IN, req.body, "FORGET")
        self.fs.forget([(req.nodeid, n)])
        if self.state is not None:
            self.state.forgot([(req.nodeid, n)])
        return NO_REPLY

    async def _batch_forget(self, req: Request) -> Any:
        count, _ = proto.unpack(proto.BATCH_FORGET_IN, req.body, "BATCH_FORGET")
        body = req.body
        off = proto.BATCH_FORGET_IN.size
        count = min(count, (len(body) - off) // proto.FORGET_ONE.size)
        items = [proto.FORGET_ONE.unpack_from(body, off + i * 16) for i in range(count)]
        self.fs.forget(items)
        if self.state is not None:
            self.state.forgot(items)
        return NO_REPLY

    async def _getattr(self, req: Request) -> Payload:
        a = await self.fs.getattr(req.nodeid)
        return proto.attr_out(a, self._attr_ttl(a))

    async def _setattr(self, req: Request) -> Payload:
        f = proto.unpack(proto.SETATTR_IN, req.body, "SETATTR")
        valid, fh, size, atime, mtime, atimensec, mtimensec, mode, uid, gid = (
            f[0], f[2], f[3], f[5], f[6], f[8], f[9], f[11], f[13], f[14]
        )  # fmt: skip
        now = time.time_ns()
        mtime_ns: int | None = None
        if valid & proto.FATTR_MTIME_NOW:
            mtime_ns = now
        elif valid & proto.FATTR_MTIME:
            mtime_ns = mtime * 1_000_000_000 + mtimensec
        atime_ns: int | None = None
        if valid & proto.FATTR_ATIME_NOW:
            atime_ns = now
        elif valid & proto.FATTR_ATIME:
            atime_ns = atime * 1_000_000_000 + atimensec
        a = await self.fs.setattr(
            req.nodeid,
            size=size if valid & proto.FATTR_SIZE else None,
            mode=mode if valid & proto.FATTR_MODE else None,
            mtime_ns=mtime_ns,
            fh=fh if valid & proto.FATTR_FH else None,
            uid=uid if valid & proto.FATTR_UID else None,
            gid=gid if valid & proto.FATTR_GID else None,
            atime_ns=atime_ns,
        )
        return proto.attr_out(a, self._attr_ttl(a))

    async def _readlink(self, req: Request) -> Payload:
        return os.fsencode(await self.fs.readlink(req.nodeid))

    async def _symlink(self, req: Request) -> Payload:
        nm, target = proto.names(req.body, 2)
        return self._entry(await self.fs.symlink(req.nodeid, nm, target))

    async def _mknod(self, req: Request) -> Payload:
        mode, rdev, _umask, _ = proto.unpack(proto.MKNOD_IN, req.body, "MKNOD")
        nm = proto.name(req.body, proto.MKNOD_IN.size)
        return self._entry(await self.fs.mknod(req.nodeid, nm, mode, rdev))

    async def _link(self, req: Request) -> Payload:
        (old,) = proto.unpack(proto.LINK_IN, req.body, "LINK")
        nm = proto.name(req.body, proto.LINK_IN.size)
        return self._entry(await self.fs.link(old, req.nodeid, nm))

    async def _mkdir(self, req: Request) -> Payload:
        mode, _umask = proto.unpack(proto.MKDIR_IN, req.body, "MKDIR")
        nm = proto.name(req.body, proto.MKDIR_IN.size)
        return self._entry(await self.fs.mkdir(req.nodeid, nm, mode))

    async def _unlink(self, req: Request) -> Payload:
        await self.fs.unlink(req.nodeid, proto.name(req.body))
        return b""

    async def _rmdir(self, req: Request) -> Payload:
        await self.fs.rmdir(req.nodeid, proto.name(req.body))
        return b""

    async def _rename(self, req: Request) -> Payload:
        if req.opcode == Op.RENAME2:
            newdir, flags, _ = proto.unpack(proto.RENAME2_IN, req.body, "RENAME2")
            off = proto.RENAME2_IN.size
        else:
            (newdir,) = proto.unpack(proto.RENAME_IN, req.body, "RENAME")
            flags, off = 0, proto.RENAME_IN.size
        old, new = proto.names(req.body, 2, off)
        if flags & ~(proto.RENAME_NOREPLACE | proto.RENAME_EXCHANGE):
            raise OSError(errno.EINVAL, f"rename flags {flags:#x} are not supported")
        await self.fs.rename(
            req.nodeid,
            old,
            newdir,
            new,
            noreplace=bool(flags & proto.RENAME_NOREPLACE),
            exchange=bool(flags & proto.RENAME_EXCHANGE),
        )
        return b""

    async def _open(self, req: Request) -> Payload:
        flags, _ = proto.unpack(proto.OPEN_IN, req.body, "OPEN")
        fh, keep = await self.fs.open(req.nodeid, flags)
        out = proto.FOPEN_KEEP_CACHE if keep else 0
        if flags & os.O_ACCMODE == os.O_RDONLY:
            out |= proto.FOPEN_NOFLUSH  # the core's flush of a read-only handle does nothing
        backing = await self._backing(fh, flags)
        if self.state is not None:
            self.state.opened(fh, req.nodeid, flags, backing)
        if backing is None:
            if self.drop is not None and flags & os.O_ACCMODE == os.O_RDONLY:
                self.drop.track(fh)
            return proto.open_out(fh, out)
        # passthrough: not with KEEP_CACHE (the kernel serves the backing file's pages)
        out = (out & ~proto.FOPEN_KEEP_CACHE) | proto.FOPEN_PASSTHROUGH
        return proto.open_out(fh, out, backing)

    async def _backing(self, fh: int, flags: int) -> int | None:
        """The backing id for the just-opened handle ``fh`` when passthrough was negotiated
        and the core names a local file holding all of the handle's bytes; None to serve it
        through the daemon. The id is the file's (registered at the first open the core
        passes through it: the opener looks it up after our reply, so it stays registered
        until the core says no open holds it, at a RELEASE). An error of the core's query
        (ESTALE) releases ``fh`` and propagates."""
        if self.backing is None:
            return None
        try:
            rdwr = flags & os.O_ACCMODE == os.O_RDWR
            src = await self.fs.passthrough_source(fh, rdwr=rdwr)
        except BaseException:
            with trio.CancelScope(shield=True):
                await self.fs.release(fh)
            raise
        if src is None:
            return None
        fd, key = src
        try:
            return self.backing.id_for(key, fd)
        except OSError as exc:
            log.warning("passthrough refused (%s); serving through the daemon", exc)
            self.fs.passthrough.refused(fh)
            return None

    async def _create(self, req: Request) -> Payload:
        flags, mode, _umask, _ = proto.unpack(proto.CREATE_IN, req.body, "CREATE")
        nm = proto.name(req.body, proto.CREATE_IN.size)
        fh, a = await self.fs.create(req.nodeid, nm, mode, flags)
        backing = await self._backing(fh, flags)
        if self.state is not None:
            self.state.opened(fh, a.ino, flags, backing)
        if backing is None:
            return [self._entry(a), proto.open_out(fh, 0)]
        return [self._entry(a), proto.open_out(fh, proto.FOPEN_PASSTHROUGH, backing)]

    async def _read(self, req: Request) -> Payload:
        fh, off, size, *_ = proto.unpack(proto.READ_IN, req.body, "READ")
        if self.drop is not None and self.notifier is not None:
            behind = self.drop.read(fh, off, size)
            if behind is not None:
                self.notifier.pages(req.nodeid, *behind)
        return await self.fs.read(fh, off, size)

    async def _write(self, req: Request) -> Payload:
        size_in = proto.WRITE_IN.size if self.minor >= 9 else proto.FUSE_COMPAT_WRITE_IN_SIZE
        if len(req.body) < size_in:
            raise BadRequest(f"WRITE: {len(req.body)} bytes")
        fh, off, size = proto.WRITE_IN.unpack_from(req.body.ljust(proto.WRITE_IN.size, b"\0"))[:3]
        data = req.body[size_in : size_in + size]
        if len(data) != size:
            raise BadRequest(f"WRITE of {size} bytes carries {len(data)}")
        return proto.write_out(await self.fs.write(fh, off, data))

    async def _flush(self, req: Request) -> Payload:
        (fh, *_) = proto.unpack(proto.FLUSH_IN, req.body, "FLUSH")
        await self.fs.flush(fh)
        return b""

    async def _release(self, req: Request) -> Payload:
        (fh, *_) = proto.unpack(proto.RELEASE_IN, req.body, "RELEASE")
        pt = self.fs.passthrough
        key = pt.key_of(fh) if self.backing is not None else None
        if self.drop is not None:
            self.drop.forget(fh)
        try:
            await self.fs.release(fh)
        finally:
            if self.state is not None:
                self.state.released(fh)
            if key is not None and self.backing is not None and not pt.holds(key):
                self.backing.drop(key)
        return b""

    async def _fsync(self, req: Request) -> Payload:
        (fh, *_) = proto.unpack(proto.FSYNC_IN, req.body, "FSYNC")
        await self.fs.fsync(fh)
        return b""

    async def _ok(self, req: Request) -> Payload:
        return b""

    async def _opendir(self, req: Request) -> Payload:
        """Directory handles are opened with ``FOPEN_CACHE_DIR`` (the kernel keeps what it
        reads in the directory's page cache), plus ``FOPEN_KEEP_CACHE`` when the listing the
        core just took is the one the kernel cached at the previous open (same names, kinds
        and inode numbers): then ``readdir`` is answered by the kernel alone."""
        fh = await self.fs.opendir(req.nodeid)
        sig = self.fs.listing_signature(fh)
        keep = sig is not None and self._dir_sigs.get(req.nodeid) == sig
        if sig is None:
            self._dir_sigs.pop(req.nodeid, None)
        else:
            self._dir_sigs[req.nodeid] = sig
            while len(self._dir_sigs) > DIR_SIGNATURES_MAX:
                self._dir_sigs.pop(next(iter(self._dir_sigs)))
        per_caller = self.fs.dir_per_caller(fh)
        out = 0 if per_caller else proto.FOPEN_CACHE_DIR | (proto.FOPEN_KEEP_CACHE if keep else 0)
        self.dir_cache_kept += keep
        if self.state is not None:
            self.state.opened_dir(fh, req.nodeid)
        return proto.open_out(fh, out)

    async def _readdir(self, req: Request) -> Payload:
        fh, off, size, *_ = proto.unpack(proto.READ_IN, req.body, "READDIR")
        plus = req.opcode == Op.READDIRPLUS
        parts: list[bytes] = []
        used = 0
        state = self.state

        def emit(nm: str, attr: Attr, next_id: int, known: bool) -> bool:
            nonlocal used
            b = os.fsencode(nm)
            if plus and not known:
                rec = proto.direntplus_name(attr.ino, next_id, b, attr.mode)
            elif plus:
                keep = self.keep(attr.ino)
                rec = proto.direntplus(
                    attr, next_id, b, entry_timeout(self.fs, attr, keep), attr_timeout(attr, keep)
                )
            else:
                rec = proto.dirent(attr.ino, next_id, b, attr.mode)
            if used + len(rec) > size:
                return False
            parts.append(rec)
            used += len(rec)
            if plus and known and state is not None:
                state.looked_up(attr.ino)
            return True

        await self.fs.readdir(fh, off, emit)
        return parts

    async def _releasedir(self, req: Request) -> Payload:
        (fh, *_) = proto.unpack(proto.RELEASE_IN, req.body, "RELEASEDIR")
        self.fs.releasedir(fh)
        if self.state is not None:
            self.state.released_dir(fh)
        return b""

    async def _statfs(self, req: Request) -> Payload:
        s = statvfs(await self.fs.statfs())
        return proto.statfs_out(
            bsize=s.bsize,
            blocks=s.blocks,
            bfree=s.bfree,
            bavail=s.bavail,
            files=s.files,
            ffree=s.ffree,
            namelen=s.namemax,
        )

    async def _getxattr(self, req: Request) -> Payload:
        raise OSError(errno.ENODATA, "no extended attributes")

    async def _listxattr(self, req: Request) -> Payload:
        size, _ = proto.unpack(proto.GETXATTR_IN, req.body, "LISTXATTR")
        return proto.GETXATTR_OUT.pack(0, 0) if size == 0 else b""
