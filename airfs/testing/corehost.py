"""Drive a core built by :func:`airfs.daemon.build.build` from ordinary (non-trio) code, with
crashes.

A trio thread hosts the build; :meth:`CoreHost.call` runs ``fn(built)`` there and returns its
result. :meth:`CoreHost.crash` drops every in-memory state (open handles, the uploader's
queue, the inode table) without draining, and builds again on the same cache dir and origin,
exactly as a daemon killed with SIGKILL and restarted would: what survives is what the
journal and the staging files hold. This is what ``hypothesis.stateful`` models run against.
"""

from __future__ import annotations

import errno
import os
import queue
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import trio

from airfs.core.inodes import ROOT_INO
from airfs.daemon.build import Built, build
from airfs.origin.base import Origin

T = TypeVar("T")
_STOP = object()


@dataclass(frozen=True)
class _Crash:
    then: Callable[[], None] | None
    before_restart: Callable[[], None] | None = None


class CoreHost:
    """A running core in a background trio thread (see the module docstring)."""

    def __init__(self, origin: Origin, cache_dir: str, **build_args: Any) -> None:
        self.origin = origin
        self.cache_dir = cache_dir
        self.build_args = {"ttl": 0.05, "staging_size": 1 << 30, "attempts": 1, **build_args}
        self._cmds: queue.Queue[Any] = queue.Queue()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=trio.run, args=(self._host,), daemon=True)
        self._thread.start()
        self._wait_ready(self._ready)

    def _wait_ready(self, ev: threading.Event) -> None:
        if not ev.wait(60):
            raise TimeoutError("the core did not start")
        if self._error is not None:
            err, self._error = self._error, None
            raise err

    async def _host(self) -> None:
        while True:
            cmd: Any = None
            try:
                async with build(self.origin, self.cache_dir, **self.build_args) as built:
                    self._ready.set()
                    while True:
                        cmd = await trio.to_thread.run_sync(self._cmds.get)
                        if isinstance(cmd, _Crash):
                            built.area.crashed()  # what is not on disk yet is lost
                            if cmd.then is not None:
                                cmd.then()
                            break
                        if cmd is _STOP:
                            break
                        fn, box, done = cmd
                        try:
                            box.append((True, await fn(built)))
                        except BaseException as exc:
                            box.append((False, exc))
                        done.set()
            except Exception as exc:  # a build that fails: reported by the waiting call
                self._error = exc
                self._ready.set()
                cmd = await trio.to_thread.run_sync(self._cmds.get)
            if cmd is _STOP:
                return
            if isinstance(cmd, _Crash) and cmd.before_restart is not None:
                cmd.before_restart()  # the old core is gone, the new one not built yet

    def call(self, fn: Callable[[Built], Awaitable[T]], timeout: float = 30.0) -> T:
        """Run ``fn(built)`` on the host's trio loop; re-raise what it raised."""
        box: list[tuple[bool, Any]] = []
        done = threading.Event()
        self._cmds.put((fn, box, done))
        if not done.wait(timeout):
            raise TimeoutError(f"core call did not finish within {timeout}s")
        ok, value = box[0]
        if not ok:
            raise value
        return value  # type: ignore[no-any-return]

    def crash(
        self,
        then: Callable[[], None] | None = None,
        before_restart: Callable[[], None] | None = None,
    ) -> None:
        """Drop all in-memory state and build again from the journal and staging files: the
        disk changes still queued (a commit's journal update not yet settled) are lost, as
        in a crash. ``then`` runs once the crash is decided, before the old core is torn
        down (e.g. to release an origin call held at a crash point); ``before_restart`` once
        it is torn down, before the new one is built (e.g. to arm a fault for the new core
        only: armed earlier, the old core's last retries could take it)."""
        self._ready = threading.Event()
        self._cmds.put(_Crash(then, before_restart))
        self._wait_ready(self._ready)

    def close(self) -> None:
        self._cmds.put(_STOP)
        self._thread.join(30)


# -- path-level helpers (coroutines to pass to CoreHost.call) ------------------------------


async def lookup(b: Built, path: str) -> int | None:
    """The inode of ``path`` (None if absent)."""
    ino = ROOT_INO
    for part in path.split("/"):
        try:
            ino = (await b.fs.lookup(ino, part)).ino
        except FileNotFoundError:
            return None
    return ino


async def read(b: Built, path: str) -> bytes | None:
    ino = await lookup(b, path)
    if ino is None:
        return None
    fh, _ = await b.fs.open(ino, os.O_RDONLY)
    try:
        out = b""
        while chunk := await b.fs.read(fh, len(out), 1 << 20):
            out += chunk
        return out
    finally:
        await b.fs.release(fh)


async def open_file(b: Built, path: str, flags: int, mode: int = 0o644) -> int:
    """Open (creating with ``O_CREAT`` when absent) a file in the root; returns the fh."""
    ino = await lookup(b, path)
    if ino is None:
        if not flags & os.O_CREAT:
            raise FileNotFoundError(errno.ENOENT, path)
        fh, _ = await b.fs.create(ROOT_INO, path, mode, flags)
        return fh
    fh, _ = await b.fs.open(ino, flags & ~os.O_CREAT)
    return fh


async def close(b: Built, fh: int) -> None:
    await b.fs.flush(fh)
    await b.fs.release(fh)


async def write_file(b: Built, path: str, data: bytes, flags: int = 0) -> None:
    fh = await open_file(b, path, os.O_WRONLY | os.O_CREAT | flags)
    try:
        if data:
            await b.fs.write(fh, 0, data)
    finally:
        await close(b, fh)
