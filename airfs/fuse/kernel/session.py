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
interrupted request's cancel scope (it then answers EINTR) only when its caller is being
killed (:mod:`.interrupts`); an interrupt by a signal the caller handles is counted and the
request answered as if none came. Replies go out with ``os.writev``: from the loop, or -- those
of at least ``THREAD_MIN`` bytes (file data) -- from the reply thread (:mod:`.replies`), so that
copying a megabyte into a reader's pages never holds the next request.
"""

from __future__ import annotations

import errno
import logging
import os
import types
from collections.abc import Callable, Coroutine, Generator
from dataclasses import dataclass
from typing import Any

import trio

from airfs.core.context import Caller, as_caller
from airfs.core.fs import Filesystem
from airfs.core.passthrough import PassthroughStats
from airfs.fuse.policy import failure_errno

from . import proto
from .dropbehind import DropStats
from .handlers import NO_REPLY, Handler, Handlers, Payload
from .interrupts import caller_dying
from .negotiate import InitError, InitIn, Negotiated, negotiate, read_buffer_size
from .notify import Notifier
from .passthrough import BackingIds
from .proto import BadRequest, Op, Request
from .replies import THREAD_MIN, ReplyWriter
from .takeover import COMPACT_BYTES, StateLog

log = logging.getLogger(__name__)

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


@dataclass(frozen=True, slots=True)
class SessionStats:
    """``Session.statistics()``: what INIT negotiated (None before it), the requests read
    from the device (answered inline, or in a task of their own because they waited),
    given up because their caller was being killed (``interrupts``) or interrupted by a
    signal the caller handles and answered normally (``interrupts_ignored``), answered with
    an error for a malformed request or an unexpected failure;
    directory opens that let the kernel keep its cached listing; the core's passthrough
    record; the backing files registered with the kernel now; the page cache dropped behind
    readers (:mod:`.dropbehind`)."""

    negotiated: Negotiated | None
    requests: int
    inline: int
    tasks: int
    interrupts: int
    errors: int
    dir_cache_kept: int
    passthrough: PassthroughStats
    backing_files: int
    interrupts_ignored: int = 0
    #: the page cache dropped behind readers (None: drop-behind is off)
    drop: DropStats | None = None
    #: replies written by the reply thread (:mod:`.replies`), and of those refused (EIO)
    thread_replies: int = 0
    thread_refused: int = 0

    @classmethod
    def before_mount(cls, passthrough: PassthroughStats) -> SessionStats:
        """The record of a transport that has no session yet (nothing served)."""
        return cls(None, 0, 0, 0, 0, 0, 0, passthrough, 0)

    def to_dict(self) -> dict[str, Any]:
        """Flat, as ``airfs status --json`` shows it under ``fuse`` (the negotiated
        parameters, the counters, the passthrough record's fields)."""
        neg = self.negotiated.to_dict() if self.negotiated is not None else {"transport": "kernel"}
        return {
            **neg,
            "requests": self.requests,
            "inline": self.inline,
            "tasks": self.tasks,
            "interrupts": self.interrupts,
            "interrupts_ignored": self.interrupts_ignored,
            "errors": self.errors,
            **self.passthrough.to_dict(),
            "dir_cache_kept": self.dir_cache_kept,
            "backing_files": self.backing_files,
            "drop_behind": self.drop is not None,
            "dropped_behind_bytes": self.drop.dropped_bytes if self.drop is not None else 0,
            "thread_replies": self.thread_replies,
            "thread_refused": self.thread_refused,
        }


class Session:
    """Serve one mounted file system from ``fd`` (an open /dev/fuse, set non-blocking here).

    ``ttl`` is the entry/attribute timeout given to the kernel (and the negative-entry timeout
    when ``negative_ttl`` is None). ``on_init`` runs once the INIT reply is written.
    :meth:`run` returns when the file system is unmounted (or DESTROY arrives) or is cancelled.

    The session owns the device and the loop; the request handlers (:class:`.Handlers`) are
    made at INIT, complete with what it settled (protocol minor, passthrough). Before INIT
    every other request is answered ENOSYS (the kernel sends none).
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
        dying: Callable[[int], bool] = caller_dying,
        state: StateLog | None = None,
        drop_behind: bool = False,
    ) -> None:
        self.fd = fd
        #: drop the page cache behind sequential readers (with passthrough: :class:`.Handlers`)
        self.drop_behind = drop_behind
        self.dying = dying
        #: what the kernel holds, recorded for a daemon taking over (None: not recorded)
        self.state = state
        self._retiring = False
        self.fs = fs
        self.ttl = ttl
        self.negative_ttl = ttl if negative_ttl is None else negative_ttl
        self.on_init = on_init
        self.pages_limit = pages_limit
        self.passthrough = passthrough
        self.negotiated: Negotiated | None = None
        self._buf = bytearray(read_buffer_size(pages_limit))
        self._view = memoryview(self._buf)
        #: the cancel scope and the caller's thread id of each request being served
        self._scopes: dict[int, tuple[trio.CancelScope, int]] = {}
        self._done = trio.Event()
        self._nursery: trio.Nursery | None = None
        self.requests = self.inline = self.tasks = self.interrupts = self.errors = 0
        self.interrupts_ignored = 0
        #: made at INIT (:meth:`_init`)
        self.handlers: Handlers | None = None
        self._handlers: dict[int, Handler] = {}
        #: writes the core's invalidations (made with the handlers)
        self.notifier: Notifier | None = None
        #: writes the big replies while :meth:`run` runs (and what earlier ones wrote)
        self._writer: ReplyWriter | None = None
        self._thread_replies = self._thread_refused = 0

    # -- the loop ------------------------------------------------------------------------------

    def statistics(self) -> SessionStats:
        h = self.handlers
        return SessionStats(
            negotiated=self.negotiated,
            requests=self.requests,
            inline=self.inline,
            tasks=self.tasks,
            interrupts=self.interrupts,
            errors=self.errors,
            dir_cache_kept=h.dir_cache_kept if h is not None else 0,
            passthrough=self.fs.passthrough.statistics(),
            backing_files=len(h.backing) if h is not None and h.backing is not None else 0,
            interrupts_ignored=self.interrupts_ignored,
            drop=h.drop.statistics() if h is not None and h.drop is not None else None,
            thread_replies=self._thread_replies + (w.written if (w := self._writer) else 0),
            thread_refused=self._thread_refused + (w.refused if w else 0),
        )

    async def run(self) -> None:
        os.set_blocking(self.fd, False)
        self._writer = ReplyWriter(self.fd)
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._lead, [])
                await self._done.wait()
                nursery.cancel_scope.cancel()
        finally:
            self._nursery = None
            self._detach()
            writer, self._writer = self._writer, None
            writer.close()  # what is queued is written first
            self._thread_replies += writer.written
            self._thread_refused += writer.refused

    def _detach(self) -> None:
        """The core stops giving leases; the notifier thread ends."""
        if self.notifier is not None:
            self.fs.kernel.attach(None)
            self.notifier.close()
            self.notifier = None

    def stop(self) -> None:
        """Stop serving (outstanding requests are cancelled; the caller unmounts)."""
        self._done.set()

    def adopt(self, neg: Negotiated) -> None:
        """Serve a connection another daemon negotiated (INIT is sent once per connection:
        this session never sees it) with what it negotiated."""
        self.negotiated = neg
        self._make_handlers(neg)
        # the kernel may keep names on the previous daemon's leases, which this one does
        # not check: it drops them (from the notifier's thread), and asks again
        dropped = self.fs.kernel.took_over()
        log.info("take-over: %d name(s) the kernel holds dropped from its cache", dropped)

    def resend(self) -> bool:
        """Ask the kernel to send again the requests a previous daemon read and never
        answered (``FUSE_NOTIFY_RESEND``, 7.40); False if the kernel refused."""
        return self.notify(proto.NOTIFY_RESEND_CODE, b"")

    async def retire(self, grace: float) -> int:
        """Stop reading requests and wait (at most ``grace`` seconds) for those being served
        to be answered; returns how many were left unanswered (the next daemon asks the
        kernel to send them again). The state log is written out."""
        self._retiring = True
        self._detach()
        with trio.move_on_after(grace):
            while self._scopes:
                await trio.sleep(0.005)
        if self._writer is not None:  # the replies given are written before the hand-over
            await trio.to_thread.run_sync(self._writer.drain)
        if self.state is not None:
            self.state.flush()
        return len(self._scopes)

    def _make_handlers(self, neg: Negotiated) -> None:
        self.handlers = Handlers(
            self.fs,
            ttl=self.ttl,
            negative_ttl=self.negative_ttl,
            minor=int(neg.protocol.split(".")[1]),
            backing=BackingIds(self.fd) if self.passthrough and neg.passthrough else None,
            state=self.state,
            drop_behind=self.drop_behind,
        )
        self._handlers = self.handlers.table()
        if self.notifier is None:
            self.notifier = Notifier(self.notify, expire_only="HAS_EXPIRE_ONLY" in neg.offered)
            self.fs.kernel.attach(self.notifier)
        self.handlers.notifier = self.notifier

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
            if self._retiring:
                await trio.sleep_forever()
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
                self.requests += 1
                coro = self._serve(raw)
                try:
                    first = coro.send(None)
                except StopIteration:
                    self.inline += 1
                    continue
                self.tasks += 1
                assert self._nursery is not None
                self._nursery.start_soon(self._lead, batch[i + 1 :])
                await _resume(coro, first)
                return
            batch = []
            st = self.state
            if st is not None and st.size > COMPACT_BYTES:
                st.compact((n.ino, n.path, n.kind, n.lookups) for n in self.fs.inodes.nodes())
            await trio.lowlevel.checkpoint()

    async def _serve(self, raw: bytes) -> None:
        """Serve one request to its reply; never raises (except cancellation of the session)."""
        try:
            req = proto.decode_request(raw)
        except BadRequest as exc:
            self.errors += 1
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
        as_caller(Caller(req.uid, req.gid, req.pid))
        with trio.CancelScope() as scope:
            self._scopes[req.unique] = (scope, req.pid)
            try:
                payload = await handler(req)
            except BadRequest as exc:
                self.errors += 1
                log.warning("%s: malformed request: %s", _opname(op), exc)
                self._reply_error(req.unique, errno.EINVAL)
                return
            except Exception as exc:
                self._reply_error(req.unique, failure_errno(log, _opname(op), exc))
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
        served = self._scopes.get(target)
        if served is None:
            return  # already answered (requests are started in the order they were read)
        scope, tid = served
        if self.dying(tid):
            self.interrupts += 1
            scope.cancel()
        else:
            self.interrupts_ignored += 1

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
        self.negotiated = neg
        if self.state is not None:
            self.state.start()
            self.state.save_init(neg)
        self._make_handlers(neg)
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
        if size >= THREAD_MIN and self._writer is not None:
            if self.state is not None:
                self.state.flush()
            self._writer.put(unique, [proto.out_header(unique, 0, size), *parts])
            return
        if not self._send([proto.out_header(unique, 0, size), *parts]):
            # the kernel refused the reply (e.g. larger than asked): the caller gets EIO
            # rather than waiting forever
            self._send([proto.out_header(unique, -errno.EIO, 0)])

    def _reply_error(self, unique: int, code: int) -> None:
        self._send([proto.out_header(unique, -code, 0)])

    def _send(self, parts: list[Any]) -> bool:
        """Write one reply; False when the kernel refused it as malformed. What the state
        log buffered is written first (the kernel may depend on it once it has the reply)."""
        if self.state is not None:
            self.state.flush()
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


def _opname(op: int) -> str:
    try:
        return Op(op).name.lower()
    except ValueError:
        return f"opcode {op}"
