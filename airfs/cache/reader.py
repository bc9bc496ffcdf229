"""One open file handle's read stream over the block cache (:class:`CachedReader`) and what it
asks of the read path that made it (:class:`ReaderHost`, implemented by
:class:`~airfs.cache.blockcache.CachedReadPath`). Its own module so that the fetch engine and
the read planner, which keep references to readers, import it without an import circle."""

from __future__ import annotations

from typing import Protocol

from airfs.core.readpath import ObjectRef, ReadBuffer

from .prefetch import Stream
from .store import CachedObject

__all__ = ["CachedReader", "ReaderHost"]


class ReaderHost(Protocol):
    """The read path a :class:`CachedReader` reads through."""

    async def read_for(self, reader: CachedReader, offset: int, size: int) -> ReadBuffer: ...

    def reader_closed(self, reader: CachedReader) -> None: ...


class CachedReader:
    """One open file handle's read stream (implements :class:`airfs.core.readpath.Reader`)."""

    __slots__ = ("_rp", "closed", "obj", "ref", "stream")

    def __init__(
        self, rp: ReaderHost, obj: CachedObject, ref: ObjectRef, stream: Stream
    ) -> None:
        self._rp = rp
        self.obj = obj
        self.ref = ref
        self.stream = stream
        self.closed = False

    async def read(self, offset: int, size: int) -> ReadBuffer:
        """Up to ``size`` bytes at ``offset`` of the reader's object version; short only at the
        end. Raises :class:`~airfs.origin.base.Conflict` when bytes not cached are no longer
        at the origin in this version, other :class:`~airfs.origin.base.OriginError` s when the
        origin fails."""
        if self.closed:
            raise ValueError("read from a closed reader")
        if offset < 0 or size < 0:
            raise ValueError("negative offset or size")
        return await self._rp.read_for(self, offset, size)

    def active_range(self) -> tuple[int, int]:
        """Bytes the reader is using now; never evicted (see :mod:`airfs.cache.evict`)."""
        return self.stream.active_range()

    def close(self) -> None:
        """Drop the stream. Prefetched data stays cached; parts not started are abandoned."""
        if self.closed:
            return
        self.closed = True
        self._rp.reader_closed(self)
