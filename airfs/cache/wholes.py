"""Small objects fetched whole, several in one worker-thread job (:class:`WholeBatches`).

A warm of many small files (``airfs warm`` of a dataset of images) spent most of the trio
loop's time on the thread round trip of each file's one fetch (the limiter, the thread cache
hand-off, the report back: ``py-spy --gil``, stop 40). One job here reads each object from the
origin, checksums it and writes it into its new cache file, one object after another; the
caller runs many such jobs at once for parallelism. A failure is that object's alone: it is
recorded in its :class:`WholeFetch` and the job goes on with the next one.
"""

from __future__ import annotations

import logging
from array import array

import trio

from ..origin.aio import AsyncOrigin
from ..origin.base import Conflict, Origin, OriginError
from .fetch import Fetcher, FetchKind, Part
from .objects import ObjectTable
from .stats import Counters
from .store import PRESENT, CachedObject, checksums, create_whole

__all__ = ["WholeBatches", "WholeFetch", "fetch_wholes"]

log = logging.getLogger(__name__)


class WholeFetch:
    """One object of a batch: what to fetch (``path``, ``version``, ``size``) and where to
    store it (``create``: the new cache file's path; empty: the bytes are not kept), then what
    came of it. ``error`` is the origin's failure (nothing else is set), else ``fd`` is the new
    file's descriptor (-1: none was made), ``crcs`` the chunk checksums of the bytes written
    (None: not stored) and ``data`` the bytes when they were not stored (None once written:
    a stored warm's bytes are read from the cache file, so the job lets them go at once)."""

    __slots__ = ("crcs", "create", "data", "error", "fd", "path", "size", "version")

    def __init__(self, path: str, version: str, size: int, create: str) -> None:
        self.path, self.version, self.size, self.create = path, version, size, create
        self.data: bytes | memoryview | None = None
        self.crcs: array[int] | None = None
        self.fd = -1
        self.error: OriginError | None = None


def fetch_wholes(origin: Origin, chunk_size: int, items: list[WholeFetch]) -> None:
    """Worker thread: fetch each of ``items`` whole from ``origin`` (one ranged read of its
    version), checksum it (chunks of ``chunk_size``) and write it into a new cache file at its
    ``create`` path. Never raises for one item's failure: an origin error is recorded in the
    item; a cache-file failure is logged and leaves the bytes unstored (``crcs`` None)."""
    buffered = origin.capabilities.buffer_reads
    for it in items:
        try:
            data: bytes | memoryview = (
                origin.read_range_buffer(it.path, 0, it.size, it.version)  # type: ignore[attr-defined]
                if buffered
                else origin.read_range(it.path, 0, it.size, it.version)
            )
            if len(data) != it.size:
                raise Conflict(f"{it.path}: origin returned {len(data)} of {it.size} bytes at 0")
        except OriginError as exc:
            it.error = exc
            continue
        if not it.create:
            it.data = data
            continue
        crcs = checksums(data, chunk_size)
        try:
            it.fd, failed = create_whole(it.create, data, it.size)
        except OSError as exc:
            failed = exc
        if failed is not None:
            log.warning("cache: write to cache file of %s failed: %s", it.path, failed)
            it.data = data
            continue
        it.crcs = crcs


class WholeBatches:
    """Warms of small files in batches, beside ``fetcher`` (whose parts, budget and single
    flight they share: a part of a batch is in flight like any other, and a read of its
    blocks waits for it)."""

    def __init__(
        self, fetcher: Fetcher, origin: AsyncOrigin, table: ObjectTable, stats: Counters
    ) -> None:
        self._fetcher = fetcher
        self._origin = origin
        self._table = table
        self._files = table.files
        self._stats = stats
        self._chunk_size = table.chunk_size

    def batchable(self, obj: CachedObject) -> bool:
        """Whether the loaded ``obj`` can go in a :meth:`warm` batch: fetched whole in one
        part, nothing of it cached or in flight, no cache file yet, no hole punch pending."""
        return (
            obj.size > 0
            and obj.nblocks <= self._fetcher.part_blocks
            and obj.cached == 0
            and not obj.inflight
            and obj.fd < 0
            and not obj.file_created
            and obj.creating is None
            and obj.punch_done is None
            and not obj.dead
        )

    async def warm(self, objs: list[CachedObject]) -> list[int | OriginError]:
        """Warm the loaded, pinned ``objs``: for each, the bytes fetched from the origin or
        its error. Those :meth:`batchable` are fetched, checksummed and stored by *one*
        worker-thread job, one after another (:func:`fetch_wholes`; a caller runs
        several batches at once for parallelism): one thread round trip for them all. Their
        parts are in flight meanwhile (a read of one waits for the batch). The others, and
        any whose fetch failed with a transient error (then retried by the origin's policy),
        go through :meth:`Fetcher.warm`. Raises what is not an :class:`OriginError`."""
        out: list[int | OriginError | None] = [None] * len(objs)
        mine = [i for i, o in enumerate(objs) if self.batchable(o)]
        if len(mine) > 1:
            # all of it (its peak, when the bytes are not kept)
            await self._fetcher.budget.acquire(sum(objs[i].size for i in mine))
            await self._once(objs, mine, out)
        for i, o in enumerate(objs):
            if out[i] is None:
                try:
                    out[i] = await self._fetcher.warm(o)
                except OriginError as exc:
                    out[i] = exc
        return [x if x is not None else 0 for x in out]

    async def _once(
        self, objs: list[CachedObject], mine: list[int], out: list[int | OriginError | None]
    ) -> None:
        """:meth:`warm`'s job, its budget taken (given back here): fills ``out`` for the
        objects it fetched and stored, or whose fetch failed for good."""
        t, s, fetcher = self._table, self._stats, self._fetcher
        budget = sum(objs[i].size for i in mine)
        claimed: list[tuple[int, Part, WholeFetch]] = []
        reserved: set[int] = set()
        try:
            for i in mine:
                o = objs[i]
                if not self.batchable(o):  # changed while the budget was awaited: one by one
                    continue
                part = fetcher.start_part(o, 0, o.nblocks, FetchKind.WARM, None, spawn=False)
                part.started = True
                create = ""
                if t.reserve(o, o.size):
                    reserved.add(id(part))
                    create = self._files.path(o)
                    o.creating = trio.Event()
                o.io += 1
                claimed.append((i, part, WholeFetch(o.path, o.version, o.size, create)))
            items = [w for _, _, w in claimed]
            if not items:
                return
            try:
                await self._origin.call(
                    fetch_wholes,
                    self._origin.sync,
                    self._chunk_size,
                    items,
                    what=f"read {len(items)} objects",
                    op="read",
                    abandon=False,  # it writes cache files
                    count=len(items),
                )
                s.warm_batches += 1
            finally:
                for _, part, w in claimed:
                    o = part.obj
                    o.io -= 1
                    if w.fd >= 0:
                        o.fd, o.file_created = w.fd, True
                    if w.create:
                        ev, o.creating = o.creating, None
                        assert ev is not None
                        ev.set()
            for i, part, w in claimed:
                o, n = part.obj, part.end - part.start
                if w.error is not None:
                    if w.error.transient:
                        part.dropped = True  # its waiters plan again; warm() retries it
                    else:
                        part.error = out[i] = w.error
                    continue
                s.origin_requests += 1
                s.origin_bytes_read += n
                s.warm_bytes += n
                if w.crcs is not None and not o.dead:
                    t.commit(o, part.b0, part.b1, w.crcs, PRESENT)
                    reserved.discard(id(part))
                else:
                    s.uncached_bytes += n
                    part.data = w.data
                out[i] = n
        except BaseException:
            for _, part, _w in claimed:
                if not part.done.is_set() and part.error is None:
                    part.dropped = True
            raise
        finally:
            fetcher.budget.release(budget)
            for _, part, _w in claimed:
                o = part.obj
                if id(part) in reserved:
                    t.used -= part.end - part.start
                for b in range(part.b0, part.b1):
                    if o.inflight.get(b) is part:
                        del o.inflight[b]
                part.done.set()
                part.stored.set()
                t.maybe_release(o)
