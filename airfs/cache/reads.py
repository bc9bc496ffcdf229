"""Serving one read of a cached object: cached runs from the data file, the rest from parts.

An object version (path, version tag) is cached in blocks of ``block_size`` bytes in one sparse
file (:mod:`airfs.cache.store`); which blocks are present, with a CRC-32 per ``checksum_chunk``,
is kept in memory (:mod:`airfs.cache.objects`) and mirrored to LMDB in batches
(:mod:`airfs.cache.persist`). A read whose blocks are all present is answered on the trio loop
with one ``preadv(RWF_NOWAIT)`` of the chunks it touches, a checksum check and one copy into
the reply — no thread hop, and never a wait on the disk: if the pages are not in the page
cache, the read moves to a worker thread. A chunk whose checksum does not match marks its block
absent (``corrupt_blocks``) and the read fetches it again; wrong bytes are never returned.

Missing blocks are fetched from the origin as *parts* (:mod:`airfs.cache.fetch`): each block is
fetched by at most one part at a time, and a read that needs a block already being fetched waits for
that part and is served from its memory. The per-reader :class:`~airfs.cache.prefetch.Stream`
decides what to fetch ahead; see :mod:`airfs.cache.prefetch` for how the window grows, resets and
applies backpressure.

:class:`ReadPlanner` does this for :class:`~airfs.cache.reader.CachedReader`: it cuts the
read into runs present on disk and runs that parts bring (:meth:`ReadPlanner.plan`, starting
demand parts for blocks nobody fetches yet), asks the reader's stream for its prefetch, and
answers with the one piece (a read within one part: a view of its buffer, no copy) or joins
the pieces; when blocks turn out missing or corrupt on the way it plans again, at most
:data:`MAX_ATTEMPTS` times. Loop use only.
"""

from __future__ import annotations

import errno

from ..core.readpath import ReadBuffer
from ..origin.base import OriginError
from .fetch import Fetcher, FetchKind, Part
from .hits import HitReader
from .objects import ObjectTable
from .reader import CachedReader
from .stats import Counters
from .store import CachedObject

__all__ = ["MAX_ATTEMPTS", "ReadPlanner"]

#: plans of one read before it fails with EIO (each new plan follows a block found missing)
MAX_ATTEMPTS = 5


def view(data: bytes | memoryview, start: int, end: int) -> memoryview:
    """A read-only byte view of ``data[start:end]`` (a part's buffer, never changed)."""
    mv = memoryview(data)
    if mv.itemsize != 1 or mv.format != "B":
        mv = mv.cast("B")
    return mv[start:end].toreadonly()


class ReadPlanner:
    """Reads of the objects of ``table``, from the cache files (``hits``) and ``fetcher``'s
    parts; counts into ``stats``."""

    def __init__(
        self, table: ObjectTable, fetcher: Fetcher, hits: HitReader, stats: Counters
    ) -> None:
        self._table = table
        self._fetcher = fetcher
        self._budget = fetcher.budget
        self._hits = hits
        self.stats = stats
        self._bs = table.block_size

    async def read(
        self,
        obj: CachedObject,
        off: int,
        end: int,
        reader: CachedReader,
        span: tuple[int, int] | None,
    ) -> ReadBuffer:
        """The bytes ``[off, end)`` of ``obj`` (loaded: its block map is in memory; ``end``
        within its size) for ``reader``, first asking its stream's prefetch ``span`` (None:
        no prefetch). Raises the error of a part it waited for (the origin's), or
        :class:`~airfs.origin.base.OriginError` (EIO) when cached blocks keep turning out
        missing or corrupt. A read served by one part's buffer is a read-only view of it
        (parts never change their buffers), else ``bytes``."""
        self.stats.reads += 1
        self._table.touch(obj)
        bs = self._bs
        b0, b1 = off // bs, (end - 1) // bs + 1
        have = obj.have
        assert have is not None
        if span is None and not obj.held and have.find(0, b0, b1) < 0:
            data = self._hits.inline(obj, off, end)
            if data is None:
                data = await self._hits.thread(obj, off, end)
            if isinstance(data, bytes):
                return data
        for _ in range(MAX_ATTEMPTS):
            segments = self.plan(obj, off, end, b0, b1)
            if span is not None:
                self._fetcher.prefetch(reader, obj, span)
                span = None
            pieces: list[bytes | memoryview] = []
            for s, e, part in segments:
                if part is None:
                    if obj.held:
                        s = self._from_held(obj, s, e, pieces)
                        if s >= e:
                            continue
                    got = self._hits.inline(obj, s, e)
                    if got is None:
                        got = await self._hits.thread(obj, s, e)
                    if got is False:
                        break
                    assert isinstance(got, bytes)
                    pieces.append(got)
                    continue
                if not part.done.is_set():
                    if part.kind is FetchKind.PREFETCH:
                        self.stats.prefetch_waits += 1
                    await part.done.wait()
                if part.error is not None:
                    raise part.error
                if part.data is None:
                    break  # stored, not kept in memory: read it from the cache file
                pieces.append(view(part.data, s - part.start, e - part.start))
                self.stats.miss_bytes += e - s
            else:
                if len(pieces) == 1:
                    return pieces[0]  # bytes, or a view of one part: no copy on the loop
                return b"".join(pieces)
        raise OriginError(f"{obj.path}: cache read keeps failing", errno.EIO)

    def _from_held(
        self, obj: CachedObject, s: int, e: int, pieces: list[bytes | memoryview]
    ) -> int:
        """Serve the longest prefix of the cached run ``[s, e)`` that kept buffers hold
        (:meth:`Fetcher.release_held`) into ``pieces``; a buffer read to its end is let go.
        Returns where the prefix ends (``s``: none held)."""
        held, bs = obj.held, self._bs
        while s < e:
            part = held.get(s // bs)
            if part is None:
                break
            m = min(e, part.end)
            assert part.data is not None
            pieces.append(view(part.data, s - part.start, m - part.start))
            self._hits.count(obj, s, m)
            self.stats.kept_hit_bytes += m - s
            if m >= part.end:
                self._fetcher.release_held(part)
            s = m
        return s

    def plan(
        self, obj: CachedObject, off: int, end: int, b0: int, b1: int
    ) -> list[tuple[int, int, Part | None]]:
        """Cut ``[off, end)`` into runs cached on disk (part None) and runs coming from parts,
        starting demand parts for blocks nobody fetches yet."""
        have, inflight, bs = obj.have, obj.inflight, self._bs
        part_blocks = self._fetcher.part_blocks
        assert have is not None
        out: list[tuple[int, int, Part | None]] = []
        b = b0
        while b < b1:
            part: Part | None = None
            if have[b]:
                e = b + 1
                while e < b1 and have[e]:
                    e += 1
                s_byte, e_byte = b * bs, e * bs
            else:
                part = inflight.get(b)
                if part is None:
                    e = b + 1
                    while e < b1 and e - b < part_blocks and not have[e] and e not in inflight:
                        e += 1
                    part = self._fetcher.start_part(obj, b, e, FetchKind.DEMAND, None)
                elif not part.started and not part.urgent:
                    part.urgent = True
                    self._budget.poke()
                e = part.b1
                s_byte, e_byte = part.start, part.end
            out.append((max(off, s_byte), min(end, e_byte), part))
            b = e
        return out
