"""Async face of a synchronous origin: the only way into an origin from the trio loop.

Every call runs in a worker thread (``trio.to_thread.run_sync``) under a shared
``CapacityLimiter``. The one retry policy lives here: transient errors are retried with
jittered exponential backoff, sleeping on the trio loop *outside* the limiter (a retrying
call never holds an origin slot while it waits). Origins do not retry on their own.

Outages: once a read has used up its retries on transient errors, or as soon as any call
*stalls* (:class:`~airfs.origin.base.Stalled`: the origin's deadline for an answer passed,
a server that accepts and never answers), the origin is considered *down* for
:attr:`AsyncOrigin.down_for` seconds (or until any call succeeds). Calls made with
``fast=True`` (the core's revalidations of what it already knows, lookups, the catalog's
reloads) then fail at once instead of retrying, so cached data keeps being served and new
files can be created without a wait. One fast call per period still probes; while the
origin is down it waits at most :attr:`AsyncOrigin.probe_s` for the answer (the thread is
left to finish on its own: its success ends the outage). A stalled call is tried at most
twice, and once when it is a fast call or the origin was already down when it started, so
a read of uncached data during an outage fails after one stall deadline.

Cancellation: read-only calls abandon their thread when cancelled; calls that change the
origin (``abandon=False``) are waited for, so the caller always knows whether they happened.
"""

from __future__ import annotations

import collections
import functools
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from time import perf_counter
from typing import Any, TypeVar

import trio

from airfs.obs.histogram import Latencies, LatencyHistogram, as_dicts

from .base import (
    Capabilities,
    Entry,
    FsStats,
    Kind,
    NotFound,
    NotSupported,
    Origin,
    OriginError,
    PutCancel,
    PutCancelled,
    Stalled,
    Transient,
)

log = logging.getLogger(__name__)

T = TypeVar("T")

#: a mean ``stat`` slower than this is a remote request: ``stat_many`` asks in parallel lanes
SLOW_STAT_S = 0.001
#: the most parallel jobs of one ``stat_many``
STAT_LANES = 8


@dataclass(frozen=True, slots=True)
class OriginStats:
    """``AsyncOrigin.statistics()``, by operation: ``calls`` (attempts: a retried call counts
    once per attempt), ``retries``, ``errors`` (failed attempts), ``seconds`` (their total
    time) and ``latency`` (one observation per attempt, failed ones included, from the call
    into the worker thread to its end: a wait for a free origin slot is part of it, the
    backoff sleep between attempts is not); ``in_flight`` attempts, and ``down``."""

    in_flight: int
    calls: dict[str, int]
    retries: dict[str, int]
    errors: dict[str, int]
    seconds: dict[str, float]
    down: bool
    latency: dict[str, LatencyHistogram] = field(default_factory=dict)
    #: the origin's own count of its requests by kind, where it keeps one (S3: ``head``,
    #: every HEAD of an object, those a listing makes included)
    requests: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The record as ``airfs status`` shows it (under ``origin_calls``)."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["latency"] = as_dicts(self.latency)
        return out


@dataclass(eq=False)
class _StatBatch:
    """Fast stats asked together (:meth:`AsyncOrigin.stat_joined`): the paths (in order),
    set when the job ended (or will not run), each path's entry or error, the job's error."""

    paths: dict[str, None]
    done: trio.Event = field(default_factory=trio.Event)
    results: dict[str, Entry | OriginError] = field(default_factory=dict)
    error: OriginError | None = None


class AsyncOrigin:
    """Wraps an :class:`~airfs.origin.base.Origin` for use from trio tasks."""

    def __init__(
        self,
        origin: Origin,
        *,
        concurrency: int = 128,
        attempts: int = 5,
        base_delay: float = 0.1,
        max_delay: float = 5.0,
        down_for: float = 2.0,
        probe_s: float = 1.0,
    ) -> None:
        self.sync = origin
        self.url = origin.url
        self.limiter = trio.CapacityLimiter(concurrency)
        self.attempts = attempts
        self.base_delay = base_delay
        self.max_delay = max_delay
        self.down_for = down_for
        self.probe_s = probe_s
        self._down_until = 0.0
        #: down since the last failure and not answered since (probes get ``probe_s``)
        self._outage = False
        self._in_flight = 0
        #: the origin's own time per ``stat`` in ``stat_many`` (a moving mean, written by its
        #: worker threads): over ``SLOW_STAT_S``, the stats ahead are asked in parallel
        self.stat_s = 0.0
        #: the fast stats collecting for the next joined job, and the end of the one running
        self._stat_batch: _StatBatch | None = None
        self._stat_job: trio.Event | None = None
        #: worker-thread jobs that asked joined stats (each asks one or more paths)
        self.joined_jobs = 0
        self._calls: collections.Counter[str] = collections.Counter()
        self._retries: collections.Counter[str] = collections.Counter()
        self._errors: collections.Counter[str] = collections.Counter()
        self._seconds: collections.defaultdict[str, float] = collections.defaultdict(float)
        self._latency = Latencies()

    @property
    def capabilities(self) -> Capabilities:
        return self.sync.capabilities

    @property
    def down(self) -> bool:
        return time.monotonic() < self._down_until

    def _mark_down(self, extra: float = 0.0) -> None:
        self._down_until = time.monotonic() + self.down_for + extra
        self._outage = True

    def _mark_up(self) -> None:
        self._down_until = 0.0
        self._outage = False

    async def call(
        self,
        fn: Callable[..., T],
        *args: Any,
        what: str = "origin call",
        op: str = "call",
        abandon: bool = True,
        fast: bool = False,
        attempts: int | None = None,
        marks_down: bool | None = None,
        count: int = 1,
    ) -> T:
        """Run ``fn(*args)`` in a worker thread, retrying transient errors (see the module
        docstring for ``fast`` and ``abandon``). ``marks_down``: whether a last transient
        failure makes the origin "down" for ``fast`` calls (default: ``abandon``, as reads
        decide it and a failing upload alone does not). ``count``: the origin requests the
        job makes, one after another (a batch): counted as that many calls of ``op``, each
        taking its share of the job's time in the latency histogram."""
        down = abandon if marks_down is None else marks_down
        tries = self.attempts if attempts is None else attempts
        delay: float = self.base_delay
        job = functools.partial(fn, *args)
        stalls = 0
        for attempt in range(1, tries + 1):
            if fast and self.down:
                raise Transient(f"{what}: origin {self.url} is unreachable (recent failures)")
            outage = self._outage
            probe = fast and abandon and outage
            if probe:  # the one probe of this period: the others keep failing at once
                self._mark_down(self.probe_s)
            self._calls[op] += count
            self._in_flight += 1
            t0 = perf_counter()
            try:
                if probe:
                    out = await self._probe(job, what)
                else:
                    out = await trio.to_thread.run_sync(
                        job, limiter=self.limiter, abandon_on_cancel=abandon
                    )
            except OriginError as exc:
                if not isinstance(exc, PutCancelled):  # (stopped by us: not the origin's)
                    self._errors[op] += 1
                if not exc.transient:
                    self._mark_up()
                    raise
                if isinstance(exc, Stalled):
                    stalls += 1
                    self._mark_down()  # a stall is an outage at once, whoever made the call
                    if fast or stalls >= 2 or outage:
                        raise
                elif attempt == tries or (fast and attempt >= 2):
                    if down:
                        self._mark_down()
                    raise
                if attempt == tries:
                    raise
                self._retries[op] += 1
                log.warning("%s failed (attempt %d/%d): %s", what, attempt, tries, exc)
            else:
                self._mark_up()
                return out
            finally:
                self._in_flight -= 1
                dt = perf_counter() - t0
                self._seconds[op] += dt
                self._latency.observe(op, dt / count, count)
            await trio.sleep(random.uniform(0, delay))
            delay = min(self.max_delay, delay * 2)
        raise AssertionError("unreachable")

    async def _probe(self, job: Callable[[], T], what: str) -> T:
        """``job`` in a worker thread, waiting at most :attr:`probe_s` for it; a thread that
        answers later still ends the outage."""

        def run() -> T:
            out = job()
            self._mark_up()  # two plain stores; the loop reads them
            return out

        with trio.move_on_after(self.probe_s):
            return await trio.to_thread.run_sync(run, limiter=self.limiter, abandon_on_cancel=True)
        raise Stalled(f"{what}: origin {self.url} is down (no answer within {self.probe_s} s)")

    def statistics(self) -> OriginStats:
        return OriginStats(
            self._in_flight,
            dict(self._calls),
            dict(self._retries),
            dict(self._errors),
            {k: round(v, 3) for k, v in self._seconds.items()},
            self.down,
            self._latency.snapshot(),
            counters() if (counters := getattr(self.sync, "counters", None)) else {},
        )

    # -- reads (abandoned on cancel; ``fast`` for revalidations) ---------------------------

    async def stat(self, path: str, *, fast: bool = False) -> Entry:
        return await self.call(self.sync.stat, path, what=f"stat {path}", op="stat", fast=fast)

    async def stat_joined(self, path: str) -> Entry:
        """A fast :meth:`stat` (``fast=True``) asked together with those that arrive while
        one such job runs: where a ``stat`` is quick (a local directory) the stats asked
        meanwhile go in the next worker-thread job, one round trip for many lookups at once
        (the first pass of a restarted job); where it is a request (S3: over
        ``SLOW_STAT_S``) each is asked alone, in parallel. Raises as :meth:`stat`, each path
        its own error (a transient one is asked again alone, with the retry policy)."""
        if self.stat_s > SLOW_STAT_S:
            return await self.stat(path, fast=True)
        b = self._stat_batch
        if b is not None:  # a batch is collecting: join it
            b.paths[path] = None
            await b.done.wait()
        else:
            b = self._stat_batch = _StatBatch({path: None})
            try:
                while self._stat_job is not None:
                    await self._stat_job.wait()
            except BaseException:
                if self._stat_batch is b:
                    self._stat_batch = None
                b.done.set()  # cancelled before its job: the others ask alone (no result)
                raise
            if self._stat_batch is b:
                self._stat_batch = None
            await self._run_stat_batch(b)
        got = b.results.get(path)
        if b.error is not None:
            raise b.error  # the one error of the job, for each path it asked
        if got is None or (isinstance(got, OriginError) and got.transient):
            return await self.stat(path, fast=True)
        if isinstance(got, OriginError):
            raise got
        return got

    async def _run_stat_batch(self, b: _StatBatch) -> None:
        job = self._stat_job = trio.Event()
        paths = list(b.paths)
        self.joined_jobs += 1
        try:
            b.results = await self.call(
                self._stat_each, paths, what=f"stat {paths[0]}", op="stat", fast=True
            )
            self._calls["stat"] += len(paths) - 1  # counted per path, as alone
        except OriginError as exc:
            b.error = exc
        finally:
            self._stat_job = None
            job.set()
            b.done.set()

    def _stat_each(self, paths: list[str]) -> dict[str, Entry | OriginError]:
        out: dict[str, Entry | OriginError] = {}
        t0 = perf_counter()
        for p in paths:
            try:
                out[p] = self.sync.stat(p)
            except OriginError as exc:
                out[p] = exc
        self.stat_s = 0.8 * self.stat_s + 0.2 * (perf_counter() - t0) / len(paths)
        return out

    async def stat_many(
        self,
        paths: list[str],
        *,
        fast: bool = False,
        budget_s: float = 0.02,
        lanes: int | None = None,
    ) -> dict[str, Entry | None]:
        """``stat`` of ``paths[0]`` and then of the others, as far as ``budget_s`` of origin
        time goes: the entries of the paths asked (``paths[0]`` always), None for a name
        that does not exist. Only the first one's errors raise. One worker-thread job where
        a ``stat`` is quick (a local directory); where it is a request (S3: about a
        millisecond or more each) the paths are split into up to ``lanes`` (default
        ``STAT_LANES``) contiguous runs asked at once, one job each (each within
        ``budget_s``)."""
        wide = STAT_LANES if lanes is None else lanes
        n = min(wide, len(paths)) if len(paths) > 1 and self.stat_s > SLOW_STAT_S else 1
        k = -(-len(paths) // n)
        runs = [paths[i : i + k] for i in range(0, len(paths), k)]
        out: dict[str, Entry | None] = {}
        first: list[OriginError] = []

        async def lane(j: int) -> None:
            try:
                got = await self.call(
                    self._stat_many, runs[j], budget_s, what=f"stat {runs[j][0]}",
                    op="stat_many", fast=fast,
                )  # fmt: skip
            except OriginError as exc:
                if not j:
                    first.append(exc)
                return
            out.update(zip(runs[j], got, strict=False))

        if len(runs) == 1:
            await lane(0)
        else:
            async with trio.open_nursery() as nursery:
                for j in range(len(runs)):
                    nursery.start_soon(lane, j)
        if first:
            raise first[0]
        return out

    def _stat_many(self, paths: list[str], budget_s: float) -> list[Entry | None]:
        out: list[Entry | None] = []
        t0 = perf_counter()
        for i, p in enumerate(paths):
            try:
                out.append(self.sync.stat(p))
            except NotFound:
                out.append(None)
            except OriginError:
                if not i:
                    raise
                break
            if perf_counter() - t0 > budget_s:
                break
        # the origin's own time per stat (no thread hop), a moving mean
        self.stat_s = 0.8 * self.stat_s + 0.2 * (perf_counter() - t0) / len(out)
        return out

    async def list(
        self,
        path: str,
        *,
        fast: bool = False,
        attrs: bool = True,
        heads_max: int | None = None,
    ) -> list[Entry]:
        """``attrs=False``: a bare listing where the origin has them (``bare_lists``); check
        ``capabilities.bare_lists`` to know which one was given (or ``Entry.guessed``).
        ``heads_max``: where the origin has bare listings, the attributes it does not know
        are asked only when there are at most that many (else those entries are guessed)."""
        if (not attrs or heads_max is not None) and self.capabilities.bare_lists:
            return await self.call(
                lambda: list(
                    self.sync.list(path, attrs=attrs, heads_max=heads_max)  # type: ignore[call-arg]
                ),
                what=f"list {path}",
                op="list",
                fast=fast,
            )
        return await self.call(
            lambda: list(self.sync.list(path)), what=f"list {path}", op="list", fast=fast
        )

    async def read_range(
        self, path: str, offset: int, size: int, version: str | None = None
    ) -> bytes:
        return await self.call(
            self.sync.read_range, path, offset, size, version, what=f"read {path}", op="read"
        )

    async def read_small(self, path: str, most: int) -> tuple[Entry, memoryview | None]:
        """See ``Capabilities.whole_reads`` (an origin without it: ``NotSupported``); a
        revalidation's request (``fast``)."""
        if not self.capabilities.whole_reads:
            raise NotSupported(f"{path}: whole reads are not supported by this origin")
        return await self.call(
            self.sync.read_small,  # type: ignore[attr-defined]
            path,
            most,
            what=f"read {path}",
            op="read",
            fast=True,
        )

    async def readlink(self, path: str) -> str:
        return await self.call(self.sync.readlink, path, what=f"readlink {path}", op="readlink")

    async def statfs(self) -> FsStats:
        return await self.call(self.sync.statfs, what="statfs", op="statfs", fast=True)

    # -- changes (never abandoned) ---------------------------------------------------------

    async def put(
        self,
        path: str,
        source: str,
        if_match: str | None = None,
        *,
        mode: int | None = None,
        mtime_ns: int | None = None,
        uid: int | None = None,
        gid: int | None = None,
        attempts: int | None = None,
        fast: bool = False,
        cancel: PutCancel | None = None,
    ) -> Entry:
        """``fast``: a put the caller waits for in the foreground (an ``O_EXCL`` claim): it
        fails at once while the origin is down (see the module docstring). ``cancel`` is
        given to an origin with ``cancel_puts`` (:class:`~airfs.origin.base.PutCancelled` is
        not retried)."""
        fn = functools.partial(
            self.sync.put,
            mode=mode,
            mtime_ns=mtime_ns,
            **self._owner(uid, gid),
            cancel=cancel if self.capabilities.cancel_puts else None,
        )
        return await self.call(
            fn,
            path,
            source,
            if_match,
            what=f"put {path}",
            op="put",
            abandon=False,
            attempts=attempts,
            fast=fast,
        )

    async def delete(self, path: str) -> None:
        await self.call(self.sync.delete, path, what=f"delete {path}", op="delete", abandon=False)

    def _owner(self, uid: int | None, gid: int | None) -> dict[str, Any]:
        """Owner arguments, given only to origins that keep owners."""
        return {"uid": uid, "gid": gid} if self.sync.capabilities.owners else {}

    async def mkdir(
        self, path: str, mode: int = 0o755, *, uid: int | None = None, gid: int | None = None
    ) -> Entry:
        fn = functools.partial(self.sync.mkdir, **self._owner(uid, gid))
        return await self.call(fn, path, mode, what=f"mkdir {path}", op="mkdir", abandon=False)

    async def rmdir(self, path: str) -> None:
        await self.call(self.sync.rmdir, path, what=f"rmdir {path}", op="rmdir", abandon=False)

    async def rename(self, src: str, dst: str, replace: bool = True) -> None:
        await self.call(
            self.sync.rename, src, dst, replace, what=f"rename {src}", op="rename", abandon=False
        )

    async def symlink(
        self, path: str, target: str, *, uid: int | None = None, gid: int | None = None
    ) -> Entry:
        fn = functools.partial(self.sync.symlink, **self._owner(uid, gid))
        return await self.call(
            fn, path, target, what=f"symlink {path}", op="symlink", abandon=False
        )

    async def link(self, src: str, dst: str) -> Entry:
        return await self.call(
            self.sync.link, src, dst, what=f"link {dst}", op="link", abandon=False
        )

    async def mknod(
        self,
        path: str,
        kind: Kind,
        mode: int,
        rdev: int = 0,
        *,
        uid: int | None = None,
        gid: int | None = None,
    ) -> Entry:
        fn = functools.partial(self.sync.mknod, **self._owner(uid, gid))
        return await self.call(
            fn, path, kind, mode, rdev, what=f"mknod {path}", op="mknod", abandon=False
        )

    async def set_attrs(
        self,
        path: str,
        mode: int | None = None,
        mtime_ns: int | None = None,
        *,
        uid: int | None = None,
        gid: int | None = None,
        atime_ns: int | None = None,
        follow: bool = True,
    ) -> Entry:
        caps = self.sync.capabilities
        extra: dict[str, Any] = {"follow": follow} if caps.owners or caps.atimes else {}
        if caps.owners:
            extra.update(uid=uid, gid=gid)
        if caps.atimes:
            extra["atime_ns"] = atime_ns
        fn = functools.partial(self.sync.set_attrs, **extra)
        return await self.call(
            fn, path, mode, mtime_ns, what=f"setattr {path}", op="set_attrs", abandon=False
        )
