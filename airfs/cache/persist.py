"""Persistence of the object table: loading the index, batched flushes, block maps, orphans.

:class:`IndexKeeper` mirrors the :class:`~airfs.cache.objects.ObjectTable` to the LMDB
:class:`~airfs.cache.index.CacheIndex`. At open (in a worker thread) it installs every object
the index knows, without its block map; :meth:`IndexKeeper.ensure_loaded` reads an object's map
on first use. Changes are not written as they happen: the table's dirty marks are collected
and written in one transaction per ``flush_interval`` (:meth:`IndexKeeper.run_flusher`), and
once more at :meth:`IndexKeeper.close`. A failed write keeps the marks, so the next flush
retries it. :meth:`IndexKeeper.remove_orphans` deletes cache files the index does not know
(left by a crash or a wiped index).
"""

from __future__ import annotations

import logging
import os
from array import array

import trio

from .index import CacheIndex, decode_map, encode_map, encode_meta
from .objects import ObjectTable
from .stats import Counters
from .store import CachedObject

__all__ = ["IndexKeeper"]

log = logging.getLogger(__name__)

_NONZERO = bytes([0] + [1] * 255)  # bytes.translate table: any non-zero byte -> 1


class IndexKeeper:
    """Keeps ``table`` and the index at ``cache_dir`` in step (see the module docstring)."""

    def __init__(
        self,
        cache_dir: str,
        table: ObjectTable,
        stats: Counters,
        io_limiter: trio.CapacityLimiter,
        *,
        flush_interval: float,
    ) -> None:
        self.cache_dir = cache_dir
        self._table = table
        self._stats = stats
        self._io_limiter = io_limiter
        self._flush_interval = flush_interval
        self._flush_lock = trio.Lock()
        self._index: CacheIndex | None = None
        #: block maps asked for while a load job runs: they go together in the next job
        self._batch: list[CachedObject] | None = None
        self._batch_done = trio.Event()
        #: set when the load job in flight ends (None: none in flight)
        self._job_done: trio.Event | None = None

    def open(self) -> None:
        """Open the index (taking the directory's lock) and load the object table from it.
        Blocking: call from a worker thread. Raises what :class:`CacheIndex` raises."""
        t = self._table
        index = CacheIndex(self.cache_dir, block_size=t.block_size, chunk_size=t.chunk_size)
        try:
            records = index.load_objects()
            t.files.make_dirs()
        except BaseException:
            index.close()
            raise
        self._index = index
        t.load(records)

    async def close(self) -> None:
        """Write what is pending (errors are logged) and close the index."""
        try:
            await self.flush()
        except Exception:
            log.exception("cache index: final flush failed")
        if self._index is not None:
            index, self._index = self._index, None
            await trio.to_thread.run_sync(index.close)

    async def run_flusher(self) -> None:
        """Forever: after something changed, wait ``flush_interval`` and flush."""
        while True:
            await self._table.dirty_ev.wait()
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
            t = self._table
            t.dirty_ev = trio.Event()
            metas, maps = [], []
            for key in t.dirty_meta:
                obj = t.objects.get(key)
                if obj is not None and obj.cached:
                    meta = encode_meta(
                        obj.gen, obj.size, obj.cached, obj.last_used, obj.path, obj.version
                    )
                    metas.append((key, meta))
                elif obj is not None:
                    t.deleted.add(key)
            for key in t.dirty_map:
                obj = t.objects.get(key)
                if obj is not None and obj.cached and obj.have is not None and obj.crcs is not None:
                    maps.append((key, encode_map(obj.gen, obj.have, obj.crcs.tobytes())))
            deletes = list(t.deleted)
            t.dirty_meta.clear()
            t.dirty_map.clear()
            t.deleted.clear()
            if not (metas or maps or deletes):
                return
            try:
                await trio.to_thread.run_sync(self._index.write_batch, metas, maps, deletes)
                self._stats.index_flushes += 1
            except Exception:
                log.exception("cache index: write failed; will retry")
                t.dirty_meta.update(k for k, _ in metas)
                t.dirty_map.update(k for k, _ in maps)
                t.deleted.update(deletes)
                t.mark_dirty()

    # -- block maps ------------------------------------------------------------------------

    async def ensure_loaded(self, obj: CachedObject) -> None:
        """Load the block map of an object known from the index (once, in a thread). A map
        that cannot be read (or whose file is gone) leaves the object empty: it is refetched.

        One load job runs at a time; the maps asked for meanwhile are collected and loaded
        together by the next job (the first opens after a restart, many at once, cost one
        worker-thread round trip per batch instead of one each)."""
        while obj.have is None:
            if obj.loading is not None:
                await obj.loading.wait()
                continue
            if self._batch is not None:  # a batch is collecting: join it
                self._batch.append(obj)
                obj.loading = self._batch_done
                continue
            batch, done = [obj], trio.Event()
            self._batch, self._batch_done, obj.loading = batch, done, done
            try:
                while self._job_done is not None:
                    await self._job_done.wait()
            except BaseException:  # cancelled before its job: the others ask again
                self._batch = None
                for o in batch:
                    o.loading = None
                done.set()
                raise
            self._batch = None
            await self._load_batch(batch, done)

    async def load_many(self, objs: list[CachedObject]) -> None:
        """Load the block maps of those of ``objs`` not loaded or being loaded, in one job
        (after the one in flight): what :meth:`ensure_loaded` would do for each, ahead of
        their opens."""
        batch = [o for o in objs if o.have is None and o.loading is None]
        if not batch:
            return
        done = trio.Event()
        for o in batch:
            o.loading = done
        try:
            while self._job_done is not None:
                await self._job_done.wait()
        except BaseException:  # cancelled before its job: each is loaded when used
            for o in batch:
                o.loading = None
            done.set()
            raise
        await self._load_batch(batch, done)

    async def _load_batch(self, batch: list[CachedObject], done: trio.Event) -> None:
        job_done = self._job_done = trio.Event()
        got: list[tuple[bytes | None, bool]] = [(None, False)] * len(batch)
        ended = False  # else (interrupted) nothing is installed: the objects are asked again
        try:
            self._stats.index_map_loads += 1
            got = await trio.to_thread.run_sync(
                self._load_maps_job, batch, limiter=self._io_limiter
            )
            ended = True
        except Exception:
            log.exception("cache index: cannot load %d block map(s)", len(batch))
            ended = True
        finally:
            self._job_done = None
            job_done.set()
            for o, (raw, exists) in zip(batch, got, strict=True):
                try:
                    if ended:
                        self._install_map(o, raw, exists)
                finally:
                    o.loading = None
            done.set()

    def _load_maps_job(self, batch: list[CachedObject]) -> list[tuple[bytes | None, bool]]:
        assert self._index is not None
        out: list[tuple[bytes | None, bool]] = []
        for obj in batch:
            try:
                raw = self._index.load_map(obj.key)
                exists = os.path.exists(self._table.files.path(obj))
            except Exception:
                log.exception("cache index: cannot load %s", obj.path)
                raw, exists = None, False
            out.append((raw, exists))
        return out

    def install_new(self, obj: CachedObject) -> None:
        """``obj`` was not in the table (every object of the index is, from its start), so the
        index holds no map of it: its empty map is installed inline, with no load job."""
        if obj.have is None and obj.loading is None:
            self._install_map(obj, None, False)

    def _install_map(self, obj: CachedObject, raw: bytes | None, exists: bool) -> None:
        if obj.have is not None:
            return
        t = self._table
        have = bytearray(obj.nblocks)
        crcs = array("I", bytes(4 * obj.nchunks))
        dec = decode_map(raw, obj.nblocks, obj.nchunks) if raw is not None and exists else None
        if dec is not None and dec[0] == obj.gen:
            have = bytearray(dec[1]).translate(_NONZERO)
            crcs = array("I")
            crcs.frombytes(dec[2])
        cached = have.count(1) * t.block_size
        if obj.nblocks and have[-1]:
            cached -= t.block_size - obj.block_len(obj.nblocks - 1)
        obj.have, obj.crcs = have, crcs
        if not exists:
            obj.file_created = False
        if cached != obj.cached:
            t.used += cached - obj.cached
            obj.cached = cached
            t.changed(obj)

    # -- orphans ---------------------------------------------------------------------------

    async def remove_orphans(self) -> None:
        """Delete cache files the index does not know (left by a crash or a wiped index).
        Files made by this run are never touched."""
        t = self._table
        try:
            names = await t.files.list_files()
        except OSError as exc:
            log.warning("cache: cannot list %s: %s", t.files.data_dir, exc)
            return
        doomed = []
        for path in names:
            stem, _, gen_hex = os.path.basename(path).partition(".")
            try:
                key, gen = bytes.fromhex(stem), int(gen_hex, 16)
            except ValueError:
                continue
            if gen >= t.gen_start:
                continue  # made by this run
            obj = t.objects.get(key)
            if obj is None or obj.gen != gen:
                doomed.append(path)
        if doomed:
            log.info("cache: removing %d orphaned cache files", len(doomed))
            await t.files.unlink_all(doomed)
