"""Staging: the local copies of files being written, until their content is at the origin.

A file opened for writing gets a staging file under ``<cache-dir>/staging/``; every write goes
there, at local-disk speed, and every process on the node reads the staged bytes. The area is
keyed by the path the file will be committed to (renames and deletions of staged files are
local), so it is also the *pending state* the filesystem core merges into lookups and listings.

States of a :class:`Staged` file:

* ``writers > 0``: open for writing;
* ``dirty`` (``gen != committed_gen``): has content the origin does not have; once closed it has
  a journal record (``seq`` set) and the uploader commits it;
* clean and unreferenced: dropped (its file deleted) by :meth:`StagingArea.release`.

Space: dirty bytes are never evicted. :meth:`StagingArea.reserve` makes a writer wait for commits
to free space when the area is over its limit, then fail with ENOSPC.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import logging
import os
import shutil
import time
import uuid
from dataclasses import dataclass, field

import trio

from .journal import Journal, Record

log = logging.getLogger(__name__)


@dataclass(eq=False)
class Staged:
    """One staged file. ``path`` is where it commits to (None once deleted)."""

    id: str
    path: str | None
    file: str
    fd: int
    base_version: str | None
    mode: int
    mtime_ns: int
    size: int
    writers: int = 0
    #: open handles (readers and writers) that use this staged content
    refs: int = 0
    gen: int = 1
    committed_gen: int = 0
    seq: int | None = None
    first_pending_ns: int = 0
    uploading: bool = False
    upload_done: trio.Event = field(default_factory=trio.Event)
    error: str | None = None
    error_transient: bool = True
    attempts: int = 0
    next_try: float = 0.0
    #: generation a commit has been asked for by fsync (uploaded even while open)
    urgent: bool = False

    @property
    def dirty(self) -> bool:
        return self.gen != self.committed_gen

    def touch(self) -> None:
        self.gen += 1
        self.mtime_ns = time.time_ns()


class StagingArea:
    """Staged files by path, their journal, and the space they use. Trio loop only."""

    def __init__(self, cache_dir: str, *, limit: int, min_free: int = 1 << 30) -> None:
        self.dir = os.path.join(cache_dir, "staging")
        self.recovered_dir = os.path.join(cache_dir, "recovered")
        self.conflicts_dir = os.path.join(cache_dir, "conflicts")
        for d in (self.dir, self.recovered_dir, self.conflicts_dir):
            os.makedirs(d, exist_ok=True)
        self.journal = Journal(os.path.join(cache_dir, "journal"))
        self.limit = limit
        self.min_free = min_free
        self.by_path: dict[str, Staged] = {}
        #: every live staged file, including deleted ones still open and those mid-upload
        self.all: dict[str, Staged] = {}
        self._changed = trio.Event()
        self._seq = itertools.count(int(time.time() * 1000))
        self.bytes = 0

    # -- creation and recovery -------------------------------------------------------------

    def create(self, path: str, base_version: str | None, mode: int) -> Staged:
        """A new, empty staged file for ``path`` (replacing any staged file there)."""
        sid = uuid.uuid4().hex
        file = os.path.join(self.dir, sid)
        fd = os.open(file, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        st = Staged(sid, path, file, fd, base_version, mode, time.time_ns(), 0)
        self._bind(st)
        return st

    def _bind(self, st: Staged) -> None:
        old = self.by_path.get(st.path) if st.path is not None else None
        if old is not None and old is not st:
            self.discard(old)
        if st.path is not None:
            self.by_path[st.path] = st
        self.all[st.id] = st

    def recover(self) -> list[Staged]:
        """Rebuild the area from the journal after a restart: every journaled file becomes
        pending again. Staging files without a record (open for writing when the daemon died)
        are moved to ``recovered/`` and reported, never deleted."""
        recs = {r.id: r for r in self.journal.records()}
        out = []
        for rec in sorted(recs.values(), key=lambda r: r.seq):
            file = os.path.join(self.dir, rec.id)
            try:
                fd = os.open(file, os.O_RDWR | os.O_CLOEXEC)
            except FileNotFoundError:
                log.error("journal names %s for %s but its staging file is gone", rec.id, rec.path)
                self.journal.delete(rec.id)
                continue
            size = os.fstat(fd).st_size
            st = Staged(
                rec.id,
                rec.path,
                file,
                fd,
                rec.base_version,
                rec.mode,
                rec.mtime_ns,
                size,
                seq=rec.seq,
                first_pending_ns=rec.first_pending_ns,
            )
            self.bytes += size
            self._bind(st)
            out.append(st)
        for name in os.listdir(self.dir):
            if name not in recs:
                dst = os.path.join(self.recovered_dir, f"{name}.{int(time.time())}")
                shutil.move(os.path.join(self.dir, name), dst)
                log.warning(
                    "a file was open for writing when the daemon stopped; its staged bytes "
                    "are kept in %s",
                    dst,
                )
        return out

    # -- lookups ---------------------------------------------------------------------------

    def get(self, path: str) -> Staged | None:
        return self.by_path.get(path)

    def children(self, dir_path: str) -> list[Staged]:
        """Staged files directly inside directory ``dir_path``."""
        prefix = f"{dir_path}/" if dir_path else ""
        return [
            st
            for p, st in self.by_path.items()
            if p.startswith(prefix) and "/" not in p[len(prefix) :]
        ]

    def under(self, dir_path: str) -> list[Staged]:
        """Staged files anywhere under ``dir_path`` (all of them for the root)."""
        if not dir_path:
            return list(self.by_path.values())
        prefix = dir_path + "/"
        return [st for p, st in self.by_path.items() if p == dir_path or p.startswith(prefix)]

    # -- changes ---------------------------------------------------------------------------

    def write(self, st: Staged, offset: int, data: bytes) -> int:
        n = os.pwrite(st.fd, data, offset)
        end = offset + n
        if end > st.size:
            self.bytes += end - st.size
            st.size = end
        st.touch()
        return n

    def truncate(self, st: Staged, size: int) -> None:
        os.ftruncate(st.fd, size)
        self.bytes += size - st.size
        st.size = size
        st.touch()

    async def reserve(self, st: Staged, end: int, wait_s: float) -> None:
        """Wait until growing ``st`` to ``end`` bytes fits the space limits; ENOSPC after
        ``wait_s`` seconds of waiting for commits to free space."""
        grow = end - st.size
        if grow <= 0 or self._fits(grow):
            return
        with trio.move_on_after(wait_s):
            while True:
                ev = self.change_event()
                if self._fits(grow):
                    return
                await ev.wait()
        raise OSError(
            errno.ENOSPC,
            f"staging area full ({self.bytes} bytes of {self.limit} waiting for commit)",
        )

    def _fits(self, grow: int) -> bool:
        if self.bytes + grow > self.limit:
            return False
        try:
            sv = os.statvfs(self.dir)
        except OSError:
            return True
        return sv.f_bavail * sv.f_frsize - grow >= self.min_free

    def journal_closed(self, st: Staged) -> None:
        """Record that ``st`` is closed with content to commit (survives a daemon crash once
        this returns)."""
        if st.path is None or not st.dirty:
            return
        if st.seq is None:
            st.seq = next(self._seq)
            st.first_pending_ns = time.time_ns()
        self.journal.put(
            Record(
                st.id, st.path, st.base_version, st.mode, st.mtime_ns, st.seq, st.first_pending_ns
            )
        )

    def move(self, old: str, new: str) -> None:
        """Rename staged files at ``old`` (or under it, for a directory) to ``new``."""
        for p in [p for p in self.by_path if p == new or p.startswith(new + "/")]:
            self.discard(self.by_path[p])
        moved = [st for p, st in self.by_path.items() if p == old or p.startswith(old + "/")]
        for st in moved:
            assert st.path is not None
            del self.by_path[st.path]
        for st in moved:
            assert st.path is not None
            st.path = new + st.path[len(old) :]
            self.by_path[st.path] = st
            if st.seq is not None:
                self.journal_closed(st)

    def discard(self, st: Staged) -> None:
        """``st`` was deleted or replaced: it will never be committed."""
        if st.path is not None and self.by_path.get(st.path) is st:
            del self.by_path[st.path]
        st.path = None
        if st.seq is not None:
            self.journal.delete(st.id)
            st.seq = None
        st.committed_gen = st.gen
        self.release(st)

    def mark_committed(self, st: Staged, gen: int) -> None:
        """The origin has generation ``gen`` of ``st``."""
        st.committed_gen = max(st.committed_gen, gen)
        st.error = None
        st.attempts = 0
        if not st.dirty and st.seq is not None:
            self.journal.delete(st.id)
            st.seq = None
        self.notify()

    def release(self, st: Staged) -> bool:
        """Drop ``st`` (delete its file) if it is clean, closed and unreferenced."""
        if st.dirty or st.writers or st.refs or st.uploading:
            return False
        if st.path is not None and self.by_path.get(st.path) is st:
            del self.by_path[st.path]
        if self.all.pop(st.id, None) is None:
            return False
        os.close(st.fd)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(st.file)
        self.bytes -= st.size
        self.notify()
        return True

    def set_aside(self, st: Staged, reason: str) -> str:
        """Keep ``st``'s bytes in ``conflicts/`` (a commit lost a race at the origin)."""
        safe = (st.path or st.id).replace("/", "__")
        dst = os.path.join(self.conflicts_dir, f"{safe}.{int(time.time())}.{st.id[:8]}")
        shutil.copyfile(st.file, dst)
        log.error("commit of %s set aside in %s: %s", st.path, dst, reason)
        return dst

    def notify(self) -> None:
        """Wake every task waiting in :meth:`wait_change` (uploader, writers waiting for
        space, flush)."""
        self._changed.set()
        self._changed = trio.Event()

    def change_event(self) -> trio.Event:
        """An event set at the next :meth:`notify`. Take it *before* checking a condition,
        then ``await ev.wait()`` if the condition is not met (no missed wake-ups)."""
        return self._changed

    def pending(self) -> list[Staged]:
        return [st for st in self.all.values() if st.dirty and st.path is not None]

    def close(self) -> None:
        for st in list(self.all.values()):
            with contextlib.suppress(OSError):
                os.close(st.fd)
        self.journal.close()
