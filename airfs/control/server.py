"""The daemon side of the control socket (framing in :mod:`airfs.control.protocol`)."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import trio

from .protocol import decode, encode

log = logging.getLogger(__name__)

Progress = Callable[[dict[str, Any]], None]


class Controlled(Protocol):
    """What the daemon offers the control socket."""

    def status(self) -> dict[str, Any]: ...

    async def warm(self, paths: list[str], jobs: int, progress: Progress) -> dict[str, Any]: ...

    def prefetch(self, paths: list[str]) -> dict[str, Any]: ...

    async def flush(self, path: str, progress: Progress) -> dict[str, Any]: ...

    async def unmount(self, progress: Progress) -> dict[str, Any]: ...


_MAX_LINE = 64 << 20


class ControlServer:
    """Serves one Unix socket; each connection carries one request."""

    def __init__(self, target: Controlled, path: str) -> None:
        self.target = target
        self.path = path

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        os.makedirs(os.path.dirname(self.path), mode=0o755, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        sock = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
        await sock.bind(self.path)
        os.chmod(self.path, 0o666)
        sock.listen(64)
        listener = trio.SocketListener(sock)
        try:
            task_status.started()
            await trio.serve_listeners(self._handle, [listener])
        finally:
            with contextlib.suppress(OSError):
                os.unlink(self.path)

    async def _handle(self, stream: trio.SocketStream) -> None:
        async with stream:
            buf = bytearray()
            while b"\n" not in buf:
                chunk = await stream.receive_some(1 << 16)
                if not chunk or len(buf) > _MAX_LINE:
                    return
                buf += chunk
            send_lock = trio.Lock()
            pending: list[bytes] = []

            def progress(p: dict[str, Any]) -> None:
                pending.append(encode({"progress": p}))

            async def pump() -> None:
                while True:
                    await trio.sleep(0.1)
                    await drain()

            async def drain() -> None:
                async with send_lock:
                    while pending:
                        await stream.send_all(pending.pop(0))

            try:
                req = decode(bytes(buf[: buf.index(b"\n")]))
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(pump)
                    result = await self._dispatch(req, progress)
                    nursery.cancel_scope.cancel()
                await drain()
                reply: dict[str, Any] = {"ok": True, "result": result}
            except OSError as exc:
                reply = {"ok": False, "error": exc.strerror or str(exc), "errno": exc.errno}
            except (ValueError, KeyError, TypeError) as exc:
                reply = {"ok": False, "error": f"bad request: {exc}", "errno": errno.EINVAL}
            except Exception as exc:
                log.exception("control request failed")
                reply = {"ok": False, "error": repr(exc), "errno": errno.EIO}
            with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                await stream.send_all(encode(reply))

    async def _dispatch(self, req: dict[str, Any], progress: Progress) -> Any:
        op = req.get("op")
        t = self.target
        handlers: dict[str, Callable[[], Awaitable[Any]]] = {
            "status": lambda: _value(t.status()),
            "warm": lambda: t.warm(list(req["paths"]), int(req.get("jobs", 128)), progress),
            "prefetch": lambda: _value(t.prefetch(list(req["paths"]))),
            "flush": lambda: t.flush(str(req.get("path", "")), progress),
            "unmount": lambda: t.unmount(progress),
        }
        if op not in handlers:
            raise ValueError(f"unknown op {op!r}")
        return await handlers[str(op)]()


async def _value(v: Any) -> Any:
    return v
