"""Async face of a synchronous origin, for code running on the trio loop.

Every call runs in a worker thread (``trio.to_thread.run_sync``) under a shared
``CapacityLimiter``, with transient errors retried (:func:`airfs.origin.base.retry`). Cancelling
the awaiting task abandons the thread's result; the origin call itself runs to completion.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import trio

from .base import Entry, FsStats, Origin, retry

T = TypeVar("T")


class AsyncOrigin:
    """Wraps an :class:`~airfs.origin.base.Origin` for use from trio tasks."""

    def __init__(self, origin: Origin, *, concurrency: int = 128, attempts: int = 5) -> None:
        self.sync = origin
        self.url = origin.url
        self.limiter = trio.CapacityLimiter(concurrency)
        self.attempts = attempts

    async def call(self, fn: Callable[..., T], *args: Any, what: str = "origin call") -> T:
        """Run ``fn(*args)`` in a worker thread, retrying transient errors."""
        job = functools.partial(
            retry, functools.partial(fn, *args), attempts=self.attempts, what=what
        )
        return await trio.to_thread.run_sync(job, limiter=self.limiter, abandon_on_cancel=True)

    async def stat(self, path: str) -> Entry:
        return await self.call(self.sync.stat, path, what=f"stat {path}")

    async def list(self, path: str) -> list[Entry]:
        return await self.call(lambda: list(self.sync.list(path)), what=f"list {path}")

    async def read_range(
        self, path: str, offset: int, size: int, version: str | None = None
    ) -> bytes:
        return await self.call(
            self.sync.read_range, path, offset, size, version, what=f"read {path}"
        )

    async def put(
        self, path: str, source: str, if_match: str | None = None, mode: int | None = None
    ) -> Entry:
        # origins written before puts carried a mode take three arguments: pass it only if set
        args = (path, source, if_match) if mode is None else (path, source, if_match, mode)
        return await self.call(self.sync.put, *args, what=f"put {path}")

    async def delete(self, path: str) -> None:
        await self.call(self.sync.delete, path, what=f"delete {path}")

    async def mkdir(self, path: str, mode: int = 0o755) -> Entry:
        return await self.call(self.sync.mkdir, path, mode, what=f"mkdir {path}")

    async def rmdir(self, path: str) -> None:
        await self.call(self.sync.rmdir, path, what=f"rmdir {path}")

    async def rename(self, src: str, dst: str, replace: bool = True) -> None:
        await self.call(self.sync.rename, src, dst, replace, what=f"rename {src}")

    async def symlink(self, path: str, target: str) -> Entry:
        return await self.call(self.sync.symlink, path, target, what=f"symlink {path}")

    async def readlink(self, path: str) -> str:
        return await self.call(self.sync.readlink, path, what=f"readlink {path}")

    async def set_attrs(
        self, path: str, mode: int | None = None, mtime_ns: int | None = None
    ) -> Entry:
        return await self.call(self.sync.set_attrs, path, mode, mtime_ns, what=f"setattr {path}")

    async def statfs(self) -> FsStats:
        return await self.call(self.sync.statfs, what="statfs")
