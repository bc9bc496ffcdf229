"""The request loop of the kernel transport: read /dev/fuse, drive the core, write replies.

How requests are served (no task per request that the core answers from memory):

* one *leader* task owns the device: it reads every request that is ready (non-blocking
  reads until ``EAGAIN``, then ``wait_readable``) and starts each one's handler coroutine
  inline, in its own task;
* a handler that finishes without waiting (a lookup or getattr within the TTL, a read of a
  staged file, release, forget, statfs...) has replied before the next request is looked at;
* a handler that must wait (origin I/O, staging space, locks) keeps the task it started in:
  that task becomes the request's worker and a new leader task takes over the device and the
  rest of the batch. A coroutine is never moved between tasks, so trio's per-task state
  (cancel scopes, parking lots) stays right.

Each handler unpacks the request, calls the core exactly as the pyfuse3 adapter does and
packs the reply; ``OSError`` becomes ``-errno``, anything else is logged and answered with EIO;
a malformed request gets EINVAL and never stops the loop. ``FUSE_INTERRUPT`` cancels the
interrupted request's cancel scope (it then answers EINTR). Replies go out with ``os.writev``.
"""

from __future__ import annotations

import errno
import logging
import os
import time
import types
from collections.abc import Callable, Coroutine, Generator
from typing import Any

import trio

from airfs.core.attrs import Attr
from airfs.core.fs import Filesystem

from . import proto
from .negotiate import InitError, InitIn, Negotiated, negotiate, read_buffer_size
from .passthrough import close_backing, open_backing
from .proto import BadRequest, Op, Request

log = logging.getLogger(__name__)

Payload = bytes | list[bytes]
#: returned by handlers of requests that take no reply (FORGET, BATCH_FORGET)
NO_REPLY: Any = object()
#: most requests taken from the device before the batch is served
BATCH = 64


class Unmounted(Exception):
    """The device reported that the file system is gone (ENODEV)."""


@types.coroutine
def _resume(coro: Coroutine[Any, Any, None], first: Any) -> Generator[Any, Any, None]:
    """Continue ``coro`` (which yielded ``first`` to trio in this same task) to its end,
    passing trio's answers in and its traps out."""
    yielded = first
    while True:
        try:
            sent = yield yielded
        except BaseException as exc:  # cancellation and the like go to the coroutine
            try:
                yielded = coro.throw(exc)
            except StopIteration:
                return
        else:
            try:
                yielded = coro.send(sent)
            except StopIteration:
                return


class Session:
    """Serve one mounted file system from ``fd`` (an open /dev/fuse, set non-blocking here).

    ``ttl`` is the entry/attribute timeout given to the kernel (and the negative-entry timeout
    when ``negative_ttl`` is None). ``on_init`` runs once the INIT reply is written.
    :meth:`run` returns when the file system is unmounted (or DESTROY arrives) or is cancelled.
    """

    def __init__(
        self,
        fd: int,
        fs: Filesystem,
        ttl: float,
        *,
        on_init: Callable[[Negotiated], None] | None = None,
        pages_limit: int = 256,
        passthrough: bool = False,
        negative_ttl: float | None = None,
    ) -> None:
        self.fd = fd
        self.fs = fs
        self.ttl = ttl
        self.negative_ttl = ttl if negative_ttl is None else negative_ttl
        self.on_init = on_init
        self.pages_limit = pages_limit
        self.passthrough = passthrough and hasattr(fs, "passthrough_fd")
        self.negotiated: Negotiated | None = None
        self.minor = proto.KERNEL_MINOR
        self._buf = bytearray(read_buffer_size(pages_limit))
        self._view = memoryview(self._buf)
        self._scopes: dict[int, trio.CancelScope] = {}
        self._done = trio.Event()
        self._nursery: trio.Nursery | None = None
        self.counts = {
            "requests": 0,
            "inline": 0,
            "tasks": 0,
            "interrupts": 0,
            "errors": 0,
            "passthrough_opens": 0,
        }
        #: backing ids of passthrough opens, by file handle (closed at RELEASE)
        self._backing_ids: dict[int, int] = {}
        #: the core's "local backing file" query, when it has one (see :meth:`_backing`)
        self._passthrough_fd: Callable[[int], int | None] | None = getattr(
            fs, "passthrough_fd", None
        )
        self._handlers: dict[int, Callable[[Request], Coroutine[Any, Any, Any]]] = {
            Op.LOOKUP: self._lookup,
            Op.GETATTR: self._getattr,
            Op.SETATTR: self._setattr,
            Op.READLINK: self._readlink,
            Op.SYMLINK: self._symlink,
            Op.MKNOD: self._eperm,
            Op.LINK: self._eperm,
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

    # -- the loop ------------------------------------------------------------------------------

    def statistics(self) -> dict[str, Any]:
        neg = self.negotiated.as_dict() if self.negotiated is not None else {"transport": "kernel"}
        return {**neg, **self.counts}

    async def run(self) -> None:
        os.set_blocking(self.fd, False)
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._lead, [])
                await self._done.wait()
                nursery.cancel_scope.cancel()
        finally:
            self._nursery = None

    def stop(self) -> None:
        """Stop serving (outstanding requests are cancelled; the caller unmounts)."""
        self._done.set()

    def _read_ready(self) -> list[bytes]:
        batch: list[bytes] = []
        while len(batch) < BATCH:
            try:
                n = os.readv(self.fd, [self._buf])
            except BlockingIOError:
                break
            except InterruptedError:
                continue
            except OSError as exc:
                if exc.errno == errno.ENOENT:  # interrupted before we read it
                    continue
                if exc.errno == errno.ENODEV:
                    raise Unmounted from None
                raise
            if n == 0:  # end of file: only a socket stands in for /dev/fuse like that
                raise Unmounted
            batch.append(bytes(self._view[:n]))
        return batch

    async def _lead(self, backlog: list[bytes]) -> None:
        """Own the device: read batches and serve them, until a request must wait (then
        hand the device to a new leader and finish that request here)."""
        batch = backlog
        while True:
            if not batch:
                try:
                    batch = self._read_ready()
                except Unmounted:
                    log.info("file system unmounted")
                    self._done.set()
                    return
                if not batch:
                    await trio.lowlevel.wait_readable(self.fd)
                    continue
            for i, raw in enumerate(batch):
                self.counts["requests"] += 1
                coro = self._serve(raw)
                try:
                    first = coro.send(None)
                except StopIteration:
                    self.counts["inline"] += 1
                    continue
                self.counts["tasks"] += 1
                assert self._nursery is not None
                self._nursery.start_soon(self._lead, batch[i + 1 :])
                await _resume(coro, first)
                return
            batch = []
            await trio.lowlevel.checkpoint()

    async def _serve(self, raw: bytes) -> None:
        """Serve one request to its reply; never raises (except cancellation of the session)."""
        try:
            req = proto.decode_request(raw)
        except BadRequest as exc:
            self.counts["errors"] += 1
            log.warning("dropping a garbled request: %s", exc)
            if len(raw) >= 16:
                unique = int.from_bytes(raw[8:16], "little")
                self._reply_error(unique, errno.EINVAL)
            return
        op = req.opcode
        if op == Op.INTERRUPT:
            self._interrupt(req)
            return
        if op == Op.INIT:
            self._init(req)
            return
        if op == Op.DESTROY:
            self._reply(req.unique, b"")
            self._done.set()
            return
        handler = self._handlers.get(op)
        if handler is None:
            self._reply_error(req.unique, errno.ENOSYS)
            return
        with trio.CancelScope() as scope:
            self._scopes[req.unique] = scope
            try:
                payload = await handler(req)
            except OSError as exc:
                code = exc.errno or errno.EIO
                if code in (errno.EIO, errno.ENOSPC):
                    log.error("%s: %s", _opname(op), exc)
                else:
                    log.debug("%s: %s", _opname(op), exc)
                self._reply_error(req.unique, code)
                return
            except BadRequest as exc:
                self.counts["errors"] += 1
                log.warning("%s: malformed request: %s", _opname(op), exc)
                self._reply_error(req.unique, errno.EINVAL)
                return
            except Exception:
                log.exception("%s failed", _opname(op))
                self._reply_error(req.unique, errno.EIO)
                return
            finally:
                self._scopes.pop(req.unique, None)
            if payload is not NO_REPLY:
                self._reply(req.unique, payload)
            return
        # only reached when the scope was cancelled by FUSE_INTERRUPT
        self._reply_error(req.unique, errno.EINTR)

    def _interrupt(self, req: Request) -> None:
        (target,) = proto.unpack(proto.INTERRUPT_IN, req.body, "INTERRUPT")
        scope = self._scopes.get(target)
        if scope is not None:
            self.counts["interrupts"] += 1
            scope.cancel()
        # else: already answered (requests are started in the order they were read)

    def _init(self, req: Request) -> None:
        try:
            init = InitIn.decode(req.body)
            reply, neg = negotiate(init, pages_limit=self.pages_limit, passthrough=self.passthrough)
        except InitError as exc:
            log.error("INIT: %s", exc)
            self._reply_error(req.unique, exc.errno)
            self._done.set()
            return
        except BadRequest as exc:
            log.error("INIT: %s", exc)
            self._reply_error(req.unique, errno.EINVAL)
            return
        self.minor = int(neg.protocol.split(".")[1])
        self.negotiated = neg
        self._reply(req.unique, reply)
        log.info(
            "FUSE %s negotiated (kernel offers 7.%d): max_write %d, max_pages %d, "
            "max_background %d, passthrough %s, flags %s",
            neg.protocol,
            init.minor,
            neg.max_write,
            neg.max_pages,
            neg.max_background,
            neg.passthrough,
            " ".join(neg.flags),
        )
        if self.on_init is not None:
            self.on_init(neg)

    # -- replies -------------------------------------------------------------------------------

    def _reply(self, unique: int, payload: Payload) -> None:
        if isinstance(payload, list):
            # one buffer when the parts are many (writev takes at most IOV_MAX of them)
            parts = payload if len(payload) <= 8 else [b"".join(payload)]
        else:
            parts = [payload]
        size = sum(len(p) for p in parts)
        if not self._send([proto.out_header(unique, 0, size), *parts]):
            # the kernel refused the reply (e.g. larger than asked): the caller gets EIO
            # rather than waiting forever
            self._send([proto.out_header(unique, -errno.EIO, 0)])

    def _reply_error(self, unique: int, code: int) -> None:
        self._send([proto.out_header(unique, -code, 0)])

    def _send(self, parts: list[Any]) -> bool:
        """Write one reply; False when the kernel refused it as malformed."""
        try:
            os.writev(self.fd, parts)
        except OSError as exc:
            # ENOENT: the request was interrupted and is gone; ENODEV: unmounted
            if exc.errno in (errno.ENOENT, errno.ENODEV):
                return True
            log.error("writing a reply to /dev/fuse: %s", exc)
            return False
        return True

    def notify(self, code: int, payload: bytes) -> bool:
        """Send a notification (``unique`` 0); False if the kernel refused it."""
        try:
            os.writev(self.fd, [proto.out_header(0, code, len(payload)), payload])
        except OSError as exc:
            log.debug("notification %d: %s", code, exc)
            return False
        return True

    def inval_inode(self, ino: int) -> bool:
        """Drop the kernel's cached pages and attributes of ``ino``."""
        return self.notify(proto.NOTIFY_INVAL_INODE_CODE, proto.inval_inode(ino))

    def inval_entry(self, parent: int, name: str) -> bool:
        """Drop the kernel's cached dentry ``name`` in ``parent``."""
        payload = proto.inval_entry(parent, os.fsencode(name))
        return self.notify(proto.NOTIFY_INVAL_ENTRY_CODE, payload)

    def _entry(self, a: Attr) -> bytes:
        return proto.entry_out(a, self.ttl, self.ttl)

    # -- handlers (unpack, call the core, pack) ------------------------------------------------

    async def _lookup(self, req: Request) -> Payload:
        nm = proto.name(req.body)
        try:
            return self._entry(await self.fs.lookup(req.nodeid, nm))
        except OSError as exc:
            if exc.errno == errno.ENOENT and self.negative_ttl > 0:
                return proto.negative_entry(self.negative_ttl)
            raise

    async def _forget(self, req: Request) -> Any:
        (n,) = proto.unpack(proto.FORGET_IN, req.body, "FORGET")
        self.fs.forget([(req.nodeid, n)])
        return NO_REPLY

    async def _batch_forget(self, req: Request) -> Any:
        count, _ = proto.unpack(proto.BATCH_FORGET_IN, req.body, "BATCH_FORGET")
        body = req.body
        off = proto.BATCH_FORGET_IN.size
        count = min(count, (len(body) - off) // proto.FORGET_ONE.size)
        items = [proto.FORGET_ONE.unpack_from(body, off + i * 16) for i in range(count)]
        self.fs.forget(items)
        return NO_REPLY

    async def _getattr(self, req: Request) -> Payload:
        return proto.attr_out(await self.fs.getattr(req.nodeid), self.ttl)

    async def _setattr(self, req: Request) -> Payload:
        f = proto.unpack(proto.SETATTR_IN, req.body, "SETATTR")
        valid, fh, size, mtime, mtimensec, mode = f[0], f[2], f[3], f[6], f[9], f[11]
        mtime_ns: int | None = None
        if valid & proto.FATTR_MTIME_NOW:
            mtime_ns = time.time_ns()
        elif valid & proto.FATTR_MTIME:
            mtime_ns = mtime * 1_000_000_000 + mtimensec
        a = await self.fs.setattr(
            req.nodeid,
            size=size if valid & proto.FATTR_SIZE else None,
            mode=mode if valid & proto.FATTR_MODE else None,
            mtime_ns=mtime_ns,
            fh=fh if valid & proto.FATTR_FH else None,
        )
        return proto.attr_out(a, self.ttl)

    async def _readlink(self, req: Request) -> Payload:
        return os.fsencode(await self.fs.readlink(req.nodeid))

    async def _symlink(self, req: Request) -> Payload:
        nm, target = proto.names(req.body, 2)
        return self._entry(await self.fs.symlink(req.nodeid, nm, target))

    async def _eperm(self, req: Request) -> Payload:
        raise OSError(errno.EPERM, "hard links, device nodes, FIFOs and sockets are not supported")

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
        backing = self._backing(fh)
        if backing is None:
            return proto.open_out(fh, out)
        # passthrough: not with KEEP_CACHE (the kernel serves the backing file's pages)
        out = (out & ~proto.FOPEN_KEEP_CACHE) | proto.FOPEN_PASSTHROUGH
        # the opener looks the id up after our reply: it stays registered until RELEASE
        self._backing_ids[fh] = backing
        self.counts["passthrough_opens"] += 1
        return proto.open_out(fh, out, backing)

    def _backing(self, fh: int) -> int | None:
        """A backing id for handle ``fh`` when passthrough was negotiated and the core names a
        local file holding all of the handle's bytes; None to serve it through the daemon."""
        if self._passthrough_fd is None or self.negotiated is None:
            return None
        if not self.negotiated.passthrough:
            return None
        fd = self._passthrough_fd(fh)
        if fd is None:
            return None
        try:
            return open_backing(self.fd, fd)
        except OSError as exc:
            log.warning("passthrough refused (%s); serving through the daemon", exc)
            return None

    def _close_backing(self, backing: int) -> None:
        try:
            close_backing(self.fd, backing)
        except OSError as exc:
            log.warning("closing backing id %d: %s", backing, exc)

    async def _create(self, req: Request) -> Payload:
        flags, mode, _umask, _ = proto.unpack(proto.CREATE_IN, req.body, "CREATE")
        nm = proto.name(req.body, proto.CREATE_IN.size)
        fh, a = await self.fs.create(req.nodeid, nm, mode, flags)
        return [self._entry(a), proto.open_out(fh, 0)]

    async def _read(self, req: Request) -> Payload:
        fh, off, size, *_ = proto.unpack(proto.READ_IN, req.body, "READ")
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
        backing = self._backing_ids.pop(fh, None)
        if backing is not None:
            self._close_backing(backing)
        await self.fs.release(fh)
        return b""

    async def _fsync(self, req: Request) -> Payload:
        (fh, *_) = proto.unpack(proto.FSYNC_IN, req.body, "FSYNC")
        await self.fs.fsync(fh)
        return b""

    async def _ok(self, req: Request) -> Payload:
        return b""

    async def _opendir(self, req: Request) -> Payload:
        return proto.open_out(await self.fs.opendir(req.nodeid), 0)

    async def _readdir(self, req: Request) -> Payload:
        fh, off, size, *_ = proto.unpack(proto.READ_IN, req.body, "READDIR")
        plus = req.opcode == Op.READDIRPLUS
        parts: list[bytes] = []
        used = 0

        def emit(nm: str, attr: Attr, next_id: int) -> bool:
            nonlocal used
            b = os.fsencode(nm)
            rec = (
                proto.direntplus(attr, next_id, b, self.ttl)
                if plus
                else proto.dirent(attr.ino, next_id, b, attr.mode)
            )
            if used + len(rec) > size:
                return False
            parts.append(rec)
            used += len(rec)
            return True

        await self.fs.readdir(fh, off, emit)
        return parts

    async def _releasedir(self, req: Request) -> Payload:
        (fh, *_) = proto.unpack(proto.RELEASE_IN, req.body, "RELEASEDIR")
        self.fs.releasedir(fh)
        return b""

    async def _statfs(self, req: Request) -> Payload:
        s = await self.fs.statfs()
        return proto.statfs_out(
            bsize=s.block_size,
            blocks=s.total_blocks,
            bfree=s.free_blocks,
            bavail=s.free_blocks,
            files=s.total_files,
            ffree=s.free_files,
            namelen=255,
        )

    async def _getxattr(self, req: Request) -> Payload:
        raise OSError(errno.ENODATA, "no extended attributes")

    async def _listxattr(self, req: Request) -> Payload:
        size, _ = proto.unpack(proto.GETXATTR_IN, req.body, "LISTXATTR")
        return proto.GETXATTR_OUT.pack(0, 0) if size == 0 else b""


def _opname(op: int) -> str:
    try:
        return Op(op).name.lower()
    except ValueError:
        return f"opcode {op}"
