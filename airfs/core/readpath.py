"""The read path's interface to the filesystem core, and its simplest implementation.

The core opens one :class:`Reader` per open file handle of a file whose bytes come from the
origin (files being written are read from their staging file instead). The reader decides how
bytes are fetched: straight from the origin (:class:`DirectReadPath`), or through the block
cache and prefetcher (:mod:`airfs.cache`).

Contract for every implementation: bytes returned by ``Reader.read`` belong to exactly the
object version the reader was opened on; if the origin no longer has that version and the bytes
are not cached, ``read`` raises :class:`airfs.origin.base.Conflict` (the core reports EIO) rather
than mixing versions.

What ``Reader.read`` returns is a :data:`ReadBuffer`: ``bytes``, or a read-only byte view of a
buffer that nobody changes afterwards (a fetched part served from memory: no copy on the
loop). A consumer that needs ``bytes`` copies it (``bytes(buf)``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Protocol

from airfs.origin.aio import AsyncOrigin
from airfs.origin.base import Entry, Kind, OriginError, join

#: what a read returns: ``bytes``, or a read-only ``memoryview`` (format ``B``) of a buffer
#: that is never changed (a fetched part); kept by the consumer as long as it likes
ReadBuffer = bytes | memoryview


@dataclass(frozen=True, slots=True)
class ObjectRef:
    """One version of one object: what a reader reads."""

    path: str
    version: str
    size: int


class ReadPathStatistics(Protocol):
    """What every read path's :meth:`ReadPath.statistics` record offers (each implementation
    returns a frozen dataclass with more fields)."""

    @property
    def kind(self) -> str:
        """``"direct"`` or ``"cached"``."""
        ...

    @property
    def origin_bytes_read(self) -> int | None:
        """Bytes the read path has read from the origin; None where it does not count them."""
        ...

    def to_dict(self) -> dict[str, Any]:
        """The record as JSON-ready ``{name: value}`` (what ``airfs status`` prints)."""
        ...


@dataclass(frozen=True, slots=True)
class DirectStatistics:
    """:class:`DirectReadPath` keeps no counters."""

    kind: Literal["direct"] = "direct"
    origin_bytes_read: None = None

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind}


@dataclass(frozen=True, slots=True)
class BackingStats:
    """The read path's counters of the local files it handed out (:meth:`ReadPath.local_file`):
    whole-file verifications run and failed, and objects fetched whole to back an open."""

    backing_verifications: int
    backing_verify_failures: int
    backing_fetched_whole: int

    def to_dict(self) -> dict[str, int]:
        """Flat, under these names, as ``airfs status --json`` shows them under ``fuse``."""
        return {
            "backing_verifications": self.backing_verifications,
            "backing_verify_failures": self.backing_verify_failures,
            "backing_fetched_whole": self.backing_fetched_whole,
        }


class LocalFile(Protocol):
    """A complete, verified local copy of one object version (a cache file) that the kernel
    may serve directly (FUSE passthrough): ``fd`` is valid until :meth:`release`; ``key`` names
    the file's content (equal keys: the same bytes)."""

    @property
    def fd(self) -> int: ...

    @property
    def key(self) -> str: ...

    def release(self) -> None:
        """The caller is done with the file (it may be evicted again)."""
        ...


class Reader(Protocol):
    """A read stream over one object version (one per open file handle)."""

    @property
    def ref(self) -> ObjectRef:
        """The object version this reader reads."""
        ...

    async def read(self, offset: int, size: int) -> ReadBuffer:
        """Up to ``size`` bytes at ``offset``; short only at the end of the object (a
        :data:`ReadBuffer`: bytes, or a read-only view of a buffer nobody changes)."""
        ...

    def close(self) -> None:
        """The handle was released; drop stream state (prefetched-but-unread data may stay
        cached)."""
        ...


class ReadPath(Protocol):
    """Creates readers; owns whatever cache sits between the core and the origin."""

    def open(self, obj: ObjectRef) -> Reader: ...

    async def warm(self, obj: ObjectRef) -> int:
        """Make the whole object local (if there is a cache); return the bytes fetched from the
        origin."""
        ...

    async def warm_many(self, objs: list[ObjectRef]) -> list[int | OriginError]:
        """:meth:`warm` each of ``objs`` (small files: a cache may fetch them in one job, one
        after another); for each, the bytes fetched or its origin error."""
        ...

    def statistics(self) -> ReadPathStatistics:
        """A frozen snapshot of the read path's state and counters."""
        ...

    async def adopt(self, obj: ObjectRef, local_file: str) -> bool:
        """Take the complete local file ``local_file`` (exactly ``obj``'s bytes, copied: the
        caller keeps it) as the cached content of ``obj`` (a file just committed from this
        node). False when nothing was kept (no cache, or no room); ``ValueError`` when the
        file's size is not ``obj.size``."""
        ...

    async def local_file(self, obj: ObjectRef, *, fetch_max: int = 0) -> LocalFile | None:
        """A complete, verified local file of ``obj`` (fetched whole first when it is not
        cached and at most ``fetch_max`` bytes), pinned until released; None when there is
        none (no cache, not complete). Raises the origin's errors of such a fetch."""
        ...

    def local_file_now(self, obj: ObjectRef) -> LocalFile | None:
        """:meth:`local_file` without waiting (an open answered inline): the local file when
        it is complete, known and verified already, else None (nothing fetched, loaded or
        verified)."""
        ...

    def knows(self, obj: ObjectRef) -> bool:
        """Whether a cache holds, or is filling, any of version ``obj`` (a hint for how to
        revalidate it; never blocks). False without a cache."""
        ...

    def store_fetched(self, obj: ObjectRef, data: memoryview) -> bool:
        """``data`` is the whole content of version ``obj``, just read from the origin (a
        cold small file revalidated by reading it: ``Capabilities.whole_reads``). A cache
        stores it in the background as a whole-file fetch would (checksummed, written into
        its cache file), and a :meth:`local_file` of ``obj`` meanwhile waits for that rather
        than read the origin again. False when not taken (no cache, known already, stopped);
        never blocks."""
        ...

    def backing_statistics(self) -> BackingStats | None:
        """Counters of the local files handed out by :meth:`local_file` (None without a
        cache)."""
        ...

    def expect(self, objs: list[ObjectRef]) -> None:
        """``objs`` are likely to be opened soon (their directory was just listed): prepare
        in the background what :meth:`local_file_now` needs to answer them inline (a cache:
        the block maps of those it holds). A hint: never blocks, fetches nothing."""
        ...

    def discard(self, path: str, keep: str | None = None) -> int:
        """The origin no longer has the versions of ``path`` other than ``keep`` (None: the
        path itself is gone: deleted or renamed away). A cache forgets them — what nobody
        reads at once, what is being read (a file unlinked while open) after its last
        reader — so that what it holds in memory follows the files that exist. Readers open
        on those versions keep working. Returns how many versions were forgotten at once.
        Called by the core on the loop; never blocks."""
        ...

    async def carry(self, src: ObjectRef, dst: ObjectRef) -> bool:
        """The origin now has ``src``'s exact bytes as ``dst`` too (a rename whose copy kept
        the version): a cache makes its complete copy of ``src``, if it has one, the content
        of ``dst`` as well (no origin read), so that readers of ``dst`` keep being served
        after the origin replaces it. Returns whether it did."""
        ...

    async def aclose(self) -> None: ...


class _DirectReader:
    def __init__(self, origin: AsyncOrigin, obj: ObjectRef) -> None:
        self._origin = origin
        self._obj = obj

    @property
    def ref(self) -> ObjectRef:
        return self._obj

    async def read(self, offset: int, size: int) -> bytes:
        size = max(0, min(size, self._obj.size - offset))
        if size == 0:
            return b""
        return await self._origin.read_range(self._obj.path, offset, size, self._obj.version)

    def close(self) -> None:
        pass


class DirectReadPath:
    """No cache: every read is a range read of the origin. The baseline and the fallback."""

    def __init__(self, origin: AsyncOrigin) -> None:
        self._origin = origin

    def open(self, obj: ObjectRef) -> Reader:
        return _DirectReader(self._origin, obj)

    async def warm(self, obj: ObjectRef) -> int:
        return 0

    async def warm_many(self, objs: list[ObjectRef]) -> list[int | OriginError]:
        return [0] * len(objs)

    def discard(self, path: str, keep: str | None = None) -> int:
        return 0

    async def carry(self, src: ObjectRef, dst: ObjectRef) -> bool:
        return False

    def statistics(self) -> DirectStatistics:
        return DirectStatistics()

    async def adopt(self, obj: ObjectRef, local_file: str) -> bool:
        return False

    async def local_file(self, obj: ObjectRef, *, fetch_max: int = 0) -> LocalFile | None:
        return None

    def local_file_now(self, obj: ObjectRef) -> LocalFile | None:
        return None

    def knows(self, obj: ObjectRef) -> bool:
        return False

    def store_fetched(self, obj: ObjectRef, data: memoryview) -> bool:
        return False

    def backing_statistics(self) -> BackingStats | None:
        return None

    def expect(self, objs: list[ObjectRef]) -> None:
        pass

    async def aclose(self) -> None:
        pass


#: the most files of one listing whose opens :meth:`ReadPath.expect` prepares
EXPECT_MAX = 4096


def files_listed(dir_path: str, entries: list[Entry]) -> list[ObjectRef]:
    """The file versions of a listing of ``dir_path`` (at most :data:`EXPECT_MAX`), as
    :meth:`ReadPath.expect` takes them."""
    out: list[ObjectRef] = []
    for e in entries:
        if e.kind is Kind.FILE:
            out.append(ObjectRef(join(dir_path, e.name), e.version, e.size))
            if len(out) >= EXPECT_MAX:
                break
    return out
