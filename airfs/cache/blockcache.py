"""The cached read path: persistent block cache + per-reader sequential prefetcher.

:class:`CachedReadPath` implements :class:`airfs.core.readpath.ReadPath`; its readers implement
:class:`airfs.core.readpath.Reader`.

Creating and closing (inside a trio run)::

    async with trio.open_nursery() as nursery:
        rp = await CachedReadPath.create(nursery, AsyncOrigin(origin), "/nvme/airfs",
                                         cache_size=100 << 30, min_free=10 << 30)
        ...
        await rp.aclose()          # persists the index, closes files; background tasks end

or ``async with CachedReadPath.running(origin, cache_dir, ...) as rp:`` which owns its nursery.
``create`` opens (and, for a new directory, creates) the cache: it takes the directory's lock
(:class:`~airfs.cache.index.CacheInUse` if another daemon holds it), loads the object table
from the index in a worker thread and starts one task in ``nursery`` that owns all background
work (fetches, index flushes, file deletions). ``aclose`` stops it, waits for fetches already
talking to the origin, writes the index and releases the lock. Cancelling ``nursery`` does the
same cleanup.

How a read is served (cached runs answered on the loop, missing blocks fetched as parts,
wrong bytes never returned): see :mod:`airfs.cache.reads`.

Space: see :mod:`airfs.cache.evict`. Data that cannot be cached (cache full of data in use) is
still served, just not kept (``uncached_bytes``).

The parts, each the single owner of its state: :class:`~airfs.cache.objects.ObjectTable`
(objects, space, dirty marks), :class:`~airfs.cache.files.CacheFiles` (descriptors, deletions,
punches), :class:`~airfs.cache.persist.IndexKeeper` (the LMDB index),
:class:`~airfs.cache.fetch.Fetcher` (parts), :class:`~airfs.cache.reads.ReadPlanner` (one read:
cached runs and parts), :class:`~airfs.cache.stats.Counters`; this module holds the life cycle
and the :class:`~airfs.core.readpath.ReadPath` interface.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import AsyncIterator
from typing import Required, TypedDict, Unpack

import trio

from airfs.core.readpath import BackingStats, ObjectRef, ReadBuffer

from ..origin.aio import AsyncOrigin
from ..origin.base import OriginError
from .backing import BackingFiles, LocalFile, Verified
from .evict import SpaceLimit
from .fetch import Fetcher
from .hits import HitReader
from .objects import ObjectTable
from .persist import IndexKeeper
from .prefetch import Stream
from .reader import CachedReader
from .reads import ReadPlanner
from .stats import CacheStatistics, Counters
from .store import CachedObject, object_key
from .wholes import WholeBatches

__all__ = ["CachedReadPath", "CachedReader"]


class CacheOptions(TypedDict, total=False):
    """The keyword arguments of :class:`CachedReadPath` (see it for each one's meaning), as
    :meth:`CachedReadPath.create` and :meth:`CachedReadPath.running` take them."""

    cache_size: Required[int]
    min_free: int
    block_size: int
    checksum_chunk: int
    initial_window: int
    max_window: int
    seek_tolerance: int
    part_size: int
    inflight_budget: int
    max_parallel: int
    flush_interval: float


#: block maps loaded in one worker-thread job for :meth:`CachedReadPath.expect`
EXPECT_BATCH = 256


class CachedReadPath:
    """Block cache + prefetcher in front of an :class:`~airfs.origin.aio.AsyncOrigin`.

    Construct with :meth:`create` (or :meth:`running`), not directly. Options:

    ``cache_size``
        most bytes of cached data kept under ``cache_dir``;
    ``min_free``
        free space to leave on the cache's file system (the cache shrinks below
        ``cache_size`` to keep it);
    ``block_size``
        the cache and fetch unit (default 256 KiB: what a random small read fetches, so 64
        random 4 KiB reads of a cold file pull at most 64 blocks; sequential reads fetch
        ``part_size`` parts regardless); ``checksum_chunk`` (a divisor of it, default
        128 KiB) is the checksum unit, so a read verifies only the chunks it touches;
    ``initial_window`` / ``max_window``
        first and largest prefetch request of a sequential stream (1 MiB, 128 MiB);
    ``seek_tolerance``
        how far a sequential reader may jump back or forward and keep its stream (4 MiB);
    ``part_size``
        bytes per origin range read when prefetching or warming (8 MiB);
    ``inflight_budget``
        bytes of all fetches in flight together (512 MiB): bounds memory;
    ``max_parallel``
        prefetch/warm range reads in flight together (32; demand reads come on top, within
        the origin's own limiter);
    ``flush_interval``
        seconds between batched index writes (0.5).
    """

    def __init__(
        self,
        origin: AsyncOrigin,
        cache_dir: str,
        *,
        cache_size: int,
        min_free: int = 0,
        block_size: int = 256 << 10,
        checksum_chunk: int = 128 << 10,
        initial_window: int = 1 << 20,
        max_window: int = 128 << 20,
        seek_tolerance: int = 4 << 20,
        part_size: int = 8 << 20,
        inflight_budget: int = 512 << 20,
        max_parallel: int = 32,
        flush_interval: float = 0.5,
    ) -> None:
        if block_size <= 0 or checksum_chunk <= 0 or block_size % checksum_chunk:
            raise ValueError("block_size must be a positive multiple of checksum_chunk")
        if cache_size < 0 or min_free < 0:
            raise ValueError("cache_size and min_free must be >= 0")
        self.cache_dir = os.path.abspath(cache_dir)
        self._bs = block_size
        self._cs = checksum_chunk
        self._initial_window = min(initial_window, max_window)
        self._max_window = max_window
        self._seek_tolerance = seek_tolerance
        io_limiter = trio.CapacityLimiter(16)
        self.stats = Counters()
        verified = Verified(self.cache_dir)
        self._table = ObjectTable(
            os.path.join(self.cache_dir, "data"),
            block_size=block_size,
            chunk_size=checksum_chunk,
            space=SpaceLimit(self.cache_dir, cache_size, min_free),
            stats=self.stats,
            io_limiter=io_limiter,
            on_dropped=lambda obj: verified.forget(obj.file_name()),
        )
        self._files = self._table.files
        self._keeper = IndexKeeper(
            self.cache_dir, self._table, self.stats, io_limiter, flush_interval=flush_interval
        )
        self._fetcher = Fetcher(
            origin,
            self._table,
            self.stats,
            io_limiter,
            part_size=part_size,
            inflight_budget=inflight_budget,
            max_parallel=max_parallel,
        )
        self._budget = self._fetcher.budget
        self._batches = WholeBatches(self._fetcher, origin, self._table, self.stats)
        self.backing = BackingFiles(
            self.cache_dir,
            self._table,
            self._keeper,
            io_limiter,
            functools.partial(self._fetcher.warm, urgent=True),  # an open waits for it
            verified,
            self._fetcher.settle,
        )
        self._readers: set[CachedReader] = set()
        hits = HitReader(self._table, self.stats)
        self._reads = ReadPlanner(self._table, self._fetcher, hits, self.stats)
        self._stop = trio.Event()
        self._run_done: trio.Event | None = None
        self._running = False
        #: objects whose block maps :meth:`expect` asked for, loaded by ``_load_expected``
        self._expected: list[CachedObject] = []
        self._expect_ev = trio.Event()
        #: versions read whole at their lookup, being stored (:meth:`store_fetched`)
        self._storing: dict[bytes, trio.Event] = {}

    # -- life cycle ------------------------------------------------------------------------

    @classmethod
    async def create(
        cls,
        nursery: trio.Nursery,
        origin: AsyncOrigin,
        cache_dir: str,
        **options: Unpack[CacheOptions],
    ) -> CachedReadPath:
        """Open the cache at ``cache_dir`` and start its background task in ``nursery``.
        ``options`` are the constructor's keyword arguments. Call :meth:`aclose` when done."""
        self = cls(origin, cache_dir, **options)
        await trio.to_thread.run_sync(self._open)
        await nursery.start(self._run)
        return self

    @classmethod
    @contextlib.asynccontextmanager
    async def running(
        cls, origin: AsyncOrigin, cache_dir: str, **options: Unpack[CacheOptions]
    ) -> AsyncIterator[CachedReadPath]:
        """``async with CachedReadPath.running(...) as rp``: :meth:`create` in a nursery of its
        own, :meth:`aclose` on exit."""
        rp = cls(origin, cache_dir, **options)
        await trio.to_thread.run_sync(rp._open)
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(rp._run)
                try:
                    yield rp
                finally:
                    await rp.aclose()
        except BaseExceptionGroup as group:
            # the nursery is an implementation detail: let the body's own error through as is
            if len(group.exceptions) == 1:
                raise group.exceptions[0] from None
            raise

    def _open(self) -> None:
        self._keeper.open()
        self.backing.verified.load()

    async def _run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self._run_done = trio.Event()
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(self._fetcher.run)
                self._running = True
                self._table.evict_to_fit(0)
                nursery.start_soon(self._keeper.run_flusher)
                nursery.start_soon(self._files.run)
                nursery.start_soon(self._keeper.remove_orphans)
                nursery.start_soon(self.backing.run_recorder)
                nursery.start_soon(self._load_expected)
                task_status.started()
                await self._stop.wait()
                nursery.cancel_scope.cancel()
        finally:
            self._running = False
            with trio.CancelScope(shield=True):
                await self._shutdown()
            self._run_done.set()

    async def aclose(self) -> None:
        """Stop background work, persist the index, close the cache. Readers stop working.

        Fetches already talking to the origin are waited for (their threads cannot be
        interrupted); queued ones are dropped."""
        if self._run_done is None:
            return
        self._stop.set()
        with trio.CancelScope(shield=True):
            await self._run_done.wait()

    async def _shutdown(self) -> None:
        await self._files.drain()
        await trio.to_thread.run_sync(self.backing.close)
        await self._keeper.close()  # the final flush, then the index
        for obj in self._table.objects.values():
            if not obj.io:
                self._files.close(obj)

    def _check_running(self) -> None:
        if not self._running:
            raise RuntimeError("the cached read path is not running (closed or not created)")

    # -- ReadPath --------------------------------------------------------------------------

    def open(self, obj: ObjectRef) -> CachedReader:
        """A reader of one object version, with its own prefetch stream. Cheap, no I/O."""
        self._check_running()
        cobj = self._table.object_for(obj)
        reader = CachedReader(
            self,
            cobj,
            obj,
            Stream(
                initial_window=self._initial_window,
                max_window=self._max_window,
                seek_tolerance=self._seek_tolerance,
                align=self._fetcher.part_blocks * self._table.block_size,
            ),
        )
        cobj.readers.add(reader)
        self._readers.add(reader)
        self._table.touch(cobj)
        self._table.demote_other_versions(cobj)
        return reader

    async def warm(self, obj: ObjectRef) -> int:
        """Fetch every block of ``obj`` not cached yet, with parallel range reads of up to
        ``part_size`` (waiting for fetches other readers already have in flight). Returns the
        bytes this call read from the origin: 0 when everything was cached.

        Raises the origin's error (e.g. :class:`Conflict` if the version is gone). When the
        cache cannot hold the object the data is fetched but not kept (``uncached_bytes``)."""
        self._check_running()
        cobj = self._table.object_for(obj)
        if cobj.size == 0:
            return 0
        cobj.pins += 1
        try:
            await self._keeper.ensure_loaded(cobj)
            self._table.touch(cobj)
            return await self._fetcher.warm(cobj)
        finally:
            cobj.pins -= 1
            self._table.maybe_release(cobj)

    async def warm_many(self, objs: list[ObjectRef]) -> list[int | OriginError]:
        """:meth:`warm` each of ``objs``; for each, the bytes read from the origin or its
        :class:`OriginError`. The small ones with nothing cached are fetched and stored by
        one worker-thread job, one after another (:class:`WholeBatches`): a caller
        warming many small files runs several of these at once."""
        self._check_running()
        cobjs = [self._table.object_for(o) for o in objs]
        for c in cobjs:
            c.pins += 1
        try:
            await self._keeper.load_many(cobjs)
            for c in cobjs:
                await self._keeper.ensure_loaded(c)
                self._table.touch(c)
            return await self._batches.warm(cobjs)
        finally:
            for c in cobjs:
                c.pins -= 1
                self._table.maybe_release(c)

    async def adopt(self, obj: ObjectRef, local_file: str) -> bool:
        """Make the complete local file ``local_file`` the cached content of ``obj``.

        Contract: ``local_file`` holds exactly the bytes of version ``obj.version`` (its size
        must be ``obj.size``, else :class:`ValueError`). The data is *copied* — a reflink
        where the file system supports it (btrfs, XFS), else ``copy_file_range`` — so the caller
        keeps ownership of ``local_file`` and may change or delete it as soon as this returns.
        Blocks already cached or being fetched are left alone. Returns False (and caches
        nothing) when the cache cannot make room; the origin is never read.
        """
        self._check_running()
        cobj = self._table.object_for(obj)
        cobj.pins += 1
        try:
            await self._keeper.ensure_loaded(cobj)
            size = (await trio.to_thread.run_sync(os.stat, local_file)).st_size
            if size != obj.size:
                raise ValueError(f"{local_file}: {size} bytes, but {obj.path} has {obj.size}")
            return await self._fetcher.adopt(cobj, local_file, obj.size)
        finally:
            cobj.pins -= 1
            self._table.maybe_release(cobj)

    async def carry(self, src: ObjectRef, dst: ObjectRef) -> bool:
        """See :meth:`airfs.core.readpath.ReadPath.carry`: the complete, verified cache file
        of ``src`` is adopted as ``dst`` (a reflink or a local copy); False when ``src`` is
        not all cached or the cache has no room."""
        self._check_running()
        if src.size != dst.size or src.size <= 0:
            return False
        lf = await self.backing.acquire(src)
        if lf is None:
            return False
        try:
            return await self.adopt(dst, f"/proc/self/fd/{lf.fd}")
        finally:
            lf.release()

    def discard(self, path: str, keep: str | None = None) -> int:
        """See :meth:`airfs.core.readpath.ReadPath.discard`: the cached versions of ``path`` other
        than ``keep`` leave the table (at once, or at their last release when in use) and
        their files are deleted. Returns how many left at once. Never blocks."""
        if not self._running:
            return 0
        return self._table.discard_path(path, keep)

    async def local_file(self, obj: ObjectRef, *, fetch_max: int = 0) -> LocalFile | None:
        """The complete, verified cache file of ``obj``, pinned until its ``release`` (None
        when not all of it is cached); fetched whole first when up to ``fetch_max`` bytes.
        See :mod:`airfs.cache.backing`."""
        self._check_running()
        storing = self._storing.get(object_key(obj.path, obj.version))
        if storing is not None:  # read at its lookup, being stored: no second origin read
            await storing.wait()
        return await self.backing.acquire(obj, fetch_max=fetch_max)

    def local_file_now(self, obj: ObjectRef) -> LocalFile | None:
        """See :meth:`airfs.core.readpath.ReadPath.local_file_now`."""
        self._check_running()
        return self.backing.acquire_now(obj)

    def knows(self, obj: ObjectRef) -> bool:
        """See :meth:`airfs.core.readpath.ReadPath.knows`: the table has that version (cached
        whole or in part, known from the index, or being filled)."""
        return object_key(obj.path, obj.version) in self._table.objects

    def store_fetched(self, obj: ObjectRef, data: memoryview) -> bool:
        """See :meth:`airfs.core.readpath.ReadPath.store_fetched`."""
        if not self._running or obj.size <= 0 or len(data) != obj.size or self.knows(obj):
            return False
        cobj = self._table.object_for(obj)
        self._keeper.install_new(cobj)  # not known before: nothing to load
        cobj.pins += 1
        done = self._storing[cobj.key] = trio.Event()
        self._fetcher.spawn(self._store_fetched, cobj, data, done)
        return True

    async def _store_fetched(self, cobj: CachedObject, data: memoryview, done: trio.Event) -> None:
        try:
            await self._keeper.ensure_loaded(cobj)
            if cobj.cached == 0 and not cobj.inflight and not cobj.dead:
                self._table.touch(cobj)
                part = await self._fetcher.store_given(cobj, data)
                if part.error is None and cobj.cached == cobj.size:
                    self.backing.written(cobj)  # checksummed as written: no read-back
                    self.stats.fetched_at_lookup += 1
        finally:
            if self._storing.get(cobj.key) is done:
                del self._storing[cobj.key]
            done.set()
            cobj.pins -= 1
            self._table.maybe_release(cobj)

    def expect(self, objs: list[ObjectRef]) -> None:
        """See :meth:`airfs.core.readpath.ReadPath.expect`: the block maps of the cached
        versions among ``objs`` not loaded yet are loaded in the background (in jobs of
        :data:`EXPECT_BATCH`), so that their first opens are answered inline."""
        if not self._running:
            return
        objects = self._table.objects
        for ref in objs:
            obj = objects.get(object_key(ref.path, ref.version))
            if obj is None or obj.have is not None or obj.loading is not None:
                continue
            if obj.size == ref.size and not obj.dead:
                self._expected.append(obj)
        if self._expected:
            self._expect_ev.set()

    async def _load_expected(self) -> None:
        while True:
            await self._expect_ev.wait()
            self._expect_ev = trio.Event()
            todo, self._expected = self._expected, []
            for i in range(0, len(todo), EXPECT_BATCH):
                await self._keeper.load_many(todo[i : i + EXPECT_BATCH])

    def backing_statistics(self) -> BackingStats:
        """See :meth:`airfs.core.readpath.ReadPath.backing_statistics`."""
        return self.backing.statistics()

    def statistics(self) -> CacheStatistics:
        """A frozen snapshot for ``airfs status`` and metrics (fields: :class:`CacheStatistics`)."""
        s = self.stats
        t = self._table
        streams = [r.stream for r in self._readers]
        return CacheStatistics(
            cache_dir=self.cache_dir,
            cache_bytes_used=t.used,
            cache_bytes_limit=t.space.cache_size,
            cache_bytes_limit_now=t.space.limit(t.used),
            min_free=t.space.min_free,
            disk_free_bytes=t.space.free_bytes(),
            cache_objects=len(t.objects),
            block_size=self._bs,
            checksum_chunk=self._cs,
            reads=s.reads,
            hit_bytes=s.hit_bytes,
            miss_bytes=s.miss_bytes,
            origin_bytes_read=s.origin_bytes_read,
            origin_requests=s.origin_requests,
            evictions=s.evictions,
            evicted_bytes=s.evicted_bytes,
            corrupt_blocks=s.corrupt_blocks,
            uncached_bytes=s.uncached_bytes,
            warm_bytes=s.warm_bytes,
            warm_batches=s.warm_batches,
            adopted_bytes=s.adopted_bytes,
            prefetch_window_current=max((st.window for st in streams if st.sequential), default=0),
            prefetch_window_max=max(
                [s.prefetch_window_max, *(st.max_window_seen for st in streams)]
            ),
            prefetch_bytes=s.prefetch_bytes,
            prefetch_hits=s.prefetch_hits,
            prefetch_waits=s.prefetch_waits,
            prefetch_resets=s.prefetch_resets + sum(st.resets for st in streams),
            prefetch_abandoned=s.prefetch_abandoned,
            inflight_bytes=self._budget.used,
            inflight_peak_bytes=self._budget.peak,
            inflight_budget=self._budget.limit,
            inflight_waits=self._budget.waits,
            readers_open=len(self._readers),
            index_pending=t.pending(),
            index_flushes=s.index_flushes,
            index_map_loads=s.index_map_loads,
            direct_write_bytes=self._fetcher.direct_write_bytes,
            kept_bytes=self._fetcher.held_bytes,
            kept_hit_bytes=s.kept_hit_bytes,
            part_buffers_leased=self._fetcher.buffers.leased,
            part_buffers_mapped=self._fetcher.buffers.made,
            fetched_at_lookup=s.fetched_at_lookup,
        )

    async def flush(self) -> None:
        """Write everything changed to the index now (one transaction, in a thread)."""
        await self._keeper.flush()

    async def read_for(self, reader: CachedReader, offset: int, size: int) -> ReadBuffer:
        """:meth:`CachedReader.read` (checked there): the reader's stream decides what to
        fetch ahead, the planner serves the bytes."""
        obj = reader.obj
        end = min(obj.size, offset + size)
        if end <= offset:
            return b""
        self._check_running()
        if obj.have is None:
            await self._keeper.ensure_loaded(obj)
        span = reader.stream.on_read(offset, end - offset, obj.size)
        return await self._reads.read(obj, offset, end, reader, span)

    def reader_closed(self, reader: CachedReader) -> None:
        obj = reader.obj
        self._fetcher.release_reader(reader)
        obj.readers.discard(reader)
        self._readers.discard(reader)
        st = reader.stream
        self.stats.prefetch_resets += st.resets
        self.stats.prefetch_window_max = max(self.stats.prefetch_window_max, st.max_window_seen)
        self._budget.poke()  # its queued prefetch parts give up
        self._table.maybe_release(obj)
