"""The FUSE adapter: ``pyfuse3.Operations`` over :class:`airfs.core.fs.Filesystem`.

Each method unpacks the kernel's arguments, calls the core and packs the reply. Every
``OSError`` becomes ``FUSEError(errno)``; anything else is logged and answered with EIO. No
state and no logic live here.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, ParamSpec, TypeVar

import pyfuse3

from airfs.core.attrs import Attr
from airfs.core.context import Caller, as_caller
from airfs.core.fs import Filesystem
from airfs.fuse.policy import attr_timeout, entry_timeout, failure_errno, statvfs

log = logging.getLogger(__name__)

P = ParamSpec("P")
R = TypeVar("R")


def replies(fn: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
    """Map core errors to ``FUSEError``; serve the request as its caller (``ctx``, pyfuse3's
    ``RequestContext``, is the last argument of the requests that carry one)."""

    @functools.wraps(fn)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        ctx = kwargs.get("ctx", args[-1] if args else None)
        if isinstance(ctx, pyfuse3.RequestContext):
            as_caller(Caller(ctx.uid, ctx.gid, ctx.pid))
        try:
            return await fn(*args, **kwargs)
        except pyfuse3.FUSEError:
            raise
        except Exception as exc:
            raise pyfuse3.FUSEError(failure_errno(log, fn.__name__, exc)) from None

    return wrapper


class FuseOps(pyfuse3.Operations):
    """pyfuse3 entry points. ``ttl`` is the kernel's entry and attribute timeout."""

    enable_writeback_cache = False
    supports_dot_lookup = False

    def __init__(
        self, fs: Filesystem, ttl: float, on_init: Callable[[], None] | None = None
    ) -> None:
        super().__init__()
        self.fs = fs
        self.ttl = ttl
        self.on_init = on_init

    def init(self) -> None:
        """The kernel's INIT is being answered (tunables it resets, like the readahead, can
        be set once the reply is out)."""
        if self.on_init is not None:
            self.on_init()

    def _entry(self, a: Attr) -> pyfuse3.EntryAttributes:
        e = pyfuse3.EntryAttributes()
        e.st_ino = a.ino  # type: ignore[assignment]
        e.generation = 0
        e.entry_timeout = entry_timeout(self.fs, a, self.ttl)
        e.attr_timeout = attr_timeout(a, self.ttl)
        e.st_mode = a.mode  # type: ignore[assignment]
        e.st_nlink = a.nlink
        e.st_uid = a.uid
        e.st_gid = a.gid
        e.st_rdev = a.rdev
        e.st_size = a.size
        e.st_blksize = a.blksize
        e.st_blocks = a.blocks
        e.st_atime_ns = a.atime_ns
        e.st_mtime_ns = a.mtime_ns
        e.st_ctime_ns = a.ctime_ns
        return e

    @replies
    async def lookup(self, parent_inode: int, name: bytes, ctx: Any = None) -> Any:
        return self._entry(await self.fs.lookup(parent_inode, os.fsdecode(name)))

    async def forget(self, inode_list: Sequence[tuple[int, int]]) -> None:
        self.fs.forget(list(inode_list))

    @replies
    async def getattr(self, inode: int, ctx: Any = None) -> Any:
        return self._entry(await self.fs.getattr(inode))

    @replies
    async def setattr(self, inode: int, attr: Any, fields: Any, fh: int | None, ctx: Any) -> Any:
        a = await self.fs.setattr(
            inode,
            size=attr.st_size if fields.update_size else None,
            mode=attr.st_mode if fields.update_mode else None,
            mtime_ns=attr.st_mtime_ns if fields.update_mtime else None,
            fh=fh,
            uid=attr.st_uid if fields.update_uid else None,
            gid=attr.st_gid if fields.update_gid else None,
            atime_ns=attr.st_atime_ns if fields.update_atime else None,
        )
        return self._entry(a)

    @replies
    async def readlink(self, inode: int, ctx: Any) -> Any:
        return os.fsencode(await self.fs.readlink(inode))

    @replies
    async def mkdir(self, parent_inode: int, name: bytes, mode: int, ctx: Any) -> Any:
        return self._entry(await self.fs.mkdir(parent_inode, os.fsdecode(name), mode))

    @replies
    async def unlink(self, parent_inode: int, name: bytes, ctx: Any) -> None:
        await self.fs.unlink(parent_inode, os.fsdecode(name))

    @replies
    async def rmdir(self, parent_inode: int, name: bytes, ctx: Any) -> None:
        await self.fs.rmdir(parent_inode, os.fsdecode(name))

    @replies
    async def symlink(self, parent_inode: int, name: bytes, target: bytes, ctx: Any) -> Any:
        a = await self.fs.symlink(parent_inode, os.fsdecode(name), os.fsdecode(target))
        return self._entry(a)

    @replies
    async def rename(
        self,
        parent_inode_old: int,
        name_old: bytes,
        parent_inode_new: int,
        name_new: bytes,
        flags: int,
        ctx: Any,
    ) -> None:
        await self.fs.rename(
            parent_inode_old,
            os.fsdecode(name_old),
            parent_inode_new,
            os.fsdecode(name_new),
            noreplace=bool(flags & pyfuse3.RENAME_NOREPLACE),
            exchange=bool(flags & pyfuse3.RENAME_EXCHANGE),
        )

    @replies
    async def link(self, inode: int, new_parent_inode: int, new_name: bytes, ctx: Any) -> Any:
        return self._entry(await self.fs.link(inode, new_parent_inode, os.fsdecode(new_name)))

    @replies
    async def mknod(self, parent_inode: int, name: bytes, mode: int, rdev: int, ctx: Any) -> Any:
        return self._entry(await self.fs.mknod(parent_inode, os.fsdecode(name), mode, rdev))

    @replies
    async def open(self, inode: int, flags: int, ctx: Any) -> Any:
        fh, keep = await self.fs.open(inode, flags)
        return pyfuse3.FileInfo(fh=fh, keep_cache=keep)  # type: ignore[arg-type]

    @replies
    async def create(self, parent_inode: int, name: bytes, mode: int, flags: int, ctx: Any) -> Any:
        fh, a = await self.fs.create(parent_inode, os.fsdecode(name), mode, flags)
        return pyfuse3.FileInfo(fh=fh, keep_cache=False), self._entry(a)  # type: ignore[arg-type]

    @replies
    async def read(self, fh: int, off: int, size: int) -> bytes:
        data = await self.fs.read(fh, off, size)
        # libfuse's reply takes bytes: a view of a fetched part is copied here (the kernel
        # transport writes it as it is)
        return data if isinstance(data, bytes) else bytes(data)

    @replies
    async def write(self, fh: int, off: int, buf: bytes) -> int:
        return await self.fs.write(fh, off, buf)

    @replies
    async def flush(self, fh: int) -> None:
        await self.fs.flush(fh)

    @replies
    async def release(self, fh: int) -> None:
        await self.fs.release(fh)

    @replies
    async def fsync(self, fh: int, datasync: bool) -> None:
        await self.fs.fsync(fh)

    @replies
    async def opendir(self, inode: int, ctx: Any) -> Any:
        return await self.fs.opendir(inode)

    @replies
    async def readdir(self, fh: int, start_id: int, token: Any) -> None:
        def emit(name: str, attr: Attr, next_id: int, known: bool) -> bool:
            # libfuse's readdirplus answers every name with its entry (node id = d_ino): this
            # adapter leaves ``Core.bare_entries`` off, so every name comes known
            assert known, "a name without attributes for the pyfuse3 adapter"
            return pyfuse3.readdir_reply(token, os.fsencode(name), self._entry(attr), next_id)

        await self.fs.readdir(fh, start_id, emit)

    async def releasedir(self, fh: int) -> None:
        self.fs.releasedir(fh)

    async def fsyncdir(self, fh: int, datasync: bool) -> None:
        return None

    @replies
    async def statfs(self, ctx: Any) -> Any:
        s = statvfs(await self.fs.statfs())
        out = pyfuse3.StatvfsData()
        out.f_bsize = s.bsize
        out.f_frsize = s.frsize
        out.f_blocks = s.blocks
        out.f_bfree = s.bfree
        out.f_bavail = s.bavail
        out.f_files = s.files
        out.f_ffree = s.ffree
        out.f_favail = s.favail
        out.f_namemax = s.namemax
        return out

    @replies
    async def getxattr(self, inode: int, name: bytes, ctx: Any) -> bytes:
        raise pyfuse3.FUSEError(pyfuse3.ENOATTR)

    @replies
    async def listxattr(self, inode: int, ctx: Any) -> Any:
        return []
