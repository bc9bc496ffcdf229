"""Cache data files: one sparse file per cached object version, and per-chunk checksums.

Layout: ``<cache_dir>/data/<k0>/<key>.<gen>`` where ``key`` is the 32-hex-digit object key
(:func:`object_key` of path and version), ``k0`` its first two digits, and ``gen`` a generation
number unique to this incarnation of the cached object (a new one after every eviction or
restart-time cleanup, so that a file being deleted in the background never collides with a new
one). Block ``b`` of the object lives at byte ``b * block_size`` of the file; blocks not cached
are holes.

Every ``chunk_size`` bytes of cached data (a divisor of the block size; 128 KiB by default, the
size of a default kernel read request) carry a CRC-32 kept in memory and in the index. Reads
verify exactly the chunks they touch, so a flipped byte on disk is detected and the block is
refetched instead of served.

The functions here that do I/O on large ranges (:func:`read_verify`, :func:`write_all`,
:func:`copy_into`, :func:`punch`) block: call them from worker threads.
:func:`read_nowait` never blocks on the disk (``RWF_NOWAIT``) and is what the trio loop uses for
cache hits.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import fcntl
import hashlib
import os
from array import array
from typing import TYPE_CHECKING, Any

from crc32c import crc32c

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = [
    "CachedObject",
    "allocate",
    "checksums",
    "copy_into",
    "create_file",
    "create_whole",
    "object_key",
    "punch",
    "read_nowait",
    "read_verify",
    "write_all",
]

#: ``have[b]`` values.
ABSENT, PRESENT, PREFETCHED = 0, 1, 2

_FICLONE = 0x40049409
_FALLOC_FL_KEEP_SIZE = 0x01
_FALLOC_FL_PUNCH_HOLE = 0x02
_libc: Any = None


def object_key(path: str, version: str) -> bytes:
    """The 16-byte cache key of one object version."""
    raw = (
        path.encode("utf-8", "surrogateescape") + b"\0" + version.encode("utf-8", "surrogateescape")
    )
    return hashlib.blake2b(raw, digest_size=16).digest()


class CachedObject:
    """In-memory state of one cached object version (the hot path reads only this).

    ``have`` (one byte per block: absent / present / prefetched-not-yet-read) and ``crcs`` (one
    CRC-32 per chunk) are ``None`` until loaded from the index. ``cached`` counts the bytes of
    present blocks. ``fd`` is the open cache file (``-1`` when closed); it is closed only when
    ``io`` (worker-thread operations using it) is zero and nobody uses the object.
    """

    __slots__ = (
        "block_size",
        "cached",
        "chunk_size",
        "crcs",
        "creating",
        "dead",
        "fd",
        "file_created",
        "gen",
        "have",
        "held",
        "inflight",
        "io",
        "key",
        "last_used",
        "loading",
        "nblocks",
        "nchunks",
        "passed_through",
        "path",
        "pins",
        "punch_done",
        "punches",
        "readers",
        "size",
        "stale",
        "version",
    )

    def __init__(
        self,
        key: bytes,
        path: str,
        version: str,
        size: int,
        gen: int,
        block_size: int,
        chunk_size: int,
        *,
        cached: int = 0,
        last_used: int = 0,
        loaded: bool = True,
    ) -> None:
        self.key = key
        self.path = path
        self.version = version
        self.size = size
        self.gen = gen
        self.block_size = block_size
        self.chunk_size = chunk_size
        self.nblocks = -(-size // block_size)
        self.nchunks = -(-size // chunk_size)
        self.cached = cached
        self.last_used = last_used
        self.have: bytearray | None = bytearray(self.nblocks) if loaded else None
        self.crcs: array[int] | None = array("I", bytes(4 * self.nchunks)) if loaded else None
        self.fd = -1
        self.file_created = not loaded  # a loaded-from-index object has a file on disk
        self.io = 0
        self.pins = 0
        #: handed to the kernel as a passthrough backing file in this run: a mapping of it may
        #: outlive the open, so its blocks are never punched out (it is evicted whole or not)
        self.passed_through = False
        self.readers: set[Any] = set()
        self.inflight: dict[int, Any] = {}
        #: blocks stored and committed whose fetched buffer is still kept for their reader
        #: (block -> part, see :meth:`airfs.cache.fetch.Fetcher.release_held`)
        self.held: dict[int, Any] = {}
        self.dead = False
        #: the origin no longer has this version at this path (deleted, renamed away,
        #: replaced): forgotten as soon as nobody uses it (see ObjectTable.discard_path)
        self.stale = False
        self.loading: Any = None
        self.creating: Any = None  # trio.Event while the cache file is being created
        #: hole punches queued and not done; writes wait for them (``punch_done`` is set then)
        self.punches = 0
        self.punch_done: Any = None

    def block_len(self, b: int) -> int:
        return min(self.block_size, self.size - b * self.block_size)

    def run_len(self, b0: int, b1: int) -> int:
        """Bytes in blocks ``[b0, b1)``."""
        return min(b1 * self.block_size, self.size) - b0 * self.block_size

    def busy(self) -> bool:
        """Used by a reader, a warm/adopt, a fetch or a worker thread: not to be dropped whole."""
        return bool(self.readers or self.pins or self.io or self.inflight)

    def file_name(self) -> str:
        h = self.key.hex()
        return f"{h[:2]}/{h}.{self.gen:x}"


#: The chunk checksum, recorded in the index's format (a cache written with another is wiped
#: when opened): CRC-32C, in hardware where the CPU has it (SSE 4.2, ARMv8 CRC), ~20 GB/s
#: against zlib's CRC-32 at ~1 GB/s here.
CHECKSUM = "crc32c"

#: ``crc32c``'s ``gil_release_mode``: keep the GIL. A 128 KiB chunk takes ~6 us; by default
#: the library releases the GIL for it, and taking it back waits for whichever thread holds it
#: then, up to the 5 ms switch interval (3,000 CRCs of 150 KiB beside one busy Python thread:
#: 5.4 s with the release, 0.03 s without).
KEEP_GIL = 0


def checksums(data: bytes | bytearray | memoryview, chunk_size: int) -> array[int]:
    """CRC-32C of each ``chunk_size`` piece of ``data`` (the last may be short)."""
    mv = memoryview(data)
    return array(
        "I",
        [
            crc32c(mv[i : i + chunk_size], gil_release_mode=KEEP_GIL)
            for i in range(0, len(mv), chunk_size)
        ],
    )


def bad_chunks(
    buf: memoryview, first_chunk: int, chunk_size: int, expected: Sequence[int]
) -> list[int]:
    """Indices (absolute) of the chunks of ``buf`` whose CRC-32C differs from ``expected``
    (``expected[i]`` belongs to chunk ``first_chunk + i``)."""
    bad = []
    for i, want in enumerate(expected):
        if crc32c(buf[i * chunk_size : (i + 1) * chunk_size], gil_release_mode=KEEP_GIL) != want:
            bad.append(first_chunk + i)
    return bad


def read_nowait(fd: int, buf: memoryview, offset: int) -> bool:
    """Fill ``buf`` from ``offset`` only if that needs no disk I/O (page cache hit).

    Returns False when the data is not all in the page cache (the caller then reads in a worker
    thread) or the file is shorter. Never blocks on the disk.
    """
    try:
        n = os.preadv(fd, [buf], offset, os.RWF_NOWAIT)
    except BlockingIOError:
        return False
    except OSError as exc:
        if exc.errno in (errno.EOPNOTSUPP, errno.EINVAL):
            return False
        raise
    return n == len(buf)


def read_verify(
    fd: int, offset: int, length: int, first_chunk: int, chunk_size: int, expected: Sequence[int]
) -> tuple[bytes, list[int]]:
    """Blocking read of ``length`` bytes at ``offset`` (chunk-aligned) and checksum check.

    Returns the bytes and the absolute indices of the chunks that failed (a short file fails the
    missing chunks).
    """
    data = os.pread(fd, length, offset)
    if len(data) < length:
        data = data + bytes(length - len(data))  # rare: zero-fill so the checks fail, not crash
    return data, bad_chunks(memoryview(data), first_chunk, chunk_size, expected)


def write_all(fd: int, data: bytes | memoryview, offset: int) -> None:
    """``pwrite`` all of ``data`` at ``offset``."""
    mv = memoryview(data)
    while mv:
        n = os.pwrite(fd, mv, offset)
        mv = mv[n:]
        offset += n


def _get_libc() -> Any:
    global _libc
    if _libc is None:
        lib = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        lib.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong]
        lib.fallocate.restype = ctypes.c_int
        _libc = lib
    return _libc


def punch(fd: int, ranges: Sequence[tuple[int, int]]) -> bool:
    """Deallocate byte ranges ``(offset, length)`` of a file, keeping its size. False when the
    file system cannot punch holes (the space then stays allocated until the file goes)."""
    libc = _get_libc()
    for off, length in ranges:
        if libc.fallocate(fd, _FALLOC_FL_KEEP_SIZE | _FALLOC_FL_PUNCH_HOLE, off, length) != 0:
            err = ctypes.get_errno()
            if err in (errno.EOPNOTSUPP, errno.ENOSYS):
                return False
            raise OSError(err, os.strerror(err))
    return True


def create_file(path: str, size: int) -> int:
    """Create (or truncate) a cache file of ``size`` bytes, all holes; returns its fd."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        os.ftruncate(fd, size)  # full size up front: writes never extend the file
    except BaseException:
        os.close(fd)
        raise
    return fd


def create_whole(path: str, data: bytes | memoryview, size: int) -> tuple[int, OSError | None]:
    """Create (or truncate) the cache file of a ``size``-byte object and write ``data``, all
    of its bytes, into it: an ``open`` and a ``pwrite``, no ``ftruncate`` and no
    ``fallocate`` (one write into a new file allocates it at once, and a full disk fails that
    write). Returns the new file's descriptor and the write's error, if any: after a failed
    write the file is still ``size`` bytes (as :func:`create_file` leaves it), holding what
    was written. Raises ``OSError`` when the file cannot be created."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        write_all(fd, data, 0)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.ftruncate(fd, size)
        return fd, exc
    except BaseException:
        os.close(fd)
        raise
    return fd, None


def allocate(fd: int, offset: int, length: int) -> None:
    """Allocate disk space for a range before writing it. Writing into allocated space is
    several times faster than extending writes on ext4 (measured: ~0.25 vs 2+ GiB/s) and
    fails early on a full disk. Silently does nothing where unsupported."""
    libc = _get_libc()
    if libc.fallocate(fd, 0, offset, length) != 0:
        err = ctypes.get_errno()
        if err not in (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
            raise OSError(err, os.strerror(err))


def copy_into(
    src_path: str, dst_fd: int, ranges: Sequence[tuple[int, int]], whole: bool, chunk_size: int
) -> list[array[int]]:
    """Copy byte ranges ``(offset, length)`` of local file ``src_path`` to the same offsets of
    ``dst_fd`` and return the checksums of each range (read back from ``dst_fd``).

    ``whole`` (the destination is empty and every byte is wanted) tries a reflink first
    (``FICLONE``: instant and space-sharing on btrfs/XFS), then ``copy_file_range`` (in-kernel).
    """
    src = os.open(src_path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        cloned = False
        if whole:
            try:
                fcntl.ioctl(dst_fd, _FICLONE, src)
                cloned = True
            except OSError:
                cloned = False
        out = []
        for off, length in ranges:
            if not cloned:
                done = 0
                while done < length:
                    try:
                        n = os.copy_file_range(src, dst_fd, length - done, off + done, off + done)
                    except OSError as exc:
                        if exc.errno not in (
                            errno.EXDEV,
                            errno.EOPNOTSUPP,
                            errno.ENOSYS,
                            errno.EINVAL,
                        ):
                            raise
                        n = _copy_plain(src, dst_fd, off + done, length - done)
                    if n == 0:
                        raise OSError(errno.EIO, f"{src_path}: shorter than expected")
                    done += n
            crcs = array("I")
            pos, end = off, off + length
            step = max(chunk_size, (8 << 20) // chunk_size * chunk_size)
            while pos < end:
                piece = os.pread(dst_fd, min(step, end - pos), pos)
                if not piece:
                    raise OSError(errno.EIO, "cache file shorter than just written")
                crcs.extend(checksums(piece, chunk_size))
                pos += len(piece)
            out.append(crcs)
        return out
    finally:
        os.close(src)


def _copy_plain(src: int, dst: int, offset: int, length: int) -> int:
    data = os.pread(src, min(length, 8 << 20), offset)
    if data:
        write_all(dst, data, offset)
    return len(data)
