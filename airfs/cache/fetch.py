"""The fetch engine: parts fetched from the origin (or adopted from a local file) into the cache.

A *part* is a run of blocks ``[b0, b1)`` of one object fetched once for everyone who needs it:
while it is in flight every one of its blocks maps to it in ``obj.inflight`` (single flight),
and readers wait on ``part.done`` and are served from ``part.data``. Kinds:

``DEMAND``
    a read waits for it: takes its bytes from the in-flight budget at once;
``PREFETCH``
    requested by a reader's stream ahead of its position: waits for budget and for one of
    ``max_parallel`` slots, and is abandoned if its reader closes or jumps away before it
    starts (unless a read comes to need it: then it is *urgent* and skips both queues);
``WARM``
    :meth:`Fetcher.warm`: the whole object, in parts of ``part_size``;
``ADOPT``
    :meth:`Fetcher.adopt`: copied from a local file, no origin read.

Each part reads the origin in a worker thread (within the origin's limiter; transient errors
are retried by :meth:`~airfs.origin.aio.AsyncOrigin.call`, backing off on the loop; where the
origin has ``buffer_reads``, as a view of its client's buffer: no copy made with the GIL held,
which the trio loop would wait for) which also
checksums the bytes (once: the checksums committed are those of the bytes served) and, for a
part of at most :data:`INLINE_WRITE_MAX` bytes, writes them into the cache file. A bigger part
answers its waiting reads from its buffer as soon as it is checked (``done``), and a second
worker-thread job writes the same buffer into the cache file (``stored``); the blocks are then
committed to the :class:`~airfs.cache.objects.ObjectTable`. When no room can be reserved the
bytes are served but not kept (``uncached_bytes``). Every byte belongs to the part's object
version: an origin that no longer has it raises :class:`~airfs.origin.base.Conflict`.
"""

from __future__ import annotations

import contextlib
import enum
import errno
import logging
import os
from array import array
from collections.abc import Awaitable, Callable

import trio

from ..origin.aio import AsyncOrigin
from ..origin.base import Conflict, OriginError
from .buffers import PartBuffers
from .direct import DirectWriter
from .files import punches_done
from .objects import ObjectTable
from .prefetch import ByteBudget, split_runs
from .reader import CachedReader
from .stats import Counters
from .store import (
    PREFETCHED,
    PRESENT,
    CachedObject,
    allocate,
    checksums,
    copy_into,
    create_file,
    create_whole,
    write_all,
)

__all__ = ["INLINE_WRITE_MAX", "FetchKind", "Fetcher", "Part"]

#: Parts up to this size are written into the cache file by the fetch's own worker-thread job
#: (one thread round trip); bigger ones are answered from memory first and written by a second
#: job (the write of 8 MiB costs more than the extra round trip)
INLINE_WRITE_MAX = 1 << 20

#: Bounce buffers of the parts' ``O_DIRECT`` writes (of ``part_size`` each; write jobs beyond
#: this many wait for one)
DIRECT_BUFFERS = 8

#: Idle part buffers (:class:`~airfs.cache.buffers.PartBuffers`) are unmapped after this long
BUFFERS_IDLE_S = 10.0

log = logging.getLogger(__name__)


class FetchKind(enum.Enum):
    DEMAND = "demand"  # a read is waiting for it
    PREFETCH = "prefetch"  # requested by a reader's stream ahead of its position
    WARM = "warm"  # warm(): fetch whole object
    ADOPT = "adopt"  # adopt(): copied from a local file, no origin read


class Part:
    """A run of blocks ``[b0, b1)`` being fetched (or adopted) once for everyone who needs it.

    ``done`` is set when its bytes are known: then ``error`` is its failure (raised to the
    reads that waited), or ``data`` its checked bytes (None: stored, not kept in memory; read
    the cache file). ``stored`` is set when it ended: its blocks are committed to the table
    (or it failed) and no longer map to it. Between the two a worker thread writes ``data``
    into the cache file while reads of its blocks are answered from ``data``."""

    __slots__ = (
        "b0",
        "b1",
        "data",
        "done",
        "dropped",
        "end",
        "epoch",
        "error",
        "given",
        "held",
        "inline",
        "kind",
        "needed",
        "obj",
        "reader",
        "start",
        "started",
        "stored",
        "urgent",
    )

    def __init__(
        self, obj: CachedObject, b0: int, b1: int, kind: FetchKind, reader: CachedReader | None
    ) -> None:
        self.obj = obj
        self.b0, self.b1 = b0, b1
        self.start = b0 * obj.block_size
        self.end = min(b1 * obj.block_size, obj.size)
        self.kind = kind
        self.reader = reader
        self.epoch = reader.stream.epoch if reader is not None else 0
        self.urgent = False  # a read waits for it: skip the budget queue
        self.needed = kind is not FetchKind.PREFETCH  # must not be abandoned
        self.started = False
        self.done = trio.Event()
        self.stored = trio.Event()
        self.data: bytes | memoryview | None = None
        self.error: BaseException | None = None
        self.held = False  # stored, its buffer kept for its reader (in ``obj.held``)
        #: its bytes, read from the origin already (``Fetcher.store_given``): only stored
        self.given: memoryview | None = None
        #: run in its caller's task (``start_part(spawn=False)``), not the fetcher's
        self.inline = False
        #: an inline part whose caller was cancelled: ended with no error and no bytes, so
        #: that whoever else waited for it plans again (the caller's cancel is not theirs)
        self.dropped = False

    def abandoned(self) -> bool:
        """A prefetch whose reader closed or moved elsewhere before it started."""
        if self.needed or self.urgent:
            return False
        r = self.reader
        return r is None or r.closed or r.stream.epoch != self.epoch


class Fetcher:
    """Starts and runs parts for one cache. :meth:`run` must be running (it owns the parts'
    tasks) before :meth:`start_part` is called; cancelling it ends parts in flight with an
    :class:`OriginError` (EIO) for their waiters."""

    def __init__(
        self,
        origin: AsyncOrigin,
        table: ObjectTable,
        stats: Counters,
        io_limiter: trio.CapacityLimiter,
        *,
        part_size: int,
        inflight_budget: int,
        max_parallel: int,
    ) -> None:
        self._origin = origin
        self._table = table
        self._files = table.files
        self._stats = stats
        self._io_limiter = io_limiter
        self._cs = table.chunk_size
        self.part_blocks = max(1, part_size // table.block_size)
        self.budget = ByteBudget(inflight_budget)
        self._parallel = trio.CapacityLimiter(max_parallel)
        self._direct = DirectWriter(part_size, DIRECT_BUFFERS)
        self.buffers = PartBuffers(part_size, max(1, inflight_budget // part_size))
        self._held_max = inflight_budget // 2
        self.held_bytes = 0
        self._held: dict[int, Part] = {}  # id -> part kept (a few dozen at most)
        self._nursery: trio.Nursery | None = None

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Host the parts' tasks until cancelled."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            while True:  # give back the memory of part buffers no longer needed
                await trio.sleep(BUFFERS_IDLE_S / 2)
                if self.buffers.idle:  # unmapping 512 MiB takes ~4 ms: not on the loop
                    await trio.to_thread.run_sync(self.buffers.trim, BUFFERS_IDLE_S)

    def spawn(self, fn: Callable[..., Awaitable[object]], *args: object) -> None:
        """Run ``fn(*args)`` in the background with the parts (cancelled with them)."""
        assert self._nursery is not None, "Fetcher.run is not running"
        self._nursery.start_soon(fn, *args)

    async def store_given(self, obj: CachedObject, data: memoryview) -> Part:
        """Store ``data``, the whole content of the loaded, pinned, empty ``obj`` read from
        the origin already, as a whole-file fetch would (checksummed and written into a new
        cache file by one worker-thread job), in the caller's task; no origin read, no budget
        wait. Returns the part, stored (``error`` None) or not."""
        part = self.start_part(obj, 0, obj.nblocks, FetchKind.WARM, None, given=data, spawn=False)
        await self._run_part(part, slot=False)
        return part

    def start_part(
        self,
        obj: CachedObject,
        b0: int,
        b1: int,
        kind: FetchKind,
        reader: CachedReader | None,
        *,
        given: memoryview | None = None,
        spawn: bool = True,
    ) -> Part:
        """Claim blocks ``[b0, b1)`` (none may be in flight) and fetch them in the background
        (``given``: their bytes, to store only). ``spawn=False``: the caller runs it at once
        (``await _run_part(part)``, nothing awaited in between)."""
        assert self._nursery is not None, "Fetcher.run is not running"
        part = Part(obj, b0, b1, kind, reader)
        part.given = given
        part.inline = not spawn
        for b in range(b0, b1):
            obj.inflight[b] = part
        if spawn:
            self._nursery.start_soon(self._run_part, part)
        return part

    def prefetch(self, reader: CachedReader, obj: CachedObject, span: tuple[int, int]) -> None:
        """Start prefetch parts for the blocks of byte range ``span`` not cached or in flight."""
        have, inflight, bs = obj.have, obj.inflight, self._table.block_size
        assert have is not None
        b0, b1 = span[0] // bs, min(obj.nblocks, (span[1] - 1) // bs + 1)
        for x, y in split_runs(b0, b1, self.part_blocks, lambda b: bool(have[b]) or b in inflight):
            self.start_part(obj, x, y, FetchKind.PREFETCH, reader)

    async def _run_part(self, part: Part, *, slot: bool = True) -> None:
        """Fetch (or store) ``part``; ``slot=False``: not within the ``max_parallel`` slots
        (a caller that bounds its own concurrency: a warm's jobs)."""
        obj = part.obj
        n = part.end - part.start
        s = self._stats
        t = self._table
        acquired = reserved = 0
        try:
            if part.kind is FetchKind.DEMAND or part.given is not None:
                self.budget.take(n)
            elif not await self.budget.acquire(
                n, give_up=part.abandoned, urgent=lambda: part.urgent
            ):
                s.prefetch_abandoned += 1
                return
            acquired = n
            async with contextlib.AsyncExitStack() as stack:
                if (
                    slot
                    and not part.urgent
                    and part.kind is not FetchKind.DEMAND
                    and part.given is None
                ):
                    await stack.enter_async_context(self._parallel)
                if part.abandoned():
                    s.prefetch_abandoned += 1
                    return
                part.started = True
                await punches_done(obj)
                fd, create = -1, ""
                if t.reserve(obj, n):
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
                        create = self._files.path(obj)
                        obj.creating = trio.Event()
                    else:
                        try:
                            fd = await self._files.fd_for_write(obj)
                        except OSError as exc:
                            log.warning("cache: cannot create file for %s: %s", obj.path, exc)
                obj.io += 1
                new_fd = -1
                # small parts (and files created by the fetch) are written in the fetch's
                # own thread job; bigger ones after their waiters are answered
                inline = bool(create) or n <= INLINE_WRITE_MAX
                try:
                    if part.given is not None:
                        data, crcs, new_fd = await trio.to_thread.run_sync(
                            self._store_job,
                            part.given,
                            obj.path,
                            part.start,
                            fd,
                            create,
                            obj.size,
                            inline,
                            limiter=self._io_limiter,
                        )
                    else:
                        # one job per attempt, retried by the origin's one policy (backoff
                        # on the loop, outside the origin's limiter)
                        data, crcs, new_fd = await self._origin.call(
                            self._fetch_job,
                            obj.path,
                            obj.version,
                            part.start,
                            n,
                            fd,
                            create,
                            obj.size,
                            inline,
                            what=f"read {obj.path}",
                            op="read",
                            abandon=False,  # it may be writing the cache file
                            marks_down=True,
                        )
                finally:
                    obj.io -= 1
                    if create:
                        if new_fd >= 0:
                            obj.fd, obj.file_created = new_fd, True
                        ev, obj.creating = obj.creating, None
                        ev.set()
                s.origin_requests += 1
                s.origin_bytes_read += n
                if part.kind is FetchKind.PREFETCH:
                    s.prefetch_bytes += n
                write_later = not inline and fd >= 0 and crcs is not None
            if write_later:
                # the bytes are checked: the reads waiting for them are answered from this
                # buffer now, while a worker thread writes it into the cache file (the
                # blocks stay in flight, mapped to this part, until it is written)
                part.data = data
                part.done.set()
                obj.io += 1
                try:
                    stored = await trio.to_thread.run_sync(
                        self._write_job, obj.path, fd, data, part.start, limiter=self._io_limiter
                    )
                finally:
                    obj.io -= 1
                if not stored:
                    crcs = None
            if crcs is not None and not obj.dead:
                mark = PREFETCHED if part.kind is FetchKind.PREFETCH else PRESENT
                t.commit(obj, part.b0, part.b1, crcs, mark)
                reserved = 0
                if write_later and self._holds(part, n):
                    acquired = 0  # the budget goes with the buffer: release_held
            else:
                s.uncached_bytes += n
            # a warmed part that is stored is not kept in memory: later reads take the file
            part.data = None if part.kind is FetchKind.WARM and crcs is not None else data
        except trio.Cancelled:
            if not part.done.is_set():
                if part.inline:
                    part.dropped = True
                else:
                    part.error = OriginError(f"{obj.path}: read path closed", errno.EIO)
            raise
        except Exception as exc:
            if not part.done.is_set():
                part.error = exc
            if part.kind is not FetchKind.DEMAND:
                log.debug("%s fetch of %s failed: %s", part.kind.value, obj.path, exc)
        finally:
            if reserved:
                t.used -= reserved
            if acquired:
                self.budget.release(acquired)
            inflight = obj.inflight
            for b in range(part.b0, part.b1):
                if inflight.get(b) is part:
                    del inflight[b]
            part.done.set()
            part.stored.set()
            t.maybe_release(obj)

    def _holds(self, part: Part, n: int) -> bool:
        """Keep the buffer of the stored prefetch ``part`` (``n`` bytes, within the in-flight
        budget) for its reader, who is about to read it: its blocks are then served from
        memory, not read back from the cache file (whose pages the direct write did not
        fill). At most half the budget is held; False when this part is not."""
        r = part.reader
        if part.kind is not FetchKind.PREFETCH or r is None or r.closed:
            return False
        if not self._direct.enabled:
            return False  # the page cache has its bytes: read them back from there
        passed = r.stream.last_offset
        for p in [p for p in self._held.values() if p.reader is r and p.end <= passed]:
            self.release_held(p)  # read past without reading its end (or it skipped ahead)
        if r.stream.last_end >= part.end or self.held_bytes + n > self._held_max:
            return False  # read while in flight: nobody is about to read it
        part.held = True
        self.held_bytes += n
        self._held[id(part)] = part
        held = part.obj.held
        for b in range(part.b0, part.b1):
            held[b] = part
        return True

    @property
    def direct_write_bytes(self) -> int:
        """Bytes written into cache files with ``O_DIRECT`` so far."""
        return self._direct.direct_bytes

    def release_held(self, part: Part) -> None:
        """Stop keeping ``part``'s buffer (read to its end, or its reader closed): its
        blocks are read from the cache file again and its budget is given back."""
        if not part.held:
            return
        part.held = False
        del self._held[id(part)]
        held = part.obj.held
        for b in range(part.b0, part.b1):
            if held.get(b) is part:
                del held[b]
        n = part.end - part.start
        self.held_bytes -= n
        self.budget.release(n)
        part.data = None

    def release_reader(self, reader: CachedReader) -> None:
        """Release every buffer kept for ``reader`` (it closed)."""
        for p in [p for p in self._held.values() if p.reader is reader]:
            self.release_held(p)

    def _fetch_job(
        self,
        path: str,
        version: str,
        start: int,
        n: int,
        fd: int,
        create: str,
        size: int,
        store: bool,
    ) -> tuple[bytes | memoryview, array[int] | None, int]:
        """Worker thread, one attempt: read a range from the origin and checksum it; with
        ``store``, write it into the cache file too — ``fd``, or a new file at ``create`` (of
        ``size`` bytes) whose descriptor is returned. The checksums are None when the bytes
        are not to be stored (neither ``fd`` nor ``create``, or the write failed)."""
        sync = self._origin.sync
        caps = sync.capabilities
        data: bytes | memoryview
        if caps.into_reads and not create and INLINE_WRITE_MAX < n <= self.buffers.size:
            # a big part: into a reused, page-aligned buffer (no new pages, no bounce copy)
            buf = self.buffers.lease(n)
            got = sync.read_range_into(path, start, buf, version)  # type: ignore[attr-defined]
            data = buf[:got].toreadonly()
            del buf
        elif caps.buffer_reads:  # a view of the client's buffer: no copy into a bytes
            data = sync.read_range_buffer(path, start, n, version)  # type: ignore[attr-defined]
        else:
            data = sync.read_range(path, start, n, version)
        if len(data) != n:
            raise Conflict(f"{path}: origin returned {len(data)} of {n} bytes at {start}")
        return self._store_job(data, path, start, fd, create, size, store)

    def _store_job(
        self,
        data: bytes | memoryview,
        path: str,
        start: int,
        fd: int,
        create: str,
        size: int,
        store: bool,
    ) -> tuple[bytes | memoryview, array[int] | None, int]:
        """Worker thread: :meth:`_fetch_job`'s half after the origin read, for ``data``
        read at ``start`` (also what stores the bytes of :meth:`store_given`)."""
        new_fd = -1
        try:
            if create and store and start == 0 and len(data) == size:
                # the whole object: created and written in one go (no ftruncate, fallocate)
                crcs = checksums(data, self._cs)
                new_fd, failed = create_whole(create, data, size)
                if failed is not None:
                    raise failed
                return data, crcs, new_fd
            if create:
                fd = new_fd = create_file(create, size)
            if fd < 0:
                return data, None, new_fd
            crcs = checksums(data, self._cs)
            if store:
                allocate(fd, start, len(data))
                write_all(fd, data, start)
        except OSError as exc:
            log.warning("cache: write to cache file of %s failed: %s", path, exc)
            return data, None, new_fd
        return data, crcs, new_fd

    def _write_job(self, path: str, fd: int, data: bytes | memoryview, start: int) -> bool:
        """Worker thread: write checked bytes into the cache file (bypassing the page cache
        where it can: :mod:`airfs.cache.direct`); False if that failed."""
        try:
            allocate(fd, start, len(data))
            self._direct.write(fd, data, start)
        except OSError as exc:
            log.warning("cache: write to cache file of %s failed: %s", path, exc)
            return False
        return True

    # -- whole objects ---------------------------------------------------------------------

    async def settle(self, obj: CachedObject) -> None:
        """Wait until the parts of ``obj`` whose bytes are in (``done``) are written into the
        cache file and committed (``stored``): a few milliseconds at most, no origin wait."""
        writing = {id(p): p for p in obj.inflight.values() if p.done.is_set()}
        for p in writing.values():
            await p.stored.wait()

    async def warm(self, obj: CachedObject, *, urgent: bool = False) -> int:
        """Fetch every block of the loaded, pinned ``obj`` not cached yet (waiting for parts
        already in flight); the bytes this call read from the origin. Raises the first error
        of any part waited for. ``urgent``: an open waits for it (a small file fetched whole
        at open): its parts skip the budget queue and the prefetch slots, as a read's do.
        A part of another caller's that was dropped (:attr:`Part.dropped`) is planned again."""
        fetched = 0
        while True:
            got, again = await self._warm_once(obj, urgent)
            fetched += got
            if not again:
                self._stats.warm_bytes += fetched
                return fetched

    async def _warm_once(self, obj: CachedObject, urgent: bool) -> tuple[int, bool]:
        """:meth:`warm`'s one plan: the bytes it fetched, and whether a part it waited for
        was dropped (plan again)."""
        have, inflight = obj.have, obj.inflight
        assert have is not None
        theirs: dict[int, Part] = {}
        for p in inflight.values():
            p.needed = True
            theirs[id(p)] = p
        runs = list(
            split_runs(0, obj.nblocks, self.part_blocks, lambda b: bool(have[b]) or b in inflight)
        )
        if len(runs) == 1 and not theirs:
            # one part and no one else's (a small file): run it in this task, no task nor
            # event between the caller and its fetch (a cancelled warm ends its fetch too)
            part = self.start_part(obj, *runs[0], FetchKind.WARM, None, spawn=False)
            part.urgent = urgent
            await self._run_part(part, slot=False)
            if part.error is not None:
                raise part.error
            return part.end - part.start, False
        mine = [self.start_part(obj, b0, b1, FetchKind.WARM, None) for b0, b1 in runs]
        if urgent:
            for p in [*mine, *theirs.values()]:
                if not p.started:
                    p.urgent = True
            if theirs:
                self.budget.poke()
        error: BaseException | None = None
        for p in [*mine, *theirs.values()]:
            await p.stored.wait()
            if p.error is not None and error is None:
                error = p.error
        if error is not None:
            raise error
        return sum(p.end - p.start for p in mine), any(p.dropped for p in theirs.values())

    async def adopt(self, obj: CachedObject, local_file: str, size: int) -> bool:
        """Copy ``local_file`` (``size`` bytes, already checked) into the loaded, pinned
        ``obj``'s blocks that are not cached or in flight. False when there is no room."""
        t = self._table
        have, inflight = obj.have, obj.inflight
        assert have is not None
        runs = list(split_runs(0, obj.nblocks, 1 << 62, lambda b: bool(have[b]) or b in inflight))
        if not runs:
            return True
        nbytes = sum(obj.run_len(b0, b1) for b0, b1 in runs)
        if not t.reserve(obj, nbytes):
            return False
        whole = obj.cached == 0 and not inflight and runs == [(0, obj.nblocks)]
        parts = [Part(obj, b0, b1, FetchKind.ADOPT, None) for b0, b1 in runs]
        for p in parts:
            p.started = True
            for b in range(p.b0, p.b1):
                inflight[b] = p
        reserved = nbytes
        try:
            await punches_done(obj)
            fd = await self._files.fd_for_write(obj)
            obj.io += 1
            try:
                crcs = await trio.to_thread.run_sync(
                    self._adopt_job,
                    local_file,
                    size,
                    fd,
                    [(p.start, p.end - p.start) for p in parts],
                    whole,
                    limiter=self._io_limiter,
                )
            finally:
                obj.io -= 1
            for p, c in zip(parts, crcs, strict=True):
                t.commit(obj, p.b0, p.b1, c, PRESENT)
            reserved = 0
            self._stats.adopted_bytes += nbytes
            return True
        finally:
            # reads waiting on these blocks plan again: they find them cached, or (if
            # adopting failed) fetch them; an adopt failure is never theirs
            t.used -= reserved
            for p in parts:
                for b in range(p.b0, p.b1):
                    if inflight.get(b) is p:
                        del inflight[b]
                p.done.set()
                p.stored.set()

    def _adopt_job(
        self, local_file: str, size: int, fd: int, ranges: list[tuple[int, int]], whole: bool
    ) -> list[array[int]]:
        actual = os.stat(local_file).st_size
        if actual != size:
            raise ValueError(f"{local_file}: {actual} bytes, expected {size}")
        return copy_into(local_file, fd, ranges, whole, self._cs)
