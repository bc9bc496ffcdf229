"""The object table: every cached object version in LRU order, and the space it takes.

:class:`ObjectTable` is the one owner of the bytes-used count and of the *dirty marks* that
tell the index writer (:mod:`airfs.cache.persist`) what changed. Every change to what is cached
goes through it: a fetch reserves room (:meth:`ObjectTable.reserve`, evicting to make it: see
:mod:`airfs.cache.evict`) and commits blocks (:meth:`ObjectTable.commit`), a checksum failure
marks blocks absent (:meth:`ObjectTable.corrupt`), an object nobody uses and that holds nothing
is forgotten (:meth:`ObjectTable.maybe_release`), and so are the versions the origin no longer
has at their path (:meth:`ObjectTable.discard_path`: the table holds only what can still be
read, so its size follows the files that exist, not every file ever seen). Invariant: ``used``
is the sum of the ``cached`` bytes of the objects in the table plus the reservations of fetches
in flight.

Everything here runs on the trio loop and never blocks: file deletions and hole punches are
queued to :class:`~airfs.cache.files.CacheFiles`.
"""

from __future__ import annotations

import logging
import time
from array import array
from collections import OrderedDict
from collections.abc import Callable, Iterable

import trio

from airfs.core.readpath import ObjectRef

from .evict import SpaceLimit, plan_eviction
from .files import CacheFiles
from .index import ObjectRecord
from .stats import Counters
from .store import CachedObject, object_key

__all__ = ["ObjectTable"]

log = logging.getLogger(__name__)


class ObjectTable:
    """Cached objects by key (least recently used first) and by path, bytes used, dirty marks.

    ``space`` may be replaced (tests do, to simulate a filling disk); ``files`` is the table's
    own :class:`CacheFiles` for ``data_dir``."""

    def __init__(
        self,
        data_dir: str,
        *,
        block_size: int,
        chunk_size: int,
        space: SpaceLimit,
        stats: Counters,
        io_limiter: trio.CapacityLimiter,
        on_dropped: Callable[[CachedObject], None] | None = None,
    ) -> None:
        """``on_dropped(obj)`` is called for every object forgotten (evicted, released empty,
        discarded as stale), on the loop, before its file is queued for deletion."""
        self.block_size = block_size
        self._on_dropped = on_dropped
        self.chunk_size = chunk_size
        self.space = space
        self.stats = stats
        self.objects: OrderedDict[bytes, CachedObject] = OrderedDict()  # LRU first
        self.by_path: dict[str, set[bytes]] = {}
        self.used = 0  # bytes of present blocks + reservations
        self.gen = 0  # generation of the newest object (unique per cache file incarnation)
        self.gen_start = 0  # first generation of this run: older files may be orphans
        #: keys whose metadata / block map must be (re)written, and keys to delete, at the
        #: next index flush; ``dirty_ev`` is set while any is waiting
        self.dirty_meta: set[bytes] = set()
        self.dirty_map: set[bytes] = set()
        self.deleted: set[bytes] = set()
        self.dirty_ev = trio.Event()
        self.files = CacheFiles(
            data_dir,
            io_limiter,
            on_vanished=self.wipe,
            on_punched=self.maybe_release,
            on_freed=self._freed,
        )

    def _freed(self) -> None:
        self.space.invalidate()

    # -- contents --------------------------------------------------------------------------

    def load(self, records: Iterable[ObjectRecord]) -> None:
        """Install the objects the index knows (block maps load later, on first use)."""
        max_gen = 0
        for r in records:
            obj = CachedObject(
                r.key, r.path, r.version, r.size, r.gen, self.block_size, self.chunk_size,
                cached=r.cached, last_used=r.last_used, loaded=False,
            )  # fmt: skip
            self.objects[r.key] = obj
            self.by_path.setdefault(r.path, set()).add(r.key)
            self.used += r.cached
            max_gen = max(max_gen, r.gen)
        self.gen = self.gen_start = max(time.time_ns(), max_gen + 1)

    def object_for(self, ref: ObjectRef) -> CachedObject:
        """The object of version ``ref`` (a new, empty one if not cached)."""
        key = object_key(ref.path, ref.version)
        obj = self.objects.get(key)
        if obj is not None and obj.size != ref.size:
            log.warning("%s@%s: size changed under one version tag", ref.path, ref.version)
            if not obj.busy():
                self.drop(obj, evicted=False)
                obj = None
        if obj is not None:
            obj.stale = False  # wanted again: this version is (again) what the path holds
        else:
            self.gen += 1
            obj = CachedObject(
                key, ref.path, ref.version, ref.size, self.gen, self.block_size, self.chunk_size,
                last_used=time.time_ns(),
            )  # fmt: skip
            self.objects[key] = obj
            self.by_path.setdefault(ref.path, set()).add(key)
        return obj

    def demote_other_versions(self, obj: CachedObject) -> None:
        """Other versions of ``obj``'s path that nobody reads are stale: evict them first."""
        for key in self.by_path.get(obj.path, ()):
            other = self.objects[key]
            if other is not obj and not other.readers:
                self.objects.move_to_end(key, last=False)

    def discard_path(self, path: str, keep: str | None = None) -> int:
        """The origin no longer has the versions of ``path`` other than ``keep`` (None: the
        path is gone): forget them. An object nobody uses is dropped now (its file deleted in
        the background); one in use (an open handle of a file unlinked while open, a pinned
        backing file, a fetch) is marked stale, still served, and dropped at its last release
        (:meth:`maybe_release`). Returns how many were dropped now. Cost: the versions of
        ``path`` only."""
        dropped = 0
        for key in list(self.by_path.get(path, ())):
            obj = self.objects[key]
            if obj.version == keep:
                continue
            if obj.busy():
                obj.stale = True
                self.objects.move_to_end(key, last=False)  # first to go if space is needed
            else:
                self.drop(obj, evicted=False)
                dropped += 1
        return dropped

    def touch(self, obj: CachedObject) -> None:
        """``obj`` was used now (most recently used; its new time is persisted)."""
        obj.last_used = time.time_ns()
        self.objects.move_to_end(obj.key)
        if obj.cached:
            self.dirty_meta.add(obj.key)
            self.mark_dirty()

    def mark_dirty(self) -> None:
        if not self.dirty_ev.is_set():
            self.dirty_ev.set()

    def changed(self, obj: CachedObject) -> None:
        """``obj``'s metadata and block map must be written at the next flush."""
        self.dirty_meta.add(obj.key)
        self.dirty_map.add(obj.key)
        self.mark_dirty()

    def pending(self) -> int:
        """Objects not yet written to the index."""
        return len(self.dirty_meta) + len(self.deleted)

    def commit(self, obj: CachedObject, b0: int, b1: int, crcs: array[int], mark: int) -> None:
        """Blocks ``[b0, b1)`` are on disk with these chunk checksums; their bytes were
        reserved (the reservation becomes their ``cached`` bytes)."""
        have, ocrcs = obj.have, obj.crcs
        assert have is not None and ocrcs is not None
        c0 = b0 * self.block_size // self.chunk_size
        ocrcs[c0 : c0 + len(crcs)] = crcs
        have[b0:b1] = bytes([mark]) * (b1 - b0)
        obj.cached += obj.run_len(b0, b1)
        self.changed(obj)

    def corrupt(self, obj: CachedObject, bad_chunk_indices: list[int]) -> None:
        """Checksum mismatch: the blocks holding these chunks are absent from now on."""
        have = obj.have
        assert have is not None
        per_block = self.block_size // self.chunk_size
        freed = 0
        for b in sorted({c // per_block for c in bad_chunk_indices}):
            if have[b]:
                have[b] = 0
                freed += obj.block_len(b)
                self.stats.corrupt_blocks += 1
                log.warning("cache: corrupt block %d of %s; refetching", b, obj.path)
        obj.cached -= freed
        self.used -= freed
        self.changed(obj)

    def wipe(self, obj: CachedObject) -> None:
        """The cache file is gone: nothing of the object is cached."""
        if obj.have is not None:
            obj.have[:] = bytes(obj.nblocks)
        self.used -= obj.cached
        obj.cached = 0
        self.changed(obj)

    def maybe_release(self, obj: CachedObject) -> None:
        """Close the file of an object nobody uses; forget an object with nothing cached."""
        if obj.busy() or obj.dead:
            return
        if obj.stale:
            self.drop(obj, evicted=False)
            return
        self.files.close(obj)
        if obj.cached == 0 and obj.have is not None:
            self.drop(obj, evicted=False)

    # -- space -----------------------------------------------------------------------------

    def reserve(self, obj: CachedObject, n: int) -> bool:
        """Count ``n`` more bytes as used, evicting (never ``obj`` whole) to make room; False
        if there is none."""
        limit = self.space.limit(self.used)
        if self.used + n > limit:
            self.evict_to_fit(n, obj)
            limit = self.space.limit(self.used)
            if self.used + n > limit:
                return False
        self.used += n
        return True

    def evict_to_fit(self, n: int, exclude: CachedObject | None = None) -> None:
        """Evict until ``n`` more bytes fit under the limit (as far as the rules allow)."""
        limit = self.space.limit(self.used)
        need = self.used + n - limit
        if need <= 0:
            return
        need += min(limit // 32, 64 << 20)  # a little extra, so eviction is not per block
        plan = plan_eviction(self.objects.values(), need, exclude)
        for obj in plan.objects:
            self.drop(obj, evicted=True)
        for obj, blocks in plan.blocks:
            self.evict_blocks(obj, blocks)

    def drop(self, obj: CachedObject, *, evicted: bool) -> None:
        """Forget a whole object nobody uses and delete its file (in the background)."""
        obj.dead = True
        key = obj.key
        if self.objects.get(key) is obj:
            del self.objects[key]
            keys = self.by_path.get(obj.path)
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del self.by_path[obj.path]
        self.used -= obj.cached
        if evicted:
            self.stats.evictions += 1
            self.stats.evicted_bytes += obj.cached
        obj.cached = 0
        self.dirty_meta.discard(key)
        self.dirty_map.discard(key)
        self.deleted.add(key)
        self.mark_dirty()
        if self._on_dropped is not None:
            self._on_dropped(obj)
        self.files.queue_unlink(obj)

    def evict_blocks(self, obj: CachedObject, blocks: list[int]) -> None:
        """Mark ``blocks`` of an object in use absent and punch them out of its file."""
        have = obj.have
        assert have is not None
        bs = self.block_size
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
        self.used -= freed
        self.stats.evictions += 1
        self.stats.evicted_bytes += freed
        self.changed(obj)
        if self.files.fd(obj) >= 0:
            self.files.queue_punch(obj, ranges)
