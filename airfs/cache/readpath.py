"""The cached read path: persistent block cache + per-reader sequential prefetcher.

:class:`CachedReadPath` implements :class:`airfs.readpath.ReadPath`; its readers implement
:class:`airfs.readpath.Reader`.

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

How a read is served
--------------------

An object version (path, version tag) is cached in blocks of ``block_size`` bytes in one sparse
file (:mod:`airfs.cache.store`); which blocks are present, with a CRC-32 per ``checksum_chunk``,
is kept in memory and mirrored to LMDB in batches (:mod:`airfs.cache.index`). A read whose
blocks are all present is answered on the trio loop with one ``preadv(RWF_NOWAIT)`` of the
chunks it touches, a checksum check and one copy into the reply — no thread hop, and never a
wait on the disk: if the pages are not in the page cache, the read moves to a worker thread. A
chunk whose checksum does not match marks its block absent (``corrupt_blocks``) and the read
fetches it again; wrong bytes are never returned.

Missing blocks are fetched from the origin as *parts* (runs of up to ``part_size`` bytes, one
``read_range`` each, in worker threads that also checksum and write the data into the cache
file). Each block is fetched by at most one part at a time (single flight): a read that needs a
block already being fetched waits for that part and is served from its memory. The
per-reader :class:`~airfs.prefetch.Stream` decides what to fetch ahead; see
:mod:`airfs.prefetch` for how the window grows, resets and applies backpressure.

Every byte returned belongs to the reader's object version: origin reads carry the version, and
an origin that no longer has it raises :class:`~airfs.origin.base.Conflict`.

Space: see :mod:`airfs.cache.evict`. Data that cannot be cached (cache full of data in use) is
still served, just not kept (``uncached_bytes``).
"""

from __future__ import annotations

import contextlib
import enum
import errno
import logging
import mmap
import os
import time
from array import array
from collections import OrderedDict
from collections.abc import AsyncIterator
from typing import Any

import trio

from ..origin.aio import AsyncOrigin
from ..origin.base import Conflict, OriginError, retry
from ..prefetch import ByteBudget, Stream, split_runs
from ..readpath import ObjectRef
from .evict import SpaceLimit, plan_eviction
from .index import CacheIndex, decode_map, encode_map, encode_meta
from .store import (
    PREFETCHED,
    PRESENT,
    CachedObject,
    allocate,
    bad_chunks,
    checksums,
    copy_into,
    create_file,
    object_key,
    punch,
    read_nowait,
    read_verify,
    write_all,
)

__all__ = ["CachedReadPath", "CachedReader"]

log = logging.getLogger(__name__)

_MAX_ATTEMPTS = 5
#: Largest hit served on the loop (checksumming runs at ~3 GiB/s: 2 MiB is well under 1 ms).
_INLINE_MAX = 2 << 20
_NONZERO = bytes([0] + [1] * 255)  # bytes.translate table: any non-zero byte -> 1


class _Kind(enum.Enum):
    DEMAND = "demand"  # a read is waiting for it
    PREFETCH = "prefetch"  # requested by a reader's stream ahead of its position
    WARM = "warm"  # warm(): fetch whole object
    ADOPT = "adopt"  # adopt(): copied from a local file, no origin read


class _Part:
    """A run of blocks ``[b0, b1)`` being fetched (or adopted) once for everyone who needs it."""

    __slots__ = (
        "b0",
        "b1",
        "data",
        "done",
        "end",
        "epoch",
        "error",
        "kind",
        "needed",
        "obj",
        "reader",
        "start",
        "started",
        "urgent",
    )

    def __init__(
        self, obj: CachedObject, b0: int, b1: int, kind: _Kind, reader: CachedReader | None
    ) -> None:
        self.obj = obj
        self.b0, self.b1 = b0, b1
        self.start = b0 * obj.block_size
        self.end = min(b1 * obj.block_size, obj.size)
        self.kind = kind
        self.reader = reader
        self.epoch = reader.stream.epoch if reader is not None else 0
        self.urgent = False  # a read waits for it: skip the budget queue
        self.needed = kind is not _Kind.PREFETCH  # must not be abandoned
        self.started = False
        self.done = trio.Event()
        #: the fetched bytes, for the reads waiting on the part (None: read the cache instead)
        self.data: bytes | None = None
        self.error: BaseException | None = None

    def abandoned(self) -> bool:
        """A prefetch whose reader closed or moved elsewhere before it started."""
        if self.needed or self.urgent:
            return False
        r = self.reader
        return r is None or r.closed or r.stream.epoch != self.epoch


class _Counters:
    __slots__ = (
        "adopted_bytes",
        "corrupt_blocks",
        "evicted_bytes",
        "evictions",
        "hit_bytes",
        "index_flushes",
        "miss_bytes",
        "origin_bytes_read",
        "origin_requests",
        "prefetch_abandoned",
        "prefetch_bytes",
        "prefetch_hits",
        "prefetch_resets",
        "prefetch_waits",
        "prefetch_window_max",
        "reads",
        "uncached_bytes",
        "warm_bytes",
    )

    def __init__(self) -> None:
        for name in self.__slots__:
            setattr(self, name, 0)


class CachedReader:
    """One open file handle's read stream (implements :class:`airfs.readpath.Reader`)."""

    __slots__ = ("_rp", "closed", "obj", "ref", "stream")

    def __init__(
        self, rp: CachedReadPath, obj: CachedObject, ref: ObjectRef, stream: Stream
    ) -> None:
        self._rp = rp
        self.obj = obj
        self.ref = ref
        self.stream = stream
        self.closed = False

    async def read(self, offset: int, size: int) -> bytes:
        """Up to ``size`` bytes at ``offset`` of the reader's object version; short only at the
        end. Raises :class:`~airfs.origin.base.Conflict` when bytes not cached are no longer
        at the origin in this version, other :class:`~airfs.origin.base.OriginError` s when the
        origin fails."""
        if self.closed:
            raise ValueError("read from a closed reader")
        if offset < 0 or size < 0:
            raise ValueError("negative offset or size")
        obj = self.obj
        end = min(obj.size, offset + size)
        if end <= offset:
            return b""
        rp = self._rp
        rp._check_running()
        if obj.have is None:
            await rp._ensure_loaded(obj)
        span = self.stream.on_read(offset, end - offset, obj.size)
        return await rp._read(obj, offset, end, self, span)

    def active_range(self) -> tuple[int, int]:
        """Bytes the reader is using now; never evicted (see :mod:`airfs.cache.evict`)."""
        return self.stream.active_range()

    def close(self) -> None:
        """Drop the stream. Prefetched data stays cached; parts not started are abandoned."""
        if self.closed:
            return
        self.closed = True
        self._rp._reader_closed(self)


class CachedReadPath:
    """Block cache + prefetcher in front of an :class:`~airfs.origin.aio.AsyncOrigin`.

    Construct with :meth:`create` (or :meth:`running`), not directly. Options:

    ``cache_size``
        most bytes of cached data kept under ``cache_dir``;
    ``min_free``
        free space to leave on the cache's file system (the cache shrinks below
        ``cache_size`` to keep it);
    ``block_size``
        the cache and fetch unit (default 1 MiB); ``checksum_chunk`` (a divisor of it, default
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
        block_size: int = 1 << 20,
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
        self._origin = origin
        self.cache_dir = os.path.abspath(cache_dir)
        self._data_dir = os.path.join(self.cache_dir, "data")
        self._bs = block_size
        self._cs = checksum_chunk
        self._part_blocks = max(1, part_size // block_size)
        self._initial_window = min(initial_window, max_window)
        self._max_window = max_window
        self._seek_tolerance = seek_tolerance
        self._flush_interval = flush_interval
        self._space = SpaceLimit(self.cache_dir, cache_size, min_free)
        self._budget = ByteBudget(inflight_budget)
        self._parallel = trio.CapacityLimiter(max_parallel)
        self._io_limiter = trio.CapacityLimiter(16)
        self._objects: OrderedDict[bytes, CachedObject] = OrderedDict()  # LRU first
        self._by_path: dict[str, set[bytes]] = {}
        self._readers: set[CachedReader] = set()
        self._used = 0  # bytes of present blocks + reservations
        self._gen = 0
        self._gen_start = 0
        self._dirty_meta: set[bytes] = set()
        self._dirty_map: set[bytes] = set()
        self._deleted: set[bytes] = set()
        self._dirty_ev = trio.Event()
        self._flush_lock = trio.Lock()
        self._files_send, self._files_recv = trio.open_memory_channel[tuple[Any, ...]](float("inf"))
        # Hits are read into this buffer, checked, and copied into the reply. An anonymous
        # mapping, not a bytearray: preadv into a long-lived heap buffer measured ~5x slower.
        self._scratch = mmap.mmap(-1, 2 << 20)
        self._index: CacheIndex | None = None
        self._nursery: trio.Nursery | None = None
        self._stop = trio.Event()
        self._run_done: trio.Event | None = None
        self._running = False
        self.stats = _Counters()

    # -- life cycle ------------------------------------------------------------------------

    @classmethod
    async def create(
        cls, nursery: trio.Nursery, origin: AsyncOrigin, cache_dir: str, **options: Any
    ) -> CachedReadPath:
        """Open the cache at ``cache_dir`` and start its background task in ``nursery``.
        ``options`` are the constructor's keyword arguments. Call :meth:`aclose` when done."""
        self = cls(origin, cache_dir, **options)
        await trio.to_thread.run_sync(self._open_index)
        await nursery.start(self._run)
        return self

    @classmethod
    @contextlib.asynccontextmanager
    async def running(
        cls, origin: AsyncOrigin, cache_dir: str, **options: Any
    ) -> AsyncIterator[CachedReadPath]:
        """``async with CachedReadPath.running(...) as rp``: :meth:`create` in a nursery of its
        own, :meth:`aclose` on exit."""
        rp = cls(origin, cache_dir, **options)
        await trio.to_thread.run_sync(rp._open_index)
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

    def _open_index(self) -> None:
        index = CacheIndex(self.cache_dir, block_size=self._bs, chunk_size=self._cs)
        try:
            records = index.load_objects()
            for i in range(256):
                os.makedirs(os.path.join(self._data_dir, f"{i:02x}"), exist_ok=True)
        except BaseException:
            index.close()
            raise
        self._index = index
        max_gen = 0
        for r in records:
            obj = CachedObject(
                r.key, r.path, r.version, r.size, r.gen, self._bs, self._cs,
                cached=r.cached, last_used=r.last_used, loaded=False,
            )  # fmt: skip
            self._objects[r.key] = obj
            self._by_path.setdefault(r.path, set()).add(r.key)
            self._used += r.cached
            max_gen = max(max_gen, r.gen)
        self._gen = self._gen_start = max(time.time_ns(), max_gen + 1)

    async def _run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self._run_done = trio.Event()
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                self._running = True
                self._evict_to_fit(0)
                nursery.start_soon(self._flusher)
                nursery.start_soon(self._file_worker)
                nursery.start_soon(self._remove_orphans)
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
        ops = []
        while True:
            try:
                ops.append(self._files_recv.receive_nowait())
            except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
                break
        for op in ops:
            await self._file_op(op)
        try:
            await self.flush()
        except Exception:
            log.exception("cache index: final flush failed")
        for obj in self._objects.values():
            if obj.fd >= 0 and not obj.io:
                os.close(obj.fd)
                obj.fd = -1
        if self._index is not None:
            await trio.to_thread.run_sync(self._index.close)
            self._index = None

    def _check_running(self) -> None:
        if not self._running:
            raise RuntimeError("the cached read path is not running (closed or not created)")

    # -- ReadPath --------------------------------------------------------------------------

    def open(self, obj: ObjectRef) -> CachedReader:
        """A reader of one object version, with its own prefetch stream. Cheap, no I/O."""
        self._check_running()
        cobj = self._object_for(obj)
        reader = CachedReader(
            self,
            cobj,
            obj,
            Stream(
                initial_window=self._initial_window,
                max_window=self._max_window,
                seek_tolerance=self._seek_tolerance,
            ),
        )
        cobj.readers.add(reader)
        self._readers.add(reader)
        self._touch(cobj)
        # other versions of this path nobody reads are stale: evict them first
        for key in self._by_path.get(obj.path, ()):
            other = self._objects[key]
            if other is not cobj and not other.readers:
                self._objects.move_to_end(key, last=False)
        return reader

    async def warm(self, obj: ObjectRef) -> int:
        """Fetch every block of ``obj`` not cached yet, with parallel range reads of up to
        ``part_size`` (waiting for fetches other readers already have in flight). Returns the
        bytes this call read from the origin: 0 when everything was cached.

        Raises the origin's error (e.g. :class:`Conflict` if the version is gone). When the
        cache cannot hold the object the data is fetched but not kept (``uncached_bytes``)."""
        self._check_running()
        cobj = self._object_for(obj)
        if cobj.size == 0:
            return 0
        cobj.pins += 1
        try:
            await self._ensure_loaded(cobj)
            self._touch(cobj)
            have, inflight = cobj.have, cobj.inflight
            assert have is not None
            theirs: dict[int, _Part] = {}
            for p in inflight.values():
                p.needed = True
                theirs[id(p)] = p
            mine = [
                self._start_part(cobj, b0, b1, _Kind.WARM, None)
                for b0, b1 in split_runs(
                    0, cobj.nblocks, self._part_blocks, lambda b: bool(have[b]) or b in inflight
                )
            ]
            error: BaseException | None = None
            for p in [*mine, *theirs.values()]:
                await p.done.wait()
                if p.error is not None and error is None:
                    error = p.error
            if error is not None:
                raise error
            fetched = sum(p.end - p.start for p in mine)
            self.stats.warm_bytes += fetched
            return fetched
        finally:
            cobj.pins -= 1
            self._maybe_release(cobj)

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
        cobj = self._object_for(obj)
        cobj.pins += 1
        try:
            await self._ensure_loaded(cobj)
            have, inflight = cobj.have, cobj.inflight
            assert have is not None
            size = (await trio.to_thread.run_sync(os.stat, local_file)).st_size
            if size != obj.size:
                raise ValueError(f"{local_file}: {size} bytes, but {obj.path} has {obj.size}")
            runs = list(
                split_runs(0, cobj.nblocks, 1 << 62, lambda b: bool(have[b]) or b in inflight)
            )
            if not runs:
                return True
            nbytes = sum(cobj.run_len(b0, b1) for b0, b1 in runs)
            if not self._reserve(cobj, nbytes):
                return False
            whole = cobj.cached == 0 and not inflight and runs == [(0, cobj.nblocks)]
            parts = [_Part(cobj, b0, b1, _Kind.ADOPT, None) for b0, b1 in runs]
            for p in parts:
                p.started = True
                for b in range(p.b0, p.b1):
                    inflight[b] = p
            reserved = nbytes
            try:
                await self._punches_done(cobj)
                fd = await self._fd_for_write(cobj)
                cobj.io += 1
                try:
                    crcs = await trio.to_thread.run_sync(
                        self._adopt_job,
                        local_file,
                        obj.size,
                        fd,
                        [(p.start, p.end - p.start) for p in parts],
                        whole,
                        limiter=self._io_limiter,
                    )
                finally:
                    cobj.io -= 1
                for p, c in zip(parts, crcs, strict=True):
                    self._commit(cobj, p.b0, p.b1, c, PRESENT)
                reserved = 0
                self.stats.adopted_bytes += nbytes
                return True
            finally:
                # reads waiting on these blocks plan again: they find them cached, or (if
                # adopting failed) fetch them; an adopt failure is never theirs
                self._used -= reserved
                for p in parts:
                    for b in range(p.b0, p.b1):
                        if inflight.get(b) is p:
                            del inflight[b]
                    p.done.set()
        finally:
            cobj.pins -= 1
            self._maybe_release(cobj)

    def _adopt_job(
        self, local_file: str, size: int, fd: int, ranges: list[tuple[int, int]], whole: bool
    ) -> list[array[int]]:
        actual = os.stat(local_file).st_size
        if actual != size:
            raise ValueError(f"{local_file}: {actual} bytes, expected {size}")
        return copy_into(local_file, fd, ranges, whole, self._cs)

    def statistics(self) -> dict[str, Any]:
        """A snapshot for ``airfs status`` and metrics. Counters run since this read path was
        created; sizes are bytes.

        * ``cache_bytes_used`` (cached blocks + space reserved for fetches in flight),
          ``cache_bytes_limit`` (``cache_size``), ``cache_bytes_limit_now`` (lowered by
          ``min_free``), ``min_free``, ``disk_free_bytes`` (last ``statvfs``), ``cache_objects``,
          ``block_size``, ``checksum_chunk``;
        * ``reads``; ``hit_bytes`` (served from cache files), ``miss_bytes`` (served from a
          fetch a read waited for); ``origin_bytes_read``, ``origin_requests``;
        * ``evictions`` (objects dropped + block runs punched), ``evicted_bytes``,
          ``corrupt_blocks`` (checksum failures, refetched), ``uncached_bytes`` (fetched but not
          kept: no room), ``warm_bytes``, ``adopted_bytes``;
        * ``prefetch_window_current`` (largest window of the open sequential streams),
          ``prefetch_window_max`` (largest ever), ``prefetch_bytes`` (fetched ahead),
          ``prefetch_hits`` (prefetched blocks later read from the cache), ``prefetch_waits``
          (reads that waited for a prefetch in flight), ``prefetch_resets`` (streams broken by
          far jumps), ``prefetch_abandoned`` (queued prefetches dropped after a jump/close);
        * ``inflight_bytes`` (fetches in flight now), ``inflight_peak_bytes``,
          ``inflight_budget``; ``readers_open``; ``index_pending`` (objects not yet written to
          the index), ``index_flushes`` (index transactions).
        """
        s = self.stats
        streams = [r.stream for r in self._readers]
        return {
            "kind": "cached",
            "cache_dir": self.cache_dir,
            "cache_bytes_used": self._used,
            "cache_bytes_limit": self._space.cache_size,
            "cache_bytes_limit_now": self._space.limit(self._used),
            "min_free": self._space.min_free,
            "disk_free_bytes": self._space.free_bytes(),
            "cache_objects": len(self._objects),
            "block_size": self._bs,
            "checksum_chunk": self._cs,
            "reads": s.reads,
            "hit_bytes": s.hit_bytes,
            "miss_bytes": s.miss_bytes,
            "origin_bytes_read": s.origin_bytes_read,
            "origin_requests": s.origin_requests,
            "evictions": s.evictions,
            "evicted_bytes": s.evicted_bytes,
            "corrupt_blocks": s.corrupt_blocks,
            "uncached_bytes": s.uncached_bytes,
            "warm_bytes": s.warm_bytes,
            "adopted_bytes": s.adopted_bytes,
            "prefetch_window_current": max(
                (st.window for st in streams if st.sequential), default=0
            ),
            "prefetch_window_max": max(
                [s.prefetch_window_max, *(st.max_window_seen for st in streams)]
            ),
            "prefetch_bytes": s.prefetch_bytes,
            "prefetch_hits": s.prefetch_hits,
            "prefetch_waits": s.prefetch_waits,
            "prefetch_resets": s.prefetch_resets + sum(st.resets for st in streams),
            "prefetch_abandoned": s.prefetch_abandoned,
            "inflight_bytes": self._budget.used,
            "inflight_peak_bytes": self._budget.peak,
            "inflight_budget": self._budget.limit,
            "readers_open": len(self._readers),
            "index_pending": len(self._dirty_meta) + len(self._deleted),
            "index_flushes": s.index_flushes,
        }

    # -- objects ---------------------------------------------------------------------------

    def _object_for(self, ref: ObjectRef) -> CachedObject:
        key = object_key(ref.path, ref.version)
        obj = self._objects.get(key)
        if obj is not None and obj.size != ref.size:
            log.warning("%s@%s: size changed under one version tag", ref.path, ref.version)
            if not obj.busy():
                self._drop(obj, evicted=False)
                obj = None
        if obj is None:
            self._gen += 1
            obj = CachedObject(
                key, ref.path, ref.version, ref.size, self._gen, self._bs, self._cs,
                last_used=time.time_ns(),
            )  # fmt: skip
            self._objects[key] = obj
            self._by_path.setdefault(ref.path, set()).add(key)
        return obj

    def _touch(self, obj: CachedObject) -> None:
        obj.last_used = time.time_ns()
        self._objects.move_to_end(obj.key)
        if obj.cached:
            self._dirty_meta.add(obj.key)
            self._mark_dirty()

    def _mark_dirty(self) -> None:
        if not self._dirty_ev.is_set():
            self._dirty_ev.set()

    async def _ensure_loaded(self, obj: CachedObject) -> None:
        """Load the block map of an object known from the index (once, in a thread)."""
        while obj.have is None:
            if obj.loading is not None:
                await obj.loading.wait()
                continue
            ev = obj.loading = trio.Event()
            raw: bytes | None = None
            exists = False
            try:
                try:
                    raw, exists = await trio.to_thread.run_sync(
                        self._load_map_job, obj, limiter=self._io_limiter
                    )
                except Exception:
                    log.exception("cache index: cannot load %s", obj.path)
                self._install_map(obj, raw, exists)
            finally:
                obj.loading = None
                ev.set()

    def _load_map_job(self, obj: CachedObject) -> tuple[bytes | None, bool]:
        assert self._index is not None
        raw = self._index.load_map(obj.key)
        exists = os.path.exists(os.path.join(self._data_dir, obj.file_name()))
        return raw, exists

    def _install_map(self, obj: CachedObject, raw: bytes | None, exists: bool) -> None:
        if obj.have is not None:
            return
        have = bytearray(obj.nblocks)
        crcs = array("I", bytes(4 * obj.nchunks))
        dec = decode_map(raw, obj.nblocks, obj.nchunks) if raw is not None and exists else None
        if dec is not None and dec[0] == obj.gen:
            have = bytearray(dec[1]).translate(_NONZERO)
            crcs = array("I")
            crcs.frombytes(dec[2])
        cached = have.count(1) * self._bs
        if obj.nblocks and have[-1]:
            cached -= self._bs - obj.block_len(obj.nblocks - 1)
        obj.have, obj.crcs = have, crcs
        if not exists:
            obj.file_created = False
        if cached != obj.cached:
            self._used += cached - obj.cached
            obj.cached = cached
            self._dirty_meta.add(obj.key)
            self._dirty_map.add(obj.key)
            self._mark_dirty()

    def _fd(self, obj: CachedObject) -> int:
        """The object's open cache file, or -1 when it has none. Opening an existing file is
        done inline (a few microseconds); *creating* one is not (see :meth:`_fd_for_write`)."""
        if obj.fd >= 0 or not obj.file_created:
            return obj.fd
        try:
            obj.fd = os.open(
                os.path.join(self._data_dir, obj.file_name()), os.O_RDWR | os.O_CLOEXEC
            )
        except FileNotFoundError:
            log.warning("cache file of %s vanished; refetching", obj.path)
            self._wipe(obj)
            obj.file_created = False
        return obj.fd

    async def _fd_for_write(self, obj: CachedObject) -> int:
        """The object's cache file, created in a worker thread if needed (file creation took
        0.1-0.3 ms on ext4: too long for the loop). Concurrent callers share one creation."""
        while obj.fd < 0:
            if obj.creating is not None:
                await obj.creating.wait()
                continue
            if self._fd(obj) >= 0:
                break
            ev = obj.creating = trio.Event()
            obj.io += 1
            try:
                obj.fd = await trio.to_thread.run_sync(
                    create_file, self._file_path(obj), obj.size, limiter=self._io_limiter
                )
                obj.file_created = True
            finally:
                obj.io -= 1
                obj.creating = None
                ev.set()
        return obj.fd

    def _file_path(self, obj: CachedObject) -> str:
        return os.path.join(self._data_dir, obj.file_name())

    def _maybe_release(self, obj: CachedObject) -> None:
        """Close the file of an object nobody uses; forget an object with nothing cached."""
        if obj.busy() or obj.dead:
            return
        if obj.fd >= 0:
            os.close(obj.fd)
            obj.fd = -1
        if obj.cached == 0 and obj.have is not None:
            self._drop(obj, evicted=False)

    def _reader_closed(self, reader: CachedReader) -> None:
        obj = reader.obj
        obj.readers.discard(reader)
        self._readers.discard(reader)
        st = reader.stream
        self.stats.prefetch_resets += st.resets
        self.stats.prefetch_window_max = max(self.stats.prefetch_window_max, st.max_window_seen)
        self._budget.poke()  # its queued prefetch parts give up
        self._maybe_release(obj)

    # -- reading ---------------------------------------------------------------------------

    async def _read(
        self,
        obj: CachedObject,
        off: int,
        end: int,
        reader: CachedReader,
        span: tuple[int, int] | None,
    ) -> bytes:
        self.stats.reads += 1
        self._touch(obj)
        bs = self._bs
        b0, b1 = off // bs, (end - 1) // bs + 1
        have = obj.have
        assert have is not None
        if span is None and have.find(0, b0, b1) < 0:
            data = self._read_inline(obj, off, end)
            if data is None:
                data = await self._read_thread(obj, off, end)
            if isinstance(data, bytes):
                return data
        for _ in range(_MAX_ATTEMPTS):
            segments = self._plan(obj, off, end, b0, b1)
            if span is not None:
                self._prefetch(reader, obj, span)
                span = None
            pieces: list[bytes | memoryview] = []
            for s, e, part in segments:
                if part is None:
                    got = self._read_inline(obj, s, e)
                    if got is None:
                        got = await self._read_thread(obj, s, e)
                    if got is False:
                        break
                    pieces.append(got)
                    continue
                if not part.done.is_set():
                    if part.kind is _Kind.PREFETCH:
                        self.stats.prefetch_waits += 1
                    await part.done.wait()
                if part.error is not None:
                    raise part.error
                if part.data is None:
                    break  # stored, not kept in memory: read it from the cache file
                pieces.append(memoryview(part.data)[s - part.start : e - part.start])
                self.stats.miss_bytes += e - s
            else:
                if len(pieces) == 1 and isinstance(pieces[0], bytes):
                    return pieces[0]
                return b"".join(pieces)
        raise OriginError(f"{obj.path}: cache read keeps failing", errno.EIO)

    def _plan(
        self, obj: CachedObject, off: int, end: int, b0: int, b1: int
    ) -> list[tuple[int, int, _Part | None]]:
        """Cut ``[off, end)`` into runs cached on disk (part None) and runs coming from parts,
        starting demand parts for blocks nobody fetches yet."""
        have, inflight, bs = obj.have, obj.inflight, self._bs
        assert have is not None
        out: list[tuple[int, int, _Part | None]] = []
        b = b0
        while b < b1:
            part: _Part | None = None
            if have[b]:
                e = b + 1
                while e < b1 and have[e]:
                    e += 1
                s_byte, e_byte = b * bs, e * bs
            else:
                part = inflight.get(b)
                if part is None:
                    e = b + 1
                    while (
                        e < b1 and e - b < self._part_blocks and not have[e] and e not in inflight
                    ):
                        e += 1
                    part = self._start_part(obj, b, e, _Kind.DEMAND, None)
                elif not part.started and not part.urgent:
                    part.urgent = True
                    self._budget.poke()
                e = part.b1
                s_byte, e_byte = part.start, part.end
            out.append((max(off, s_byte), min(end, e_byte), part))
            b = e
        return out

    def _read_inline(self, obj: CachedObject, s: int, e: int) -> bytes | bool | None:
        """Serve ``[s, e)`` (all present) from the cache file without blocking: the bytes;
        None if the pages are not in memory (read in a thread instead); False if blocks turned
        out missing or corrupt (they are marked absent; plan again)."""
        cs = self._cs
        c0, c1 = s // cs, (e - 1) // cs + 1
        a, z = c0 * cs, min(c1 * cs, obj.size)
        fd = self._fd(obj)
        if fd < 0:
            return False
        n = z - a
        if n > _INLINE_MAX:
            return None  # verifying that much would hold the loop too long: use a thread
        if len(self._scratch) < n:
            self._scratch.close()
            self._scratch = mmap.mmap(-1, max(n, 2 * len(self._scratch)))
        buf = memoryview(self._scratch)[:n]
        if not read_nowait(fd, buf, a):
            return None
        crcs = obj.crcs
        assert crcs is not None
        bad = bad_chunks(buf, c0, cs, crcs[c0:c1])
        if bad:
            self._corrupt(obj, bad)
            return False
        self._count_hit(obj, s, e)
        return bytes(buf[s - a : e - a])

    async def _read_thread(self, obj: CachedObject, s: int, e: int) -> bytes | bool:
        """Like :meth:`_read_inline`, blocking on the disk in a worker thread."""
        cs = self._cs
        c0, c1 = s // cs, (e - 1) // cs + 1
        a, z = c0 * cs, min(c1 * cs, obj.size)
        fd = self._fd(obj)
        if fd < 0:
            return False
        crcs = obj.crcs
        assert crcs is not None
        expected = crcs[c0:c1]
        obj.io += 1
        try:
            data, bad = await trio.to_thread.run_sync(
                read_verify, fd, a, z - a, c0, cs, expected, limiter=self._io_limiter
            )
        finally:
            obj.io -= 1
        if bad:
            self._corrupt(obj, bad)
            return False
        if obj.have is None or obj.have.find(0, s // self._bs, (e - 1) // self._bs + 1) >= 0:
            return False  # evicted while we read (the checksums passed: the bytes were right,
            # but plan again rather than reason about it)
        self._count_hit(obj, s, e)
        return data if (a == s and z == e) else data[s - a : e - a]

    def _count_hit(self, obj: CachedObject, s: int, e: int) -> None:
        self.stats.hit_bytes += e - s
        have = obj.have
        assert have is not None
        b0, b1 = s // self._bs, (e - 1) // self._bs + 1
        if have.find(PREFETCHED, b0, b1) >= 0:
            for b in range(b0, b1):
                if have[b] == PREFETCHED:
                    have[b] = PRESENT
                    self.stats.prefetch_hits += 1

    def _corrupt(self, obj: CachedObject, bad_chunk_indices: list[int]) -> None:
        """Checksum mismatch: the blocks holding these chunks are absent from now on."""
        have = obj.have
        assert have is not None
        per_block = self._bs // self._cs
        freed = 0
        for b in sorted({c // per_block for c in bad_chunk_indices}):
            if have[b]:
                have[b] = 0
                freed += obj.block_len(b)
                self.stats.corrupt_blocks += 1
                log.warning("cache: corrupt block %d of %s; refetching", b, obj.path)
        obj.cached -= freed
        self._used -= freed
        self._dirty_meta.add(obj.key)
        self._dirty_map.add(obj.key)
        self._mark_dirty()

    def _wipe(self, obj: CachedObject) -> None:
        """The cache file is gone: nothing of the object is cached."""
        if obj.have is not None:
            obj.have[:] = bytes(obj.nblocks)
        self._used -= obj.cached
        obj.cached = 0
        self._dirty_meta.add(obj.key)
        self._dirty_map.add(obj.key)
        self._mark_dirty()

    # -- fetching --------------------------------------------------------------------------

    def _prefetch(self, reader: CachedReader, obj: CachedObject, span: tuple[int, int]) -> None:
        have, inflight, bs = obj.have, obj.inflight, self._bs
        assert have is not None
        b0, b1 = span[0] // bs, min(obj.nblocks, (span[1] - 1) // bs + 1)
        for x, y in split_runs(b0, b1, self._part_blocks, lambda b: bool(have[b]) or b in inflight):
            self._start_part(obj, x, y, _Kind.PREFETCH, reader)

    def _start_part(
        self, obj: CachedObject, b0: int, b1: int, kind: _Kind, reader: CachedReader | None
    ) -> _Part:
        assert self._nursery is not None
        part = _Part(obj, b0, b1, kind, reader)
        for b in range(b0, b1):
            obj.inflight[b] = part
        self._nursery.start_soon(self._run_part, part)
        return part

    async def _run_part(self, part: _Part) -> None:
        obj = part.obj
        n = part.end - part.start
        acquired = reserved = 0
        try:
            if part.kind is _Kind.DEMAND:
                self._budget.take(n)
            elif not await self._budget.acquire(
                n, give_up=part.abandoned, urgent=lambda: part.urgent
            ):
                self.stats.prefetch_abandoned += 1
                return
            acquired = n
            async with contextlib.AsyncExitStack() as stack:
                if not part.urgent and part.kind is not _Kind.DEMAND:
                    await stack.enter_async_context(self._parallel)
                if part.abandoned():
                    self.stats.prefetch_abandoned += 1
                    return
                part.started = True
                await self._punches_done(obj)
                fd, create = -1, ""
                if self._reserve(obj, n):
                    reserved = n
                    if (
                        part.b0 == 0
                        and part.b1 == obj.nblocks
                        and obj.fd < 0
                        and not obj.file_created
                        and obj.creating is None
                    ):
                        # the whole object in one part (small files): create the file in the
                        # same worker-thread job as the fetch, saving a thread round trip
                        create = self._file_path(obj)
                        obj.creating = trio.Event()
                    else:
                        try:
                            fd = await self._fd_for_write(obj)
                        except OSError as exc:
                            log.warning("cache: cannot create file for %s: %s", obj.path, exc)
                obj.io += 1
                new_fd = -1
                try:
                    data, crcs, new_fd = await trio.to_thread.run_sync(
                        self._fetch_job,
                        obj.path,
                        obj.version,
                        part.start,
                        n,
                        fd,
                        create,
                        obj.size,
                        limiter=self._origin.limiter,
                    )
                finally:
                    obj.io -= 1
                    if create:
                        if new_fd >= 0:
                            obj.fd, obj.file_created = new_fd, True
                        ev, obj.creating = obj.creating, None
                        ev.set()
            s = self.stats
            s.origin_requests += 1
            s.origin_bytes_read += n
            if part.kind is _Kind.PREFETCH:
                s.prefetch_bytes += n
            if crcs is not None and not obj.dead:
                self._commit(
                    obj,
                    part.b0,
                    part.b1,
                    crcs,
                    PREFETCHED if part.kind is _Kind.PREFETCH else PRESENT,
                )
                reserved = 0
            else:
                s.uncached_bytes += n
            if part.kind is not _Kind.WARM or crcs is None:
                part.data = data
        except trio.Cancelled:
            part.error = OriginError(f"{obj.path}: read path closed", errno.EIO)
            raise
        except Exception as exc:
            part.error = exc
            if part.kind is not _Kind.DEMAND:
                log.debug("%s fetch of %s failed: %s", part.kind.value, obj.path, exc)
        finally:
            if reserved:
                self._used -= reserved
            if acquired:
                self._budget.release(acquired)
            inflight = obj.inflight
            for b in range(part.b0, part.b1):
                if inflight.get(b) is part:
                    del inflight[b]
            part.done.set()
            self._maybe_release(obj)

    @staticmethod
    async def _punches_done(obj: CachedObject) -> None:
        """Wait until hole punches queued for ``obj`` are done, so that one cannot land after
        (and zero) data about to be written into a block that was evicted and is refetched."""
        while obj.punch_done is not None:
            await obj.punch_done.wait()

    def _fetch_job(
        self, path: str, version: str, start: int, n: int, fd: int, create: str, size: int
    ) -> tuple[bytes, array[int] | None, int]:
        """Worker thread: read a range from the origin (retrying transient errors), then
        checksum it and write it into the cache file — ``fd``, or a new file at ``create``
        (of ``size`` bytes) whose descriptor is returned; neither: do not store."""
        sync = self._origin.sync
        data = retry(
            lambda: sync.read_range(path, start, n, version),
            attempts=self._origin.attempts,
            what=f"read {path}",
        )
        if len(data) != n:
            raise Conflict(f"{path}: origin returned {len(data)} of {n} bytes at {start}")
        new_fd = -1
        try:
            if create:
                fd = new_fd = create_file(create, size)
            if fd < 0:
                return data, None, new_fd
            crcs = checksums(data, self._cs)
            allocate(fd, start, n)
            write_all(fd, data, start)
        except OSError as exc:
            log.warning("cache: write to cache file of %s failed: %s", path, exc)
            return data, None, new_fd
        return data, crcs, new_fd

    def _commit(self, obj: CachedObject, b0: int, b1: int, crcs: array[int], mark: int) -> None:
        """Blocks ``[b0, b1)`` are on disk with these chunk checksums; their bytes were reserved."""
        have, ocrcs = obj.have, obj.crcs
        assert have is not None and ocrcs is not None
        c0 = b0 * self._bs // self._cs
        ocrcs[c0 : c0 + len(crcs)] = crcs
        have[b0:b1] = bytes([mark]) * (b1 - b0)
        obj.cached += obj.run_len(b0, b1)
        self._dirty_meta.add(obj.key)
        self._dirty_map.add(obj.key)
        self._mark_dirty()

    # -- space -----------------------------------------------------------------------------

    def _reserve(self, obj: CachedObject, n: int) -> bool:
        """Count ``n`` more bytes as used, evicting to make room; False if there is none."""
        limit = self._space.limit(self._used)
        if self._used + n > limit:
            self._evict_to_fit(n, obj)
            limit = self._space.limit(self._used)
            if self._used + n > limit:
                return False
        self._used += n
        return True

    def _evict_to_fit(self, n: int, exclude: CachedObject | None = None) -> None:
        limit = self._space.limit(self._used)
        need = self._used + n - limit
        if need <= 0:
            return
        need += min(limit // 32, 64 << 20)  # a little extra, so eviction is not per block
        plan = plan_eviction(self._objects.values(), need, exclude)
        for obj in plan.objects:
            self._drop(obj, evicted=True)
        for obj, blocks in plan.blocks:
            self._evict_blocks(obj, blocks)

    def _drop(self, obj: CachedObject, *, evicted: bool) -> None:
        """Forget a whole object nobody uses and delete its file (in the background)."""
        obj.dead = True
        key = obj.key
        if self._objects.get(key) is obj:
            del self._objects[key]
            keys = self._by_path.get(obj.path)
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del self._by_path[obj.path]
        self._used -= obj.cached
        if evicted:
            self.stats.evictions += 1
            self.stats.evicted_bytes += obj.cached
        obj.cached = 0
        self._dirty_meta.discard(key)
        self._dirty_map.discard(key)
        self._deleted.add(key)
        self._mark_dirty()
        if obj.fd >= 0:
            os.close(obj.fd)
            obj.fd = -1
        if obj.file_created:
            self._files_send.send_nowait(("unlink", os.path.join(self._data_dir, obj.file_name())))

    def _evict_blocks(self, obj: CachedObject, blocks: list[int]) -> None:
        have = obj.have
        assert have is not None
        bs = self._bs
        ranges: list[tuple[int, int]] = []
        freed = 0
        for b in blocks:
            have[b] = 0
            n = obj.block_len(b)
            freed += n
            if ranges and ranges[-1][0] + ranges[-1][1] == b * bs:
                ranges[-1] = (ranges[-1][0], ranges[-1][1] + n)
            else:
                ranges.append((b * bs, n))
        obj.cached -= freed
        self._used -= freed
        self.stats.evictions += 1
        self.stats.evicted_bytes += freed
        self._dirty_meta.add(obj.key)
        self._dirty_map.add(obj.key)
        self._mark_dirty()
        fd = self._fd(obj)
        if fd >= 0:
            obj.io += 1
            obj.punches += 1
            if obj.punch_done is None:
                obj.punch_done = trio.Event()
            self._files_send.send_nowait(("punch", obj, ranges))

    # -- background work -------------------------------------------------------------------

    async def _file_worker(self) -> None:
        """Deletes evicted files and punches evicted blocks, off the loop."""
        async for op in self._files_recv:
            ops = [op]
            with contextlib.suppress(trio.WouldBlock):
                while len(ops) < 256:
                    ops.append(self._files_recv.receive_nowait())
            unlinks = [o[1] for o in ops if o[0] == "unlink"]
            if unlinks:
                await self._file_op(("unlinks", unlinks))
            for o in ops:
                if o[0] == "punch":
                    await self._file_op(o)

    async def _file_op(self, op: tuple[Any, ...]) -> None:
        kind = op[0]
        if kind in ("unlink", "unlinks"):
            paths = [op[1]] if kind == "unlink" else op[1]
            try:
                await trio.to_thread.run_sync(_unlink_all, paths, limiter=self._io_limiter)
            except OSError as exc:
                log.warning("cache: cannot delete evicted files: %s", exc)
            self._space.invalidate()
        elif kind == "punch":
            obj, ranges = op[1], op[2]
            try:
                ok = await trio.to_thread.run_sync(punch, obj.fd, ranges, limiter=self._io_limiter)
                if not ok:
                    log.warning("cache: file system cannot punch holes; space is freed late")
            except OSError as exc:
                log.warning("cache: punching %s failed: %s", obj.path, exc)
            finally:
                obj.io -= 1
                obj.punches -= 1
                if obj.punches == 0 and obj.punch_done is not None:
                    obj.punch_done.set()
                    obj.punch_done = None
                self._maybe_release(obj)

    async def _flusher(self) -> None:
        while True:
            await self._dirty_ev.wait()
            await trio.sleep(self._flush_interval)
            try:
                await self.flush()
            except Exception:  # keep the cache serving; the next flush retries
                log.exception("cache index: flush failed")
                await trio.sleep(5)

    async def flush(self) -> None:
        """Write everything changed to the index now (one transaction, in a thread)."""
        async with self._flush_lock:
            if self._index is None:
                return
            self._dirty_ev = trio.Event()
            metas, maps = [], []
            for key in self._dirty_meta:
                obj = self._objects.get(key)
                if obj is not None and obj.cached:
                    metas.append(
                        (
                            key,
                            encode_meta(
                                obj.gen, obj.size, obj.cached, obj.last_used, obj.path, obj.version
                            ),
                        )
                    )
                elif obj is not None:
                    self._deleted.add(key)
            for key in self._dirty_map:
                obj = self._objects.get(key)
                if obj is not None and obj.cached and obj.have is not None and obj.crcs is not None:
                    maps.append((key, encode_map(obj.gen, obj.have, obj.crcs.tobytes())))
            deletes = list(self._deleted)
            self._dirty_meta.clear()
            self._dirty_map.clear()
            self._deleted.clear()
            if not (metas or maps or deletes):
                return
            try:
                await trio.to_thread.run_sync(self._index.write_batch, metas, maps, deletes)
                self.stats.index_flushes += 1
            except Exception:
                log.exception("cache index: write failed; will retry")
                self._dirty_meta.update(k for k, _ in metas)
                self._dirty_map.update(k for k, _ in maps)
                self._deleted.update(deletes)
                self._mark_dirty()

    async def _remove_orphans(self) -> None:
        """Delete cache files the index does not know (left by a crash or a wiped index)."""
        try:
            names = await trio.to_thread.run_sync(
                _list_files, self._data_dir, limiter=self._io_limiter
            )
        except OSError as exc:
            log.warning("cache: cannot list %s: %s", self._data_dir, exc)
            return
        doomed = []
        for path in names:
            stem, _, gen_hex = os.path.basename(path).partition(".")
            try:
                key, gen = bytes.fromhex(stem), int(gen_hex, 16)
            except ValueError:
                continue
            if gen >= self._gen_start:
                continue  # made by this run
            obj = self._objects.get(key)
            if obj is None or obj.gen != gen:
                doomed.append(path)
        if doomed:
            log.info("cache: removing %d orphaned cache files", len(doomed))
            await trio.to_thread.run_sync(_unlink_all, doomed, limiter=self._io_limiter)
            self._space.invalidate()


def _unlink_all(paths: list[str]) -> None:
    for p in paths:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(p)


def _list_files(data_dir: str) -> list[str]:
    out = []
    for sub in os.scandir(data_dir):
        if sub.is_dir(follow_symlinks=False):
            out.extend(e.path for e in os.scandir(sub.path) if e.is_file(follow_symlinks=False))
    return out
