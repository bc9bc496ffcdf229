"""The write-back journal: which staged files are closed and wait for their commit.

An LMDB environment under ``<cache-dir>/journal``. One record per closed staged file, keyed by
its staging id, holding the path it commits to and what the commit needs. A record is written
when a written file is closed and deleted once its content is at the origin. Changes that
belong together (a new version's record and the deletion of the version it supersedes; every
record moved by a directory rename) are written in one transaction: :meth:`Journal.write`.

Each record is also kept on its staging file itself (the extended attribute
:data:`RECORD_XATTR`), so that a journal that was deleted, emptied or damaged is *detected*
at start (closed staged files without a record) and can be rebuilt losslessly
(:func:`airfs.writeback.recovery.rebuild_journal`) instead of being silently dropped.

Durability: records are written without an fsync per transaction (``sync=False``), so a record
survives a crash of the daemon as soon as :meth:`Journal.write` returns (it is in the kernel's
page cache); :meth:`Journal.sync` (called periodically by the daemon, and on ``fsync``/
``flush``/unmount) makes it survive a power loss too.
"""

from __future__ import annotations

import errno
import json
import os
from collections.abc import Iterable
from dataclasses import asdict, dataclass

import lmdb

#: extended attribute of a staging file holding its journal record (JSON) while it has one
RECORD_XATTR = "user.airfs.record"
#: extended attribute holding the path a staging file commits to (kept from creation on, so
#: a file open for writing at a crash is recovered under its path)
PATH_XATTR = "user.airfs.path"
#: extended attribute describing a version open for writing (no journal record yet): what
#: its commit would need besides its path (:class:`OpenRecord`), kept current while it is open,
#: so that a daemon taking over a live mount carries its writers over
OPEN_XATTR = "user.airfs.open"
#: extended attribute marking a staging file whose bytes need nothing more (committed,
#: superseded or deleted; still open, or its deletion not applied yet): recovery deletes it
DONE_XATTR = "user.airfs.done"


class JournalDamaged(Exception):
    """The journal cannot be trusted (truncated, unreadable); the message says how to recover."""


@dataclass(frozen=True, slots=True)
class Record:
    """What recovery needs to commit one closed file."""

    id: str
    path: str
    base_version: str | None
    mode: int
    mtime_ns: int
    seq: int
    first_pending_ns: int
    #: owner for the commit (None: the origin's default); absent in records before owners
    uid: int | None = None
    gid: int | None = None
    #: an older closed version kept after a crash only to recognise it at the origin (it may
    #: have landed): never committed itself (see :mod:`airfs.writeback.recovery`)
    prior: bool = False
    #: (size, MD5) of versions of its file whose put failed and may have landed (its
    #: ``PathState.unsure`` when recorded): recognised as ours at the origin after a crash
    unsure: tuple[tuple[int, str], ...] = ()

    def encode(self) -> bytes:
        d = asdict(self)
        if not d["unsure"]:
            del d["unsure"]  # as records were before it (an older daemon reads it)
        return json.dumps(d).encode()

    @classmethod
    def decode(cls, raw: bytes) -> Record:
        d = json.loads(raw)
        d["unsure"] = tuple((int(n), str(h)) for n, h in d.get("unsure", ()))
        return cls(**d)


@dataclass(frozen=True, slots=True)
class OpenRecord:
    """What a version open for writing commits with, besides its path and bytes: the origin
    version it replaces, its mode, times and owner (:data:`OPEN_XATTR`)."""

    base_version: str | None
    mode: int
    mtime_ns: int
    uid: int | None = None
    gid: int | None = None

    def encode(self) -> bytes:
        return json.dumps(asdict(self)).encode()

    @classmethod
    def decode(cls, raw: bytes) -> OpenRecord:
        return cls(**json.loads(raw))


def _no_space(exc: lmdb.Error) -> OSError:
    return OSError(errno.ENOSPC, f"journal: cannot record the change ({exc})")


def check_files(directory: str) -> None:
    """Refuse an LMDB data file that is shorter than what its meta pages say it holds (a
    half-truncated journal would crash the daemon with SIGBUS when read)."""
    data = os.path.join(directory, "data.mdb")
    try:
        size = os.stat(data).st_size
    except FileNotFoundError:
        return
    if size == 0:
        return  # an empty file is a new journal; recovery compares it with the staging files
    page = os.sysconf("SC_PAGE_SIZE")
    if size < 2 * page:
        raise JournalDamaged(f"journal {data} is truncated ({size} bytes)")
    with open(data, "rb") as f:
        head = f.read(2 * page)
    last = 0
    for meta in (head[:page], head[page:]):
        # MDB_meta follows the 16-byte page header: magic u32, version u32, address u64,
        # mapsize u64, two MDB_db of 48 bytes, then mm_last_pg u64
        magic = int.from_bytes(meta[16:20], "little")
        if magic != 0xBEEFC0DE:
            raise JournalDamaged(f"journal {data} is not an LMDB file (bad magic)")
        last = max(last, int.from_bytes(meta[16 + 8 + 8 + 8 + 96 : 16 + 8 + 8 + 8 + 104], "little"))
    if (last + 1) * page > size:
        raise JournalDamaged(
            f"journal {data} is truncated ({size} bytes, its pages need {(last + 1) * page})"
        )


class Journal:
    """Pending-commit records in LMDB. Methods are short blocking calls (no fsync); LMDB
    failures (disk or map full) surface as ``OSError(ENOSPC)``."""

    def __init__(self, directory: str, map_size: int = 1 << 30) -> None:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        check_files(directory)
        try:
            self._env = lmdb.open(
                directory,
                map_size=map_size,
                sync=False,
                metasync=False,
                max_dbs=1,
                lock=True,
                mode=0o600,
            )
        except lmdb.Error as exc:
            raise JournalDamaged(f"journal {directory} cannot be opened: {exc}") from None

    def write(self, puts: Iterable[Record] = (), deletes: Iterable[str] = ()) -> None:
        """Put and delete records in one transaction (all or nothing)."""
        try:
            with self._env.begin(write=True) as txn:
                for rec_id in deletes:
                    txn.delete(rec_id.encode())
                for rec in puts:
                    txn.put(rec.id.encode(), rec.encode())
        except lmdb.Error as exc:
            raise _no_space(exc) from None

    def put(self, rec: Record) -> None:
        self.write(puts=(rec,))

    def delete(self, rec_id: str) -> None:
        self.write(deletes=(rec_id,))

    def records(self) -> list[Record]:
        """Every record, oldest first (by ``seq``)."""
        out = []
        try:
            with self._env.begin() as txn:
                for _key, value in txn.cursor():
                    out.append(Record.decode(bytes(value)))
        except (lmdb.Error, ValueError, TypeError) as exc:
            raise JournalDamaged(f"journal records cannot be read: {exc}") from None
        out.sort(key=lambda r: r.seq)
        return out

    def sync(self) -> None:
        """Flush the journal to disk (survives power loss)."""
        try:
            self._env.sync(True)
        except lmdb.Error as exc:
            raise _no_space(exc) from None

    def close(self) -> None:
        try:
            self._env.sync(True)
        finally:
            self._env.close()
