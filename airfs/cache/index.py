"""The persistent cache index: one LMDB environment under ``<cache_dir>/index``.

Owned by one daemon: :class:`CacheIndex` takes an exclusive ``flock`` on ``<cache_dir>/lock``
and raises :class:`CacheInUse` if another process holds it.

Databases:

``info``
    ``b"format"`` → JSON with the format version, block size, checksum chunk size and checksum
    algorithm (``"checksum"``: :data:`~airfs.cache.store.CHECKSUM`; format 1 had none and
    meant zlib's CRC-32). A cache written with other values is wiped when opened (its files
    are then orphans, removed by the start-up sweep).
``meta``
    object key (16 bytes) → ``<QQQQ`` (generation, size, cached bytes, last use in ns since the
    epoch) + ``path`` + ``\\0`` + ``version``. Small: all of it is loaded at start-up (it is what
    LRU eviction works on).
``map``
    object key → ``<Q`` generation + one byte per block (present or not) + one ``<I`` checksum
    per checksum chunk. Loaded lazily, the first time an object is read after a start.

The in-memory state is authoritative while the daemon runs; the index is its mirror, written in
batches (:meth:`write_batch`, one transaction for everything that changed since the previous
batch). Data is written to the cache files *before* the index says it is there, and every chunk
is checksummed, so a crash can lose recent cache entries but never make the cache serve wrong
bytes.

All methods block (disk I/O, fsync): call them from worker threads.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import struct
import time
from dataclasses import dataclass

import lmdb

from .store import CHECKSUM

__all__ = ["CacheDamaged", "CacheInUse", "CacheIndex", "ObjectRecord", "set_aside"]

#: 2: chunk checksums are CRC-32C (1: zlib's CRC-32)
FORMAT = 2
_META = struct.Struct("<QQQQ")
_GEN = struct.Struct("<Q")


class CacheInUse(RuntimeError):
    """Another process owns this cache directory."""


class CacheDamaged(RuntimeError):
    """The index cannot be read (not LMDB, truncated, garbled records). ``path`` is the index
    directory; :func:`set_aside` moves it out of the way so that a new, empty one is made."""

    def __init__(self, path: str, why: str) -> None:
        super().__init__(f"cache index {path} is damaged ({why})")
        self.path = path


_LMDB_MAGIC = 0xBEEFC0DE


def check_lmdb_file(path: str) -> str | None:
    """Why the LMDB data file ``path`` cannot be opened safely, or None (also when it does not
    exist yet). LMDB maps the file and trusts its meta pages: a file shorter than the last
    page they name would kill the process with SIGBUS on first access, so that is checked
    here, from the two meta pages (page header 16 bytes, then ``mm_magic`` u32, ...,
    ``mm_dbs[0].md_pad`` = page size u32 at 40, ``mm_last_pg`` u64 at 136, ``mm_txnid`` at
    144)."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size == 0:
                return None  # LMDB initialises an empty file
            first = f.read(152)
            if len(first) < 152 or struct.unpack_from("<I", first, 16)[0] != _LMDB_MAGIC:
                return "not an LMDB file"
            psize = struct.unpack_from("<I", first, 40)[0]
            if psize < 512 or psize > 1 << 16 or psize & (psize - 1):
                return f"bad page size {psize}"
            f.seek(psize)
            second = f.read(152)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"cannot read {path}: {exc.strerror}"
    metas = []
    for page in (first, second):
        if len(page) == 152 and struct.unpack_from("<I", page, 16)[0] == _LMDB_MAGIC:
            last_pg, txnid = struct.unpack_from("<QQ", page, 136)
            metas.append((txnid, last_pg))
    _, last_pg = max(metas)
    if size < (last_pg + 1) * psize:
        return f"truncated: {size} bytes, its pages need {(last_pg + 1) * psize}"
    return None


def set_aside(index_dir: str) -> str | None:
    """Rename a (damaged) index directory to ``<index_dir>.damaged-<UTC time>``; the new path,
    or None if there was none. The cache files it described become orphans, which the next
    open deletes in the background."""
    if not os.path.lexists(index_dir):
        return None
    dest = f"{index_dir}.damaged-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}"
    n = 0
    while os.path.lexists(dest if n == 0 else f"{dest}.{n}"):
        n += 1
    dest = dest if n == 0 else f"{dest}.{n}"
    os.rename(index_dir, dest)
    return dest


@dataclass(frozen=True, slots=True)
class ObjectRecord:
    key: bytes
    gen: int
    size: int
    cached: int
    last_used: int
    path: str
    version: str


def encode_meta(gen: int, size: int, cached: int, last_used: int, path: str, version: str) -> bytes:
    return (
        _META.pack(gen, size, cached, last_used)
        + path.encode("utf-8", "surrogateescape")
        + b"\0"
        + version.encode("utf-8", "surrogateescape")
    )


def decode_meta(key: bytes, raw: bytes) -> ObjectRecord:
    gen, size, cached, last_used = _META.unpack_from(raw)
    path, _, version = raw[_META.size :].partition(b"\0")
    return ObjectRecord(
        key,
        gen,
        size,
        cached,
        last_used,
        path.decode("utf-8", "surrogateescape"),
        version.decode("utf-8", "surrogateescape"),
    )


def encode_map(gen: int, have: bytes | bytearray, crcs: bytes) -> bytes:
    return b"".join((_GEN.pack(gen), have, crcs))


def decode_map(raw: bytes, nblocks: int, nchunks: int) -> tuple[int, bytes, bytes] | None:
    """(generation, have, crc bytes), or None if the record does not fit the object."""
    if len(raw) != _GEN.size + nblocks + 4 * nchunks:
        return None
    (gen,) = _GEN.unpack_from(raw)
    have = raw[_GEN.size : _GEN.size + nblocks]
    return gen, have, raw[_GEN.size + nblocks :]


class CacheIndex:
    """The LMDB index of one cache directory (see the module docstring)."""

    def __init__(
        self, cache_dir: str, *, block_size: int, chunk_size: int, map_size: int = 1 << 38
    ) -> None:
        os.makedirs(cache_dir, exist_ok=True)
        self.cache_dir = cache_dir
        self._lock_fd = os.open(
            os.path.join(cache_dir, "lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600
        )
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            raise CacheInUse(
                f"{cache_dir}: cache directory in use by another airfs daemon"
            ) from None
        self.path = os.path.join(cache_dir, "index")
        try:
            why = check_lmdb_file(os.path.join(self.path, "data.mdb"))
            if why is not None:
                raise CacheDamaged(self.path, why)
            try:
                self.env = lmdb.open(
                    self.path,
                    map_size=map_size,
                    max_dbs=4,
                    subdir=True,
                    metasync=False,
                    readahead=False,
                    max_readers=512,
                )
            except lmdb.Error as exc:
                raise CacheDamaged(self.path, str(exc).removeprefix(self.path + ": ")) from None
            try:
                self._init_dbs(block_size, chunk_size)
            except (lmdb.Error, ValueError) as exc:
                self.env.close()
                raise CacheDamaged(self.path, str(exc)) from None
        except BaseException:
            os.close(self._lock_fd)
            raise

    def _init_dbs(self, block_size: int, chunk_size: int) -> None:
        self._info = self.env.open_db(b"info")
        self._meta = self.env.open_db(b"meta")
        self._map = self.env.open_db(b"map")
        want = {
            "format": FORMAT,
            "block_size": block_size,
            "chunk_size": chunk_size,
            "checksum": CHECKSUM,
        }
        with self.env.begin(write=True) as txn:
            raw = txn.get(b"format", db=self._info)
            cur = json.loads(raw) if raw else None
            #: True when an existing index was discarded (other format, block size or
            #: checksum).
            self.wiped = cur is not None and cur != want
            if cur != want:
                txn.drop(self._meta, delete=False)
                txn.drop(self._map, delete=False)
                txn.put(b"format", json.dumps(want).encode(), db=self._info)

    def load_objects(self) -> list[ObjectRecord]:
        """Every object record, least recently used first. Raises :class:`CacheDamaged` if
        the records cannot be read."""
        out = []
        try:
            with self.env.begin() as txn:
                for key, raw in txn.cursor(db=self._meta):
                    out.append(decode_meta(bytes(key), bytes(raw)))
        except (lmdb.Error, struct.error, UnicodeDecodeError, ValueError) as exc:
            raise CacheDamaged(self.path, f"unreadable object records: {exc}") from None
        out.sort(key=lambda r: r.last_used)
        return out

    def load_map(self, key: bytes) -> bytes | None:
        with self.env.begin() as txn:
            raw = txn.get(key, db=self._map)
            return None if raw is None else bytes(raw)

    def write_batch(
        self,
        metas: list[tuple[bytes, bytes]],
        maps: list[tuple[bytes, bytes]],
        deletes: list[bytes],
    ) -> None:
        """One transaction: delete objects, then put meta and map records."""
        with self.env.begin(write=True) as txn:
            for key in deletes:
                txn.delete(key, db=self._meta)
                txn.delete(key, db=self._map)
            for key, value in metas:
                txn.put(key, value, db=self._meta)
            for key, value in maps:
                txn.put(key, value, db=self._map)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.env.sync(True)
        self.env.close()
        if self._lock_fd >= 0:
            os.close(self._lock_fd)  # releases the flock
            self._lock_fd = -1
