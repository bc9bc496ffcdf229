"""Whole-file prefetch: ``airfs warm`` (foreground, with progress) and the background
prefetch queue that :mod:`airfs.data` feeds through the control socket."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import trio

from airfs.origin.aio import AsyncOrigin
from airfs.origin.base import Entry, Kind, OriginError, join

from .readpath import ObjectRef, ReadPath

log = logging.getLogger(__name__)

OnListing = Callable[[str, list[Entry], float], Any]


async def collect_files(
    origin: AsyncOrigin,
    paths: list[str],
    jobs: int = 32,
    on_listing: OnListing | None = None,
) -> list[ObjectRef]:
    """Every file under ``paths`` (files themselves, directories recursively), listing
    directories concurrently. Raises the origin's error for a path that does not exist.
    ``on_listing(dir, entries, at)`` sees each listing (the core keeps them for lookups),
    except bare ones: where the origin has them (``Capabilities.bare_lists``: S3) the
    listings ask no attributes (no HEAD per object: a warm needs only the versions), and
    such a listing is not kept for lookups (its modes and owners may be defaults)."""
    out: list[ObjectRef] = []
    limit = trio.CapacityLimiter(jobs)
    bare = origin.capabilities.bare_lists

    async def visit_dir(path: str, nursery: trio.Nursery) -> None:
        async with limit:
            t0 = time.monotonic()
            entries = await origin.list(path, attrs=False)
        if on_listing is not None and not bare:
            on_listing(path, entries, t0)
        for e in entries:
            child = join(path, e.name)
            if e.kind is Kind.FILE:
                out.append(ObjectRef(child, e.version, e.size))
            elif e.kind is Kind.DIR:
                nursery.start_soon(visit_dir, child, nursery)

    async with trio.open_nursery() as nursery:
        for p in paths:
            e = await origin.stat(p)
            if e.kind is Kind.FILE:
                out.append(ObjectRef(p, e.version, e.size))
            elif e.kind is Kind.DIR:
                nursery.start_soon(visit_dir, p, nursery)
    out.sort(key=lambda o: o.path)
    return out


#: Files of at most this size are warmed in batches of up to :data:`BATCH_FILES` (one
#: worker-thread job of the cache fetches a batch, one file after another); bigger ones alone
BATCH_MAX_SIZE = 1 << 20
BATCH_FILES = 8


def batches(files: list[ObjectRef]) -> list[list[ObjectRef]]:
    """``files`` in their order as units of work: a big file alone, the small ones in runs of
    up to :data:`BATCH_FILES`."""
    out: list[list[ObjectRef]] = []
    run: list[ObjectRef] = []
    for f in files:
        if f.size > BATCH_MAX_SIZE:
            out.append([f])
            continue
        run.append(f)
        if len(run) == BATCH_FILES:
            out.append(run)
            run = []
    if run:
        out.append(run)
    return out


async def warm(
    origin: AsyncOrigin,
    readpath: ReadPath,
    paths: list[str],
    jobs: int,
    on_progress: Callable[[dict[str, Any]], None] | None = None,
    on_listing: OnListing | None = None,
) -> dict[str, Any]:
    """Fetch every file under ``paths`` into the cache with ``jobs`` concurrent fetches.

    Returns a summary: files, bytes (total size), fetched (bytes read from the origin; files
    already cached cost nothing), seconds, MiB/s, and failures (path and error, at most 20)."""
    t0 = time.monotonic()
    files = await collect_files(origin, paths, on_listing=on_listing)
    origin_before = readpath.statistics().origin_bytes_read
    total = sum(f.size for f in files)
    done = {"files": 0, "bytes": 0, "fetched": 0}
    failures: list[dict[str, str]] = []
    last = 0.0

    def report(final: bool = False) -> None:
        nonlocal last
        now = time.monotonic()
        if on_progress is not None and (final or now - last >= 0.25):
            last = now
            on_progress(
                {
                    **done,
                    "total_files": len(files),
                    "total_bytes": total,
                    "seconds": round(now - t0, 3),
                }
            )

    todo = iter(batches(files))

    def ended(obj: ObjectRef, got: int | OriginError) -> None:
        if isinstance(got, OriginError):
            failures.append({"path": obj.path, "error": str(got)})
            log.warning("warm %s failed: %s", obj.path, got)
        else:
            done["fetched"] += got
        done["files"] += 1
        done["bytes"] += obj.size

    async def worker() -> None:  # ``jobs`` of them take the batches in order (no task each)
        for batch in todo:
            if len(batch) == 1:
                try:
                    ended(batch[0], await readpath.warm(batch[0]))
                except OriginError as exc:
                    ended(batch[0], exc)
            else:
                for obj, got in zip(batch, await readpath.warm_many(batch), strict=True):
                    ended(obj, got)
            report()

    async with trio.open_nursery() as nursery:
        for _ in range(min(max(1, jobs), len(files))):
            nursery.start_soon(worker)
    report(final=True)
    seconds = time.monotonic() - t0
    origin_after = readpath.statistics().origin_bytes_read
    if origin_before is not None and origin_after is not None:
        # what the origin really sent meanwhile (readers running at the same time count too)
        done["fetched"] = origin_after - origin_before
    return {
        "files": len(files),
        "bytes": total,
        "fetched": done["fetched"],
        "seconds": round(seconds, 3),
        "mib_s": round(total / seconds / 2**20, 1) if seconds > 0 else 0.0,
        "failed": len(failures),
        "failures": failures[:20],
    }


@dataclass(frozen=True, slots=True)
class PrefetchStats:
    """``BackgroundPrefetch.statistics()``: paths submitted (by the torch dataset), dropped
    (queue full), warmed, failed. Counters since the mount started."""

    submitted: int
    dropped: int
    warmed: int
    failed: int

    def to_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)


class BackgroundPrefetch:
    """A bounded queue of paths to warm in the background (for the torch dataset).

    ``submit`` never blocks: when the queue is full the oldest requests are dropped (they are
    hints, not promises). Errors are logged and counted, never raised."""

    def __init__(
        self,
        origin: AsyncOrigin,
        readpath: ReadPath,
        *,
        jobs: int = 32,
        depth: int = 4096,
        resolve: Callable[[str], Awaitable[tuple[Entry | None, float]]] | None = None,
    ) -> None:
        self.origin = origin
        self.resolve = resolve
        self.readpath = readpath
        self.jobs = jobs
        self._send, self._recv = trio.open_memory_channel[str | ObjectRef](depth)
        self.submitted = 0
        self.dropped = 0
        self.warmed = 0
        self.failed = 0

    def submit(self, paths: list[str]) -> None:
        self._submit(paths)

    def submit_refs(self, refs: list[ObjectRef]) -> None:
        """Warm these object versions as they are (the core's fetch-ahead: no name asked)."""
        self._submit(refs)

    def _submit(self, items: list[str] | list[ObjectRef]) -> None:
        for p in items:
            try:
                self._send.send_nowait(p)
                self.submitted += 1
            except trio.WouldBlock:
                self.dropped += 1

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            for _ in range(self.jobs):
                nursery.start_soon(self._worker)

    async def _worker(self) -> None:
        async for path in self._recv:
            try:
                if isinstance(path, ObjectRef):
                    await self.readpath.warm(path)
                    self.warmed += 1
                    continue
                if self.resolve is not None:  # the core's view: fresh listings, no round trip
                    entry, _at = await self.resolve(path)
                else:
                    entry = await self.origin.stat(path)
                if entry is not None and entry.kind is Kind.FILE:
                    await self.readpath.warm(ObjectRef(path, entry.version, entry.size))
                    self.warmed += 1
            except OriginError as exc:
                self.failed += 1
                log.debug("prefetch %s failed: %s", path, exc)

    def statistics(self) -> PrefetchStats:
        return PrefetchStats(self.submitted, self.dropped, self.warmed, self.failed)
