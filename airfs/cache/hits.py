"""Cache hits: serving runs of present blocks from an object's cache file, checksums verified.

:meth:`HitReader.inline` runs on the trio loop and never waits for the disk: one
``preadv(RWF_NOWAIT)`` of the chunks a read touches into a scratch mapping, a CRC-32 check of
each chunk, one copy into the reply. When the pages are not in memory (or the run is too large
to verify on the loop) :meth:`HitReader.thread` does the same in a worker thread. A chunk whose
checksum does not match marks its block absent (:meth:`ObjectTable.corrupt`), and the caller
plans the read again: wrong bytes are never returned. Prefetched blocks read for the first time
count as prefetch hits.
"""

from __future__ import annotations

import mmap

import trio

from .objects import ObjectTable
from .stats import Counters
from .store import PREFETCHED, PRESENT, CachedObject, bad_chunks, read_nowait, read_verify

__all__ = ["HitReader"]

#: Largest hit served on the loop (checksumming runs at ~3 GiB/s: 2 MiB is well under 1 ms).
_INLINE_MAX = 2 << 20


class HitReader:
    """Reads cached runs of the objects of ``table`` (one scratch buffer: loop use only)."""

    def __init__(self, table: ObjectTable, stats: Counters) -> None:
        self._table = table
        self._files = table.files
        self._stats = stats
        self._bs = table.block_size
        self._cs = table.chunk_size
        # Hits are read into this buffer, checked, and copied into the reply. An anonymous
        # mapping, not a bytearray: preadv into a long-lived heap buffer measured ~5x slower.
        self._scratch = mmap.mmap(-1, 2 << 20)

    def inline(self, obj: CachedObject, s: int, e: int) -> bytes | bool | None:
        """Serve ``[s, e)`` (all present) from the cache file without blocking: the bytes;
        None if the pages are not in memory (read in a thread instead); False if blocks turned
        out missing or corrupt (they are marked absent; plan again)."""
        cs = self._cs
        c0, c1 = s // cs, (e - 1) // cs + 1
        a, z = c0 * cs, min(c1 * cs, obj.size)
        fd = self._files.fd(obj)
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
            self._table.corrupt(obj, bad)
            return False
        self.count(obj, s, e)
        return bytes(buf[s - a : e - a])

    async def thread(self, obj: CachedObject, s: int, e: int) -> bytes | bool:
        """Like :meth:`inline`, blocking on the disk in a worker thread."""
        cs = self._cs
        c0, c1 = s // cs, (e - 1) // cs + 1
        a, z = c0 * cs, min(c1 * cs, obj.size)
        fd = self._files.fd(obj)
        if fd < 0:
            return False
        crcs = obj.crcs
        assert crcs is not None
        expected = crcs[c0:c1]
        obj.io += 1
        try:
            data, bad = await trio.to_thread.run_sync(
                read_verify, fd, a, z - a, c0, cs, expected, limiter=self._files.io_limiter
            )
        finally:
            obj.io -= 1
        if bad:
            self._table.corrupt(obj, bad)
            return False
        if obj.have is None or obj.have.find(0, s // self._bs, (e - 1) // self._bs + 1) >= 0:
            return False  # evicted while we read (the checksums passed: the bytes were right,
            # but plan again rather than reason about it)
        self.count(obj, s, e)
        return data if (a == s and z == e) else data[s - a : e - a]

    def count(self, obj: CachedObject, s: int, e: int) -> None:
        """Count ``[s, e)`` as served from the cache (its prefetched blocks: read once)."""
        self._stats.hit_bytes += e - s
        have = obj.have
        assert have is not None
        b0, b1 = s // self._bs, (e - 1) // self._bs + 1
        if have.find(PREFETCHED, b0, b1) >= 0:
            for b in range(b0, b1):
                if have[b] == PREFETCHED:
                    have[b] = PRESENT
                    self._stats.prefetch_hits += 1
