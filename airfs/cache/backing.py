"""Cache files as passthrough backing files: a complete, verified object version's file is
handed to the kernel, which then serves reads and mmap of it without the daemon.

Contract of :class:`BackingFiles.acquire`: it returns a :class:`LocalFile` only when every block
of the version is in its cache file and every checksum chunk of that file was verified since the
file last changed. "Since the file last changed" is judged by the file's size and ``ctime``,
recorded when a full verification succeeded: any write, truncation or hole punch moves
``ctime`` (user space cannot set it back), so a file changed while the daemon was not looking
(a flipped byte between mounts) is read and checked again before it is ever passed through; a
chunk that fails marks its block absent (refetched by the next daemon read) and the open is
served by the daemon. The records are kept in ``<cache_dir>/verified`` (one line per
verification), so a remount does not re-read every cached file.

While a :class:`LocalFile` is held its object is *pinned*: eviction never takes its blocks
(:mod:`airfs.cache.evict` skips pinned objects) and nothing rewrites it. ``release`` unpins.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import trio

from airfs.core.readpath import BackingStats, ObjectRef

from .objects import ObjectTable
from .persist import IndexKeeper
from .store import CachedObject, read_verify

__all__ = ["BackingFiles", "LocalFile", "Verified"]

log = logging.getLogger(__name__)

_VERIFY_STEP = 8 << 20


@dataclass(eq=False)
class LocalFile:
    """A complete, verified cache file: ``fd`` (owned by the cache, valid until ``release``)
    and ``key``, which names this file's content (equal keys: same bytes)."""

    fd: int
    key: str
    release: Callable[[], None]


def verify_file(fd: int, size: int, chunk: int, crcs: list[int]) -> list[int]:
    """Read all ``size`` bytes of ``fd`` and return the indices of chunks whose CRC-32 differs
    from ``crcs`` (blocking: run in a worker thread)."""
    bad: list[int] = []
    step = max(chunk, _VERIFY_STEP // chunk * chunk)
    for off in range(0, size, step):
        n = min(step, size - off)
        c0 = off // chunk
        nchunks = -(-n // chunk)
        _, b = read_verify(fd, off, n, c0, chunk, crcs[c0 : c0 + nchunks])
        bad += b
    return bad


class Verified:
    """Records of fully verified cache files: ``file name -> (size, ctime_ns)``, persisted as
    an append-only text file of ``name size ctime`` lines (the last line of a name wins),
    compacted at :meth:`load` to the files that still exist."""

    def __init__(self, cache_dir: str) -> None:
        self.path = os.path.join(cache_dir, "verified")
        self.data_dir = os.path.join(cache_dir, "data")
        self.records: dict[str, tuple[int, int]] = {}
        #: lines of records made by :meth:`add_soon`, not in the file yet
        self.pending: list[str] = []

    def load(self) -> None:
        """Read and compact the records (blocking: call from a worker thread)."""
        lines = 0
        with contextlib.suppress(OSError), open(self.path, encoding="ascii") as f:
            for line in f:
                lines += 1
                with contextlib.suppress(ValueError):
                    name, size, ctime = line.split()
                    self.records[name] = (int(size), int(ctime))
        for name in list(self.records):
            if not os.path.exists(os.path.join(self.data_dir, name)):
                del self.records[name]
        if lines != len(self.records):
            tmp = self.path + ".tmp"
            with open(tmp, "w", encoding="ascii") as f:
                f.writelines(f"{n} {s} {c}\n" for n, (s, c) in self.records.items())
            os.replace(tmp, self.path)

    def matches(self, name: str, st: os.stat_result) -> bool:
        return self.records.get(name) == (st.st_size, st.st_ctime_ns)

    def forget(self, name: str) -> None:
        """The file ``name`` is being deleted: drop its record from memory (the file's lines
        go at the next :meth:`load`'s compaction)."""
        self.records.pop(name, None)

    def add(self, name: str, st: os.stat_result) -> None:
        """Record ``name`` as verified in state ``st`` (blocking: one appended line)."""
        self.add_soon(name, st)
        self.write_pending()

    def add_soon(self, name: str, st: os.stat_result) -> None:
        """Record ``name`` as verified in state ``st`` now; its line is appended to the file
        by the next :meth:`write_pending` (a record lost in a crash only costs a verification
        after the restart)."""
        self.records[name] = (st.st_size, st.st_ctime_ns)
        self.pending.append(f"{name} {st.st_size} {st.st_ctime_ns}\n")

    def write_pending(self) -> None:
        """Append the lines of the records added since the last call (blocking)."""
        lines, self.pending = self.pending, []
        if lines:
            with open(self.path, "a", encoding="ascii") as f:
                f.writelines(lines)


class BackingFiles:
    """Hands out complete, verified cache files (see the module docstring)."""

    def __init__(
        self,
        cache_dir: str,
        table: ObjectTable,
        keeper: IndexKeeper,
        io_limiter: trio.CapacityLimiter,
        warm: Callable[[CachedObject], Awaitable[int]],
        verified: Verified | None = None,
        settle: Callable[[CachedObject], Awaitable[None]] | None = None,
    ) -> None:
        """``verified``: the records to use (the cache passes the ones its table's
        ``on_dropped`` prunes); a fresh :class:`Verified` of ``cache_dir`` by default.
        ``settle``: waits for an object's parts that are being written into its file."""
        self._table = table
        self._keeper = keeper
        self._limiter = io_limiter
        self._warm = warm
        self._settle = settle
        self.verified = verified if verified is not None else Verified(cache_dir)
        #: counters for ``airfs status``
        self.verifications = 0
        self.verify_failures = 0
        self.fetched_whole = 0
        self._recorded = trio.Event()  # set when records wait for write_pending

    async def run_recorder(self) -> None:
        """Append the verified records made without a thread job (:meth:`_check` of a file
        this cache just wrote whole) in batches, one worker-thread job each, until cancelled;
        what is still pending then is written by :meth:`close`."""
        while True:
            await self._recorded.wait()
            self._recorded = trio.Event()
            try:
                await trio.to_thread.run_sync(self.verified.write_pending, limiter=self._limiter)
            except OSError as exc:
                log.warning("cache: cannot record verified files: %s", exc)

    def close(self) -> None:
        """Write the pending verified records (blocking)."""
        try:
            self.verified.write_pending()
        except OSError as exc:
            log.warning("cache: cannot record verified files: %s", exc)

    def _complete(self, obj: CachedObject) -> bool:
        have = obj.have
        return have is not None and obj.size > 0 and have.find(0) < 0 and not obj.inflight

    async def acquire(self, ref: ObjectRef, *, fetch_max: int = 0) -> LocalFile | None:
        """The cache file of ``ref`` if it is complete and verified (pinned until the returned
        file's ``release``), else None. An object up to ``fetch_max`` bytes that is not
        complete, and that nothing else is filling (an adopt, a warm, a fetch), is fetched
        whole first (one range read for a small file). Origin errors of that fetch
        propagate."""
        if ref.size <= 0:
            return None
        t = self._table
        obj = t.object_for(ref)
        # an adopt (a file this node just committed) or a warm is filling it: let it, rather
        # than race it with fetches from the origin (whose version may be gone already)
        busy = bool(obj.pins or obj.inflight)
        obj.pins += 1
        try:
            await self._keeper.ensure_loaded(obj)
            written = False
            if not self._complete(obj) and ref.size <= fetch_max and not busy:
                t.touch(obj)
                empty = obj.cached == 0
                # every block fetched by this warm, none by anyone else: the file holds the
                # bytes whose checksums were just computed from the fetched buffer
                written = await self._warm(obj) == obj.size and empty
                self.fetched_whole += 1
            if self._settle is not None:
                # parts whose bytes are in but still being written: complete in a moment
                await self._settle(obj)
            if not self._complete(obj) or obj.dead:
                raise LookupError
            fd = t.files.fd(obj)
            if fd < 0:
                raise LookupError
            if not await self._check(obj, fd, written=written):
                raise LookupError
        except LookupError:
            obj.pins -= 1
            t.maybe_release(obj)
            return None
        except BaseException:
            obj.pins -= 1
            t.maybe_release(obj)
            raise
        return self._held(obj, fd)

    def acquire_now(self, ref: ObjectRef) -> LocalFile | None:
        """:meth:`acquire` without waiting (for an open answered inline): the cache file of
        ``ref`` if it is complete, its block map is loaded and its verification is recorded
        for the file as it is now (one ``fstat``), else None; nothing is fetched, loaded or
        verified."""
        if ref.size <= 0:
            return None
        t = self._table
        obj = t.object_for(ref)
        obj.pins += 1
        fd = -1
        if self._complete(obj) and not obj.dead:
            fd = t.files.fd(obj)
        if fd < 0 or not self._verified_now(obj, fd):
            obj.pins -= 1
            t.maybe_release(obj)
            return None
        return self._held(obj, fd)

    def _held(self, obj: CachedObject, fd: int) -> LocalFile:
        """The :class:`LocalFile` of ``obj`` (pinned once by the caller: ``release`` unpins)."""
        t = self._table
        t.touch(obj)
        obj.passed_through = True
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                obj.pins -= 1
                t.maybe_release(obj)

        return LocalFile(fd, f"cache:{obj.file_name()}", release)

    def written(self, obj: CachedObject) -> None:
        """Every byte of the complete ``obj`` was just written into its cache file from
        buffers the cache checksummed (a whole file stored by one part): record the file as
        verified in the state it has now, as an open that fetched it whole does, so that its
        open reads nothing back (and can be answered inline: :meth:`acquire_now`)."""
        fd = self._table.files.fd(obj)
        if fd < 0 or obj.dead:
            return
        st = os.fstat(fd)
        if st.st_size == obj.size:
            self.verified.add_soon(obj.file_name(), st)
            self._recorded.set()

    def _verified_now(self, obj: CachedObject, fd: int) -> bool:
        """The cache file has the object's size and is verified as it is now."""
        st = os.fstat(fd)
        return st.st_size == obj.size and self.verified.matches(obj.file_name(), st)

    async def _check(self, obj: CachedObject, fd: int, *, written: bool = False) -> bool:
        """Whether the complete file ``fd`` of ``obj`` is verified; read and checked when not
        recorded as verified in its state. ``written``: the cache wrote every byte of it just
        now from buffers it checksummed (a small file fetched whole at open): recorded as
        verified in the state it has now, without reading it back."""
        name = obj.file_name()
        st = os.fstat(fd)
        if st.st_size != obj.size:
            return False
        if self.verified.matches(name, st):
            return True
        if written:
            self.verified.add_soon(name, st)
            self._recorded.set()
            return True
        crcs = obj.crcs
        assert crcs is not None
        obj.io += 1
        try:
            self.verifications += 1
            bad = await trio.to_thread.run_sync(
                verify_file, fd, obj.size, obj.chunk_size, list(crcs), limiter=self._limiter
            )
            after = os.fstat(fd)
        finally:
            obj.io -= 1
        if bad:
            self.verify_failures += 1
            log.warning("cache: %s failed verification (%d chunks); refetching", obj.path, len(bad))
            self._table.corrupt(obj, bad)
            return False
        if (after.st_size, after.st_ctime_ns) != (st.st_size, st.st_ctime_ns):
            return False  # changed while we read it: not verified
        try:
            await trio.to_thread.run_sync(self.verified.add, name, after, limiter=self._limiter)
        except OSError as exc:
            log.warning("cache: cannot record verified files: %s", exc)
        return True

    def statistics(self) -> BackingStats:
        return BackingStats(
            backing_verifications=self.verifications,
            backing_verify_failures=self.verify_failures,
            backing_fetched_whole=self.fetched_whole,
        )
