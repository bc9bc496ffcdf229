"""The write-back journal: which staged files are closed and wait for their commit.

An LMDB environment under ``<cache-dir>/journal``. One record per staged file, keyed by its
staging id, holding the path it commits to and what the commit needs. A record is written when
a written file is closed and deleted once its content is at the origin.

Durability: records are written without an fsync per transaction (``sync=False``), so a record
survives a crash of the daemon as soon as :meth:`Journal.put` returns (it is in the kernel's page
cache); :meth:`Journal.sync` (called periodically by the daemon, and on ``fsync``/``flush``/
unmount) makes it survive a power loss too.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass

import lmdb


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


class Journal:
    """Pending-commit records in LMDB. Methods are short blocking calls (no fsync)."""

    def __init__(self, directory: str, map_size: int = 1 << 30) -> None:
        os.makedirs(directory, exist_ok=True)
        self._env = lmdb.open(
            directory, map_size=map_size, sync=False, metasync=False, max_dbs=1, lock=True
        )

    def put(self, rec: Record) -> None:
        with self._env.begin(write=True) as txn:
            txn.put(rec.id.encode(), json.dumps(asdict(rec)).encode())

    def delete(self, rec_id: str) -> None:
        with self._env.begin(write=True) as txn:
            txn.delete(rec_id.encode())

    def records(self) -> list[Record]:
        """Every record, oldest first (by ``seq``)."""
        out = []
        with self._env.begin() as txn:
            for _key, value in txn.cursor():
                out.append(Record(**json.loads(bytes(value))))
        out.sort(key=lambda r: r.seq)
        return out

    def sync(self) -> None:
        """Flush the journal to disk (survives power loss)."""
        self._env.sync(True)

    def close(self) -> None:
        self._env.sync(True)
        self._env.close()
