"""An origin wrapper that behaves like remote storage: per-request latency and a bandwidth cap.

``LatencyOrigin(inner, latency_s=0.01, bandwidth_bps=None)`` wraps any synchronous
:class:`~airfs.origin.base.Origin`. Every call first sleeps ``latency_s`` (time to first byte;
requests in parallel threads wait in parallel, as over a network). Calls that move data
(``read_range``: the bytes returned; ``put``: the size of the source file) then pass through one
token bucket shared by all threads, so the *aggregate* rate of all requests together stays at
``bandwidth_bps`` bytes per second: each transfer occupies the shared link for
``nbytes / bandwidth_bps`` seconds, scheduled first come, first served, with no burst credit.

With ``request_bytes`` a ``read_range`` of ``n`` bytes pays the latency once per
``request_bytes`` of its result, one after the other (``ceil(n / request_bytes)`` times, at
least once): an NFS-like client whose ``rsize`` splits one large ``pread`` into requests in a
row, so a reader gains only by issuing reads in parallel.

A ``put`` given a cancel (``Capabilities.cancel_puts``, passed on from the inner origin) stops
its transfer as soon as it is set, as an upload does between its parts.

It counts ``calls`` per operation and ``bytes_read``, like
:class:`~airfs.testing.memory.MemoryOrigin`. Used by tests and benchmarks; thread-safe.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import threading
import time
from collections.abc import Iterable
from typing import Any

from .base import Capabilities, Entry, FsStats, Kind, Origin, PutCancel

#: how often a put's emulated transfer looks at its cancel
CANCEL_POLL_S = 0.02


class _Link:
    """The shared bandwidth: a virtual clock of when the link is next free."""

    def __init__(self, bandwidth_bps: float) -> None:
        self.rate = float(bandwidth_bps)
        self._lock = threading.Lock()
        self._free_at = 0.0

    def transfer(self, nbytes: int, cancel: PutCancel | None = None, what: str = "") -> None:
        """Block the calling thread until ``nbytes`` have had their turn on the link; with
        ``cancel``, raise :class:`~airfs.origin.base.PutCancelled` as soon as it is set (an
        upload stopped between its parts; the link time it reserved is not given back)."""
        if nbytes <= 0:
            return
        with self._lock:
            now = time.monotonic()
            start = max(now, self._free_at)
            self._free_at = done = start + nbytes / self.rate
        while (delay := done - time.monotonic()) > 0:
            if cancel is not None:
                cancel.check(what)
            time.sleep(delay if cancel is None else min(delay, CANCEL_POLL_S))


class LatencyOrigin:
    """Adds ``latency_s`` per request and an aggregate ``bandwidth_bps`` cap to ``inner``."""

    def __init__(
        self,
        inner: Origin,
        latency_s: float = 0.01,
        bandwidth_bps: float | None = None,
        request_bytes: int | None = None,
    ) -> None:
        if latency_s < 0:
            raise ValueError("latency_s must be >= 0")
        if bandwidth_bps is not None and bandwidth_bps <= 0:
            raise ValueError("bandwidth_bps must be positive")
        if request_bytes is not None and request_bytes <= 0:
            raise ValueError("request_bytes must be positive")
        self.inner = inner
        self.url = inner.url
        self.latency_s = latency_s
        self.bandwidth_bps = bandwidth_bps
        self.request_bytes = request_bytes
        self._link = _Link(bandwidth_bps) if bandwidth_bps else None
        self._lock = threading.Lock()
        self.calls: collections.Counter[str] = collections.Counter()
        self.bytes_read = 0

    def _request(self, op: str) -> None:
        with self._lock:
            self.calls[op] += 1
        if self.latency_s:
            time.sleep(self.latency_s)

    def _transfer(self, nbytes: int, cancel: PutCancel | None = None, what: str = "") -> None:
        if self._link is not None:
            self._link.transfer(nbytes, cancel, what)

    # -- reads ---------------------------------------------------------------------------

    def stat(self, path: str) -> Entry:
        self._request("stat")
        return self.inner.stat(path)

    def list(self, path: str) -> Iterable[Entry]:
        self._request("list")
        return list(self.inner.list(path))

    def read_range(self, path: str, offset: int, size: int, version: str | None = None) -> bytes:
        self._start_read()
        data = self.inner.read_range(path, offset, size, version)
        self._end_read(len(data))
        return data

    def read_range_into(
        self, path: str, offset: int, buf: memoryview, version: str | None = None
    ) -> int:
        """See ``Capabilities.into_reads`` (passed on from the inner origin): the delays of
        :meth:`read_range`."""
        self._start_read()
        n: int = self.inner.read_range_into(path, offset, buf, version)  # type: ignore[attr-defined]
        self._end_read(n)
        return n

    def _start_read(self) -> None:
        if self.request_bytes is None:
            self._request("read_range")
        else:  # the requests of one pread, in a row: the first byte waits for the first one
            with self._lock:
                self.calls["read_range"] += 1

    def _end_read(self, n: int) -> None:
        if self.request_bytes is not None and self.latency_s:
            time.sleep(self.latency_s * max(1, -(-n // self.request_bytes)))
        self._transfer(n)
        with self._lock:
            self.bytes_read += n

    def readlink(self, path: str) -> str:
        self._request("readlink")
        return self.inner.readlink(path)

    def statfs(self) -> FsStats:
        self._request("statfs")
        return self.inner.statfs()

    # -- writes --------------------------------------------------------------------------

    def put(
        self,
        path: str,
        source: str,
        if_match: str | None = None,
        *,
        mode: int | None = None,
        mtime_ns: int | None = None,
        cancel: PutCancel | None = None,
        **owner: int | None,
    ) -> Entry:
        self._request("put")
        self._transfer(os.stat(source).st_size, cancel, path)
        return self.inner.put(
            path, source, if_match, mode=mode, mtime_ns=mtime_ns, cancel=cancel, **owner
        )

    # -- forwarded as they are -----------------------------------------------------------

    @property
    def capabilities(self) -> Capabilities:
        return dataclasses.replace(
            self.inner.capabilities,
            buffer_reads=False,
            whole_reads=False,
            bare_lists=False,
        )

    def check_name(self, path: str) -> None:
        self.inner.check_name(path)

    def pin(self, path: str, version: str) -> None:
        self._request("pin")
        self.inner.pin(path, version)  # type: ignore[attr-defined]

    def unpin(self, path: str, version: str) -> None:
        self.inner.unpin(path, version)  # type: ignore[attr-defined]

    def delete(self, path: str) -> None:
        self._request("delete")
        self.inner.delete(path)

    def mkdir(self, path: str, mode: int = 0o755, **owner: int | None) -> Entry:
        self._request("mkdir")
        return self.inner.mkdir(path, mode, **owner)

    def rmdir(self, path: str) -> None:
        self._request("rmdir")
        self.inner.rmdir(path)

    def rename(self, src: str, dst: str, replace: bool = True) -> None:
        self._request("rename")
        self.inner.rename(src, dst, replace)

    def symlink(self, path: str, target: str, **owner: int | None) -> Entry:
        self._request("symlink")
        return self.inner.symlink(path, target, **owner)

    def link(self, src: str, dst: str) -> Entry:
        self._request("link")
        return self.inner.link(src, dst)

    def mknod(self, path: str, kind: Kind, mode: int, rdev: int = 0, **owner: int | None) -> Entry:
        self._request("mknod")
        return self.inner.mknod(path, kind, mode, rdev, **owner)

    def set_attrs(
        self, path: str, mode: int | None = None, mtime_ns: int | None = None, **extra: Any
    ) -> Entry:
        self._request("set_attrs")
        return self.inner.set_attrs(path, mode, mtime_ns, **extra)

    def close(self) -> None:
        self.inner.close()
