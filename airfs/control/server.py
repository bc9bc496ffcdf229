"""The daemon side of the control socket (framing and location in
:mod:`airfs.control.protocol`, the rules in :mod:`airfs.control.auth`).

Each connection carries one request. Before anything is read, the caller's credentials are
taken from the socket (``SO_PEERCRED``) and its uid's connection count is checked; a caller
that does not send its request line within ``idle_timeout`` is dropped. Every refusal is
answered with EACCES/EPERM (EAGAIN for too many connections) and a one-line reason, logged,
and counted in ``status`` under ``control``.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import logging
import os
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import Any, Protocol

import trio

from airfs.core.attrs import Owner

from .auth import (
    ConnectionLimit,
    Denials,
    Denied,
    Lookup,
    Peer,
    R,
    W,
    check_path,
    normalize,
    peer_caller,
    redact,
)
from .protocol import MAX_LINE, BadMessage, decode, encode, prepare_dir, remove_dead_sockets

log = logging.getLogger(__name__)

Progress = Callable[[dict[str, Any]], None]


#: how long a refused connection's unread bytes are read and dropped before it is closed
LINGER_S = 2.0
#: refused connections lingering at once at most (past it one is closed at once: its reply
#: may be lost to a reset, but a flood of connections over the limit holds nothing more)
MAX_LINGERING = 64


async def _linger(stream: trio.SocketStream) -> None:
    """Close a refused connection without losing the refusal's reply: end the reply with a
    write shutdown, then read and drop what the client is still sending until it closes, for
    at most :data:`LINGER_S` seconds. It matters whenever the refusal leaves request bytes
    unread (a line over ``MAX_LINE``, whose end was never read; a request line sent by a
    connection over its uid's limit, never read at all): a Unix socket closed with unread bytes
    in its queue makes the peer's ``recv`` fail with ECONNRESET (Linux 6.18 does so even while
    the reply is still queued), so the error would be lost. A client that reads to the end
    closes at once."""
    with contextlib.suppress(OSError):
        stream.socket.shutdown(trio.socket.SHUT_WR)
    with trio.move_on_after(LINGER_S):
        while await stream.receive_some(1 << 16):
            pass


class Controlled(Protocol):
    """What the daemon offers the control socket. ``caller`` is already authorised for the
    paths given; operations that walk a tree (``warm``) must apply the same rules below."""

    #: the owner and group the mount reports for every object
    owner: Owner

    def status(self) -> dict[str, Any]: ...

    async def lookup(self, path: str) -> Any: ...

    async def warm(
        self, paths: list[str], jobs: int, progress: Progress, caller: Peer
    ) -> dict[str, Any]: ...

    def prefetch(self, paths: list[str]) -> dict[str, Any]: ...

    def refresh(self, path: str) -> dict[str, Any]: ...

    async def flush(self, path: str, progress: Progress, caller: Peer) -> dict[str, Any]: ...

    async def unmount(self, progress: Progress) -> dict[str, Any]: ...

    async def catalog(self, caller: Peer, command: str, args: dict[str, Any]) -> Any:
        """Run a catalog command as ``caller`` (raises ``OSError`` with the refusal's errno
        and reason; ``EOPNOTSUPP`` where the target has no catalog)."""
        ...

    async def govern(self, caller: Peer, op: str, path: str) -> None:
        """Raise ``OSError`` unless the catalog's grants allow ``op`` on ``path`` for
        ``caller`` (returns at once where nothing is governed)."""
        ...


#: seconds between two log lines about one uid's bad requests (the rest are counted)
BAD_LOG_EVERY = 10.0
_OPS = frozenset({"status", "warm", "prefetch", "refresh", "flush", "unmount", "catalog"})


@dataclass(frozen=True, slots=True)
class ControlStats:
    """``ControlServer.statistics()``: connections open now, requests served (in all and by
    operation), connections refused at the per-uid limit, requests that could not be parsed,
    and requests denied (in all and by operation)."""

    connections: int
    requests: int
    requests_by_op: dict[str, int]
    refused_connections: int
    bad_requests: int
    denied: int
    denied_by_op: dict[str, int]

    def to_dict(self) -> dict[str, Any]:
        """As ``airfs status --json`` shows it under ``control``."""
        return asdict(self)


class ControlServer:
    """Serves one Unix socket. ``owner_uid`` (the daemon's user) may do everything root may;
    ``socket_uid`` owns the socket directory (checked before binding)."""

    def __init__(
        self,
        target: Controlled,
        path: str,
        *,
        owner_uid: int | None = None,
        limit: ConnectionLimit | None = None,
        idle_timeout: float = 10.0,
    ) -> None:
        self.target = target
        self.path = path
        self.owner_uid = os.geteuid() if owner_uid is None else owner_uid
        self.limit = limit or ConnectionLimit()
        self._lingering = 0
        self.idle_timeout = idle_timeout
        self.denials = Denials()
        self.requests: collections.Counter[str] = collections.Counter()
        #: requests that could not be parsed (too long, too deep, not JSON), by uid
        self.bad: collections.Counter[int] = collections.Counter()
        self._bad_logged: dict[int, tuple[float, int]] = {}

    def privileged(self, caller: Peer) -> bool:
        """Root or the mount's owner."""
        return caller.uid in (0, self.owner_uid)

    def statistics(self) -> ControlStats:
        """A frozen snapshot of the counters (see :class:`ControlStats`)."""
        return ControlStats(
            connections=sum(self.limit.open.values()),
            requests=sum(self.requests.values()),
            requests_by_op=dict(self.requests),
            refused_connections=self.limit.refused,
            bad_requests=sum(self.bad.values()),
            denied=self.denials.total,
            denied_by_op=dict(self.denials.by_op),
        )

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Bind (after checking the socket directory), then serve until cancelled; the socket
        file is removed on the way out. Raises :class:`~airfs.control.protocol.SocketDirError`
        when the directory cannot be trusted."""
        prepare_dir(os.path.dirname(self.path), os.geteuid())
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        # the sockets of daemons killed with SIGKILL (nothing else removes them)
        for dead in await trio.to_thread.run_sync(remove_dead_sockets, os.path.dirname(self.path)):
            log.info("removed the control socket of a daemon that had died: %s", dead)
        sock = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
        await sock.bind(self.path)
        # anyone may connect: each request is authorised by its peer credentials; a socket
        # of a non-root mount is reachable only by its owner anyway (0700 directory)
        os.chmod(self.path, 0o666)
        sock.listen(128)
        listener = trio.SocketListener(sock)
        try:
            task_status.started()
            await trio.serve_listeners(self._handle, [listener])
        finally:
            with contextlib.suppress(OSError):
                os.unlink(self.path)

    async def _handle(self, stream: trio.SocketStream) -> None:
        async with stream:
            try:
                caller = peer_caller(stream.socket)
            except OSError as exc:
                log.warning("control: no peer credentials (%s); connection dropped", exc)
                return
            if not self.limit.acquire(caller.uid):
                self.denials.record(caller, "connect", "too many connections")
                cap = self.limit.root if caller.uid == 0 else self.limit.per_uid
                await self._refuse(
                    stream,
                    f"too many connections from uid {caller.uid} (at most {cap})",
                    errno.EAGAIN,
                )
                return
            try:
                await self._serve_one(stream, caller)
            finally:
                self.limit.release(caller.uid)

    async def _refuse(self, stream: trio.SocketStream, error: str, err: int) -> None:
        """Reply ``error`` and close: after :func:`_linger` (the reply reaches a client whose
        request is still unread), or at once past :data:`MAX_LINGERING` refused connections
        lingering already."""
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            await stream.send_all(encode({"ok": False, "error": error, "errno": err}))
            if self._lingering < MAX_LINGERING:
                self._lingering += 1
                try:
                    await _linger(stream)
                finally:
                    self._lingering -= 1

    async def _read_line(self, stream: trio.SocketStream) -> bytes | None:
        """The request line; None when the client left or idled; :class:`BadMessage` when it
        runs past :data:`~airfs.control.protocol.MAX_LINE` (nothing more is parsed: the rest is
        dropped by :func:`_linger` after the reply)."""
        buf = bytearray()
        with trio.move_on_after(self.idle_timeout):
            while b"\n" not in buf:
                if len(buf) > MAX_LINE:
                    raise BadMessage(f"request line longer than {MAX_LINE} bytes", errno.EMSGSIZE)
                chunk = await stream.receive_some(1 << 16)
                if not chunk:
                    return None
                buf += chunk
            return bytes(buf[: buf.index(b"\n")])
        return None

    def _bad_request(self, caller: Peer, exc: BadMessage) -> None:
        """Count a request that could not be parsed; log one short line per uid at most every
        :data:`BAD_LOG_EVERY` seconds (with how many were not logged)."""
        self.bad[caller.uid] += 1
        now = trio.current_time()
        last, quiet = self._bad_logged.get(caller.uid, (-1e18, 0))
        if now - last < BAD_LOG_EVERY:
            self._bad_logged[caller.uid] = (last, quiet + 1)
            return
        if len(self._bad_logged) > 4096:
            self._bad_logged.clear()
        self._bad_logged[caller.uid] = (now, 0)
        more = f" (and {quiet} more since the last line)" if quiet else ""
        log.warning(
            "control: bad request from uid %d pid %d: %s%s", caller.uid, caller.pid, exc, more
        )

    async def _serve_one(self, stream: trio.SocketStream, caller: Peer) -> None:
        try:
            line = await self._read_line(stream)
            if line is None:
                return
            req = decode(line)
        except BadMessage as exc:
            self._bad_request(caller, exc)
            await self._refuse(stream, f"bad request: {exc}", exc.errno)
            return
        send_lock = trio.Lock()
        pending: list[bytes] = []

        def progress(p: dict[str, Any]) -> None:
            pending.append(encode({"progress": p}))

        gone = False

        async def pump() -> None:
            nonlocal gone
            try:
                while True:
                    await trio.sleep(0.1)
                    await drain()
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                gone = True  # the client left (e.g. its --timeout passed): stop the request
                nursery.cancel_scope.cancel()

        async def drain() -> None:
            async with send_lock:
                while pending:
                    await stream.send_all(pending.pop(0))

        op = "?"
        try:
            op = str(req.get("op"))
            self.requests[op if op in _OPS else "other"] += 1
            failed: Exception | None = None
            async with trio.open_nursery() as nursery:
                nursery.start_soon(pump)
                try:
                    result = await self._dispatch(req, caller, progress)
                except Exception as exc:  # raised below, not wrapped in the nursery's group
                    failed = _leaf(exc)
                nursery.cancel_scope.cancel()
            if gone:
                log.info("control %s: the client left before the reply", op)
                return
            if failed is not None:
                raise failed
            try:
                await drain()
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                # the client left between the pump's last send and the result (e.g. its
                # --timeout passed): not the daemon's failure
                log.info("control %s: the client left before the reply", op)
                return
            reply: dict[str, Any] = {"ok": True, "result": result}
        except Denied as exc:
            self.denials.record(caller, op, exc.strerror or str(exc))
            reply = {"ok": False, "error": exc.strerror or str(exc), "errno": exc.errno}
        except OSError as exc:
            reply = {"ok": False, "error": exc.strerror or str(exc), "errno": exc.errno}
        except (ValueError, KeyError, TypeError) as exc:
            self._bad_request(caller, BadMessage(f"{op}: {str(exc)[:200]}"))
            reply = {"ok": False, "error": f"bad request: {exc}", "errno": errno.EINVAL}
        except Exception as exc:
            log.exception("control request failed")
            reply = {"ok": False, "error": repr(exc), "errno": errno.EIO}
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            await stream.send_all(encode(reply))

    async def _checked(self, caller: Peer, raw: Any, want: int, op: str) -> str:
        """``raw`` normalised, and authorised for ``want`` unless the caller is root (root
        may read and write anything: nothing is looked up, so that a flush or a warm never
        waits for the origin, or fails while it is down, before it starts); then, on a
        governed mount, the catalog's grants for ``op`` (for root too, unless an admin).

        The catalog is asked first: its answer depends only on the names of the catalog,
        schema and volume, so a path in a volume the caller may not read is refused alike
        whether it exists or not (the mode-bit walk, which finds out, comes after)."""
        path = normalize(raw)
        try:
            await self.target.govern(caller, op, path)
        except OSError as exc:
            if exc.errno == errno.ENOENT:
                raise FileNotFoundError(exc.errno, exc.strerror) from None
            raise Denied(exc.errno or errno.EACCES, exc.strerror or str(exc)) from None
        if caller.uid != 0:
            lookup: Lookup = self.target.lookup
            await check_path(caller, path, want, self.target.owner, lookup)
        return path

    async def _dispatch(self, req: dict[str, Any], caller: Peer, progress: Progress) -> Any:
        op = req.get("op")
        t = self.target

        async def status() -> Any:
            out = {**t.status(), "control": self.statistics().to_dict()}
            return out if self.privileged(caller) else redact(out)

        async def warm() -> Any:
            paths = [await self._checked(caller, p, R, "warm") for p in _list(req["paths"])]
            return await t.warm(paths, int(req.get("jobs", 128)), progress, caller)

        async def prefetch() -> Any:
            # hints: a path gone meanwhile is skipped; one the caller may not read refuses all
            # (root's are not looked up: see _checked)
            paths = []
            for p in _list(req["paths"]):
                with contextlib.suppress(FileNotFoundError):
                    paths.append(await self._checked(caller, p, R, "prefetch"))
            return t.prefetch(paths)

        async def refresh() -> Any:
            return t.refresh(await self._checked(caller, req.get("path", ""), R, "refresh"))

        async def flush() -> Any:
            path = await self._checked(caller, req.get("path", ""), W, "flush")
            return await t.flush(path, progress, caller)

        async def unmount() -> Any:
            if not self.privileged(caller):
                raise Denied(
                    errno.EPERM,
                    f"only root or the mount's owner (uid {self.owner_uid}) may unmount",
                )
            return await t.unmount(progress)

        async def catalog() -> Any:
            args = req.get("args", {})
            return await t.catalog(caller, str(req["command"]), args)

        handlers: dict[str, Callable[[], Awaitable[Any]]] = {
            "catalog": catalog,
            "status": status,
            "warm": warm,
            "prefetch": prefetch,
            "refresh": refresh,
            "flush": flush,
            "unmount": unmount,
        }
        if op not in handlers:
            raise ValueError(f"unknown op {op!r}")
        return await handlers[str(op)]()


def _leaf(exc: Exception) -> Exception:
    """The one exception an exception group (from a nursery below) carries, else ``exc``:
    so that an ``OSError`` is answered with its errno and message."""
    while isinstance(exc, ExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def _list(v: Any) -> list[Any]:
    if not isinstance(v, list):
        raise TypeError("paths must be a list")
    return v
