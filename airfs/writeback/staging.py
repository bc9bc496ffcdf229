"""Staging: the local copies of files being written, until their content is at the origin.

A file opened for writing gets a staging file under ``<cache-dir>/staging/``; every write goes
there, at local-disk speed, and every process on the node reads the staged bytes. The area is
keyed by the path the file will be committed to (renames and deletions of staged files are
local), so it is also the *pending state* the filesystem core merges into lookups and listings.

Versions. At a path there is one *live* staged file (what every process sees) and possibly the
*closed version* it supersedes (``live.pred``): a file that was closed (journaled) and is
opened for writing again gets a new staging file (a copy, or empty with ``O_TRUNC``) and the
closed version stays untouched, journaled, until the new one is itself closed. Then, in one
journal transaction, the new record replaces the old one. So a crash at any moment leaves the
last closed version intact and committable, never a torn rewrite (the rewrite's bytes are kept
in ``recovered/``). The uploader may commit a closed version while its successor is being
written; the successor then commits *If-Match* that version.

States of a :class:`Staged` file:

* ``writers > 0``: open for writing;
* ``dirty`` (``gen != committed_gen``): has content the origin does not have; once closed it has
  a journal record (``seq`` set) and the uploader commits it;
* clean and unreferenced: dropped (its file deleted) by :meth:`StagingArea.release`.

Every state change that must survive a crash is journaled by the method that makes it, in the
same call (:meth:`close_writer`, :meth:`move`, :meth:`rebase`, :meth:`discard`,
:meth:`mark_committed`). Counters never go negative (checked).

Space: dirty bytes are never evicted. :meth:`StagingArea.reserve` makes a writer wait for commits
to free space when the area is over its limit, then fail with ENOSPC. Sizes are counted in
allocated bytes, so a sparse file costs what it stores.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import logging
import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import trio

from .journal import PATH_XATTR, RECORD_XATTR, Journal, Record

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
    #: journaled (closed with content to commit) when set; ``journaled_gen`` is the
    #: generation the record describes
    seq: int | None = None
    journaled_gen: int = 0
    first_pending_ns: int = 0
    uploading: bool = False
    upload_done: trio.Event = field(default_factory=trio.Event)
    error: str | None = None
    error_transient: bool = True
    attempts: int = 0
    next_try: float = 0.0
    #: a commit has been asked for by fsync/flush (uploaded even while open)
    urgent: bool = False
    #: the closed version this one supersedes, kept until this one is journaled
    pred: Staged | None = None
    #: the newer version that supersedes this one (this one is its ``pred``)
    succ: Staged | None = None
    #: where this version's bytes were kept after it lost a conflict at the origin
    conflict: tuple[str, str] | None = None

    @property
    def dirty(self) -> bool:
        return self.gen != self.committed_gen

    @property
    def closed_version(self) -> bool:
        """Journaled and not written since: its bytes are what its record describes."""
        return self.seq is not None and self.journaled_gen == self.gen

    def failed_since(self, attempts: int) -> bool:
        """Failed, for a reason retrying will not fix, in an attempt made after the count
        was ``attempts`` (the one rule fsync, flush and unmount share)."""
        return (
            self.error is not None
            and not self.error_transient
            and self.attempts > attempts
            and not self.uploading
        )

    def touch(self, mtime_ns: int | None = None) -> None:
        self.gen += 1
        self.mtime_ns = time.time_ns() if mtime_ns is None else mtime_ns


def _set_xattr(fd: int, name: str, value: bytes) -> None:
    with contextlib.suppress(OSError):  # unsupported on this filesystem: the journal still is
        os.setxattr(fd, name, value)


def _remove_record_xattr(st: Staged) -> None:
    """Before a record is deleted from the journal (so that a crash in between never looks
    like a lost record)."""
    with contextlib.suppress(OSError):
        os.removexattr(st.fd, RECORD_XATTR)


def _copy_file(src: int, dst: int, size: int) -> None:
    """Copy ``size`` bytes of ``src`` into empty ``dst`` (in the kernel where possible)."""
    off = 0
    while off < size:
        try:
            n = os.copy_file_range(src, dst, min(64 << 20, size - off), off, off)
        except OSError as exc:
            if exc.errno not in (errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL):
                raise
            data = os.pread(src, min(8 << 20, size - off), off)
            n = os.pwrite(dst, data, off) if data else 0
        if n == 0:
            break
        off += n
    os.ftruncate(dst, size)


class StagingArea:
    """Staged files by path, their journal, and the space they use. Trio loop only."""

    def __init__(self, cache_dir: str, *, limit: int, min_free: int = 1 << 30) -> None:
        self.dir = os.path.join(cache_dir, "staging")
        self.recovered_dir = os.path.join(cache_dir, "recovered")
        self.conflicts_dir = os.path.join(cache_dir, "conflicts")
        for d in (self.dir, self.recovered_dir, self.conflicts_dir):
            os.makedirs(d, mode=0o700, exist_ok=True)
        self.journal_dir = os.path.join(cache_dir, "journal")
        self.journal = Journal(self.journal_dir)
        self.limit = limit
        self.min_free = min_free
        self.by_path: dict[str, Staged] = {}
        #: every live staged file, including deleted ones still open, closed versions kept
        #: behind a rewrite, and those mid-upload
        self.all: dict[str, Staged] = {}
        self._changed = trio.Event()
        self._seq = itertools.count(int(time.time() * 1000))
        self.bytes = 0
        #: closed files whose journal record could not be written (disk full): retried
        self.unjournaled: set[Staged] = set()
        #: called with a staged file that may have become ready to commit (the uploader's
        #: queue)
        self.on_ready: Callable[[Staged], None] = lambda st: None

    # -- creation --------------------------------------------------------------------------

    def create(self, path: str, base_version: str | None, mode: int) -> Staged:
        """A new, empty staged file for ``path`` (replacing any staged file there)."""
        st = self._new(path, base_version, mode)
        self._bind(st)
        return st

    def _new(self, path: str, base_version: str | None, mode: int) -> Staged:
        sid = uuid.uuid4().hex
        file = os.path.join(self.dir, sid)
        fd = os.open(file, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        _set_xattr(fd, PATH_XATTR, path.encode("utf-8", "surrogateescape"))
        return Staged(sid, path, file, fd, base_version, mode, time.time_ns(), 0)

    def _bind(self, st: Staged) -> None:
        old = self.by_path.get(st.path) if st.path is not None else None
        if old is not None and old is not st:
            self.discard(old)
        if st.path is not None:
            self.by_path[st.path] = st
        self.all[st.id] = st

    def adopt(self, st: Staged) -> None:
        """Bind a recovered staged file (see :mod:`airfs.writeback.recovery`)."""
        self.bytes += self._allocated(st)
        self._bind(st)
        if st.seq is not None:
            self._seq = itertools.count(max(next(self._seq), st.seq + 1))

    async def open_write(self, st: Staged, *, truncate: bool) -> Staged:
        """Open live staged file ``st`` for writing; returns the staged file to write into.

        A closed version (journaled, not written since) is never written again: a new staged
        file takes its place at the path (a copy of its bytes, or empty when ``truncate``),
        and it stays journaled until the new one is closed (:meth:`close_writer`)."""
        if st.writers == 0 and (st.closed_version or st.uploading):
            new = self._new(st.path or "", st.base_version, st.mode)
            new.path = st.path
            if not truncate and st.size:
                await self.reserve(new, st.size, 0)
                await trio.to_thread.run_sync(_copy_file, st.fd, new.fd, st.size)
                new.size = st.size
                new.mtime_ns = st.mtime_ns
                self.bytes += self._allocated(new)
            new.pred = st
            st.succ = new
            if st.path is not None:
                self.by_path[st.path] = new
            self.all[new.id] = new
            st = new
        elif truncate and st.size:
            self.truncate(st, 0)
        st.writers += 1
        return st

    async def fork(self, st: Staged) -> Staged:
        """``st`` is a closed version that is still open for writing (written again after
        ``close()`` of one of its descriptors, or after ``fsync``): give its writers a copy to
        write into, so the journaled bytes stay as they were."""
        new = self._new(st.path or "", st.base_version, st.mode)
        new.path = st.path
        if st.size:
            await self.reserve(new, st.size, 0)
            await trio.to_thread.run_sync(_copy_file, st.fd, new.fd, st.size)
            new.size = st.size
            self.bytes += self._allocated(new)
        new.mtime_ns = st.mtime_ns
        new.writers, st.writers = st.writers, 0
        new.urgent = False
        new.pred, st.succ = st, new
        if st.path is not None and self.by_path.get(st.path) is st:
            self.by_path[st.path] = new
        self.all[new.id] = new
        self.on_ready(st)  # its writers are gone: it can be committed
        return new

    def close_writer(self, st: Staged) -> None:
        """One writer of ``st`` closed. The last one journals its content (it survives a daemon
        crash from here on) and, in the same transaction, drops the closed version it
        superseded."""
        if st.writers <= 0:
            raise AssertionError(f"staged {st.id}: writer count would go negative")
        st.writers -= 1
        if st.writers == 0:
            self.journal_closed(st)

    def journal_closed(self, st: Staged) -> None:
        """Record ``st`` as closed with content to commit (no-op if it is clean, deleted, or
        already journaled at this generation)."""
        if st.path is None or not st.dirty or st.closed_version:
            return
        if st.seq is None:
            seq = next(self._seq)
            first = time.time_ns()
        else:
            seq, first = st.seq, st.first_pending_ns
        pred = st.pred
        drop = pred is not None and not pred.uploading
        rec = Record(st.id, st.path, st.base_version, st.mode, st.mtime_ns, seq, first)
        try:
            gone = (pred.id,) if drop and pred is not None and pred.seq is not None else ()
            self.journal.write(puts=(rec,), deletes=gone)
        except OSError:
            self.unjournaled.add(st)  # tried again by retry_journal(); the bytes stay staged
            raise
        self.unjournaled.discard(st)
        st.seq, st.first_pending_ns = seq, first
        if drop and pred is not None and pred.seq is not None:
            _remove_record_xattr(pred)
        st.journaled_gen = st.gen
        _set_xattr(st.fd, RECORD_XATTR, rec.encode())
        if drop and pred is not None:
            self._forget_version(pred)
        self.on_ready(st)

    def _record(self, st: Staged) -> Record:
        assert st.path is not None and st.seq is not None
        return Record(
            st.id, st.path, st.base_version, st.mode, st.mtime_ns, st.seq, st.first_pending_ns
        )

    def _rejournal(self, sts: list[Staged]) -> None:
        recs = [self._record(s) for s in sts if s.seq is not None and s.path is not None]
        if recs:
            self.journal.write(puts=recs)
            for s, rec in zip([s for s in sts if s.seq is not None], recs, strict=True):
                _set_xattr(s.fd, RECORD_XATTR, rec.encode())

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
        """Live staged files anywhere under ``dir_path`` (all of them for the root)."""
        if not dir_path:
            return list(self.by_path.values())
        prefix = dir_path + "/"
        return [st for p, st in self.by_path.items() if p == dir_path or p.startswith(prefix)]

    def versions(self, st: Staged) -> list[Staged]:
        """``st`` and the closed versions behind it, oldest first."""
        out = [st]
        while out[0].pred is not None:
            out.insert(0, out[0].pred)  # type: ignore[arg-type]
        return out

    # -- changes ---------------------------------------------------------------------------

    def write(self, st: Staged, offset: int, data: bytes) -> int:
        if st.closed_version:
            raise AssertionError(f"staged {st.id}: a closed version is never written")
        n = os.pwrite(st.fd, data, offset)
        end = offset + n
        if end > st.size:
            self.bytes += end - st.size
            st.size = end
        st.touch()
        return n

    def truncate(self, st: Staged, size: int) -> None:
        if st.closed_version:
            raise AssertionError(f"staged {st.id}: a closed version is never truncated")
        before = self._allocated(st)
        os.ftruncate(st.fd, size)
        st.size = size
        self.bytes += self._allocated(st) - before
        st.touch()

    def set_attrs(self, st: Staged, *, mode: int | None, mtime_ns: int | None) -> None:
        """chmod/utime of a staged file: kept through its commit (journaled at once)."""
        if mode is not None:
            st.mode = mode
        if mtime_ns is not None:
            st.mtime_ns = mtime_ns
        for v in self.versions(st):
            if mode is not None:
                v.mode = mode
        self._rejournal(self.versions(st))

    @staticmethod
    def _allocated(st: Staged) -> int:
        try:
            return min(st.size, os.fstat(st.fd).st_blocks * 512)
        except OSError:
            return st.size

    async def reserve(self, st: Staged, end: int, wait_s: float) -> None:
        """Wait until growing ``st`` to ``end`` bytes fits the space limits; ENOSPC after
        ``wait_s`` seconds of waiting for commits to free space."""
        grow = end - st.size
        if grow <= 0 or await self._fits(grow):
            return
        with trio.move_on_after(wait_s):
            while True:
                ev = self.change_event()
                if await self._fits(grow):
                    return
                await ev.wait()
        raise OSError(
            errno.ENOSPC,
            f"staging area full ({self.bytes} bytes of {self.limit} waiting for commit)",
        )

    async def _fits(self, grow: int) -> bool:
        if self.bytes + grow > self.limit:
            return False
        if grow < (1 << 20) and self.min_free == 0:
            return True
        try:
            sv = await trio.to_thread.run_sync(os.statvfs, self.dir)
        except OSError:
            return True
        return sv.f_bavail * sv.f_frsize - grow >= self.min_free

    def move(self, old: str, new: str, *, rebase: bool = False, base: str | None = None) -> None:
        """Rename staged files at ``old`` (or under it, for a directory) to ``new``; what was
        staged at or under ``new`` is discarded. With ``rebase``, ``base`` is the origin
        version the file moved to ``new`` now replaces. Journaled in one transaction."""
        for p in [p for p in self.by_path if p == new or p.startswith(new + "/")]:
            self.discard(self.by_path[p])
        moved = [st for p, st in self.by_path.items() if p == old or p.startswith(old + "/")]
        for st in moved:
            assert st.path is not None
            del self.by_path[st.path]
        changed: list[Staged] = []
        for st in moved:
            assert st.path is not None
            st.path = new + st.path[len(old) :]
            self.by_path[st.path] = st
            for v in self.versions(st):
                v.path = st.path
                if v is not st:
                    changed.append(v)
                _set_xattr(v.fd, PATH_XATTR, st.path.encode("utf-8", "surrogateescape"))
            if rebase and st.path == new:
                for v in self.versions(st):
                    v.base_version = base
            changed.append(st)
        self._rejournal(changed)

    def rebase(self, st: Staged, version: str | None) -> None:
        """``st`` now replaces origin version ``version`` (journaled at once)."""
        st.base_version = version
        self._rejournal([st])

    def discard(self, st: Staged) -> None:
        """``st`` (and the closed versions behind it) were deleted or replaced: they will
        never be committed."""
        versions = self.versions(st)
        if st.path is not None and self.by_path.get(st.path) is st:
            del self.by_path[st.path]
        for v in versions:
            if v.seq is not None:
                _remove_record_xattr(v)
        self.journal.write(deletes=[v.id for v in versions if v.seq is not None])
        for v in versions:
            self._forget_version(v)

    def unchain_if_clean(self, st: Staged) -> None:
        """``st`` holds nothing the origin lacks (committed before a successor forked from
        it): the successor need not wait for it; it already replaces ``st``'s version."""
        succ = st.succ
        if not st.dirty and succ is not None and succ.pred is st:
            succ.pred = None
            succ.base_version = st.base_version
            st.succ = None
            self._rejournal([succ])

    def _forget_version(self, v: Staged) -> None:
        """``v`` will never be committed (its record is already gone): unlink it from the
        version chain and drop it once unreferenced."""
        if v.succ is not None and v.succ.pred is v:
            v.succ.pred = None
        v.succ = None
        v.pred = None
        v.path = None
        v.seq = None
        v.committed_gen = v.gen
        self.release(v)

    def mark_committed(self, st: Staged, gen: int, version: str) -> None:
        """The origin has generation ``gen`` of ``st`` as ``version``: the version after it at
        its path (if any) now replaces ``version``."""
        st.committed_gen = max(st.committed_gen, gen)
        st.error = None
        st.attempts = 0
        succ = [st.succ] if st.succ is not None and st.succ.pred is st else []
        for s in succ:
            s.pred = None
            s.base_version = version
        superseded = st.succ is not None
        st.succ = None
        st.base_version = version
        if not st.dirty and st.seq is not None:
            _remove_record_xattr(st)
            self.journal.write(
                puts=[self._record(s) for s in succ if s.seq is not None and s.path is not None],
                deletes=(st.id,),
            )
            st.seq = None
        else:
            self._rejournal([*succ, st])
        if superseded:
            st.path = None
        self.notify()

    def release(self, st: Staged) -> bool:
        """Drop ``st`` (delete its file) if it is clean, closed and unreferenced."""
        if st.writers < 0 or st.refs < 0:
            raise AssertionError(f"staged {st.id}: negative count ({st.writers}, {st.refs})")
        if st.dirty or st.writers or st.refs or st.uploading:
            return False
        if st.succ is not None and st.succ.pred is st:
            return False  # still the closed version behind a rewrite
        if st.path is not None and self.by_path.get(st.path) is st:
            del self.by_path[st.path]
        if self.all.pop(st.id, None) is None:
            return False
        self.bytes -= self._allocated(st)
        os.close(st.fd)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(st.file)
        self.notify()
        return True

    def conflict_copy(self, st: Staged) -> str:
        """Where to keep ``st``'s bytes after it lost a conflict (``conflicts/``, 0600)."""
        safe = (st.path or st.id).replace("/", "__")
        return os.path.join(self.conflicts_dir, f"{safe}.{int(time.time())}.{st.id[:8]}")

    def notify(self) -> None:
        """Wake every task waiting in :meth:`wait_change` (uploader, writers waiting for
        space, flush)."""
        self._changed.set()
        self._changed = trio.Event()

    def change_event(self) -> trio.Event:
        """An event set at the next :meth:`notify`. Take it *before* checking a condition,
        then ``await ev.wait()`` if the condition is not met (no missed wake-ups)."""
        return self._changed

    def retry_journal(self) -> None:
        """Write the records that failed before (called periodically by the daemon)."""
        for st in list(self.unjournaled):
            if st.writers or st.path is None:
                self.unjournaled.discard(st)
                continue
            try:
                self.journal_closed(st)
            except OSError as exc:
                log.error("%s: still cannot journal its close: %s", st.path, exc)
                return

    async def wait_committed(
        self,
        targets: list[tuple[Staged, int]],
        on_progress: Callable[[dict[str, object]], None] | None = None,
    ) -> int:
        """Ask for each ``(staged, generation)`` to be committed (even while open) and wait for
        all of them. Raises ``OSError`` (EIO) naming the files that cannot be committed (a
        non-transient failure) or that lost a conflict, with where their bytes are kept;
        waits through transient failures (cancel the caller to give up). Returns the count."""
        start = {st.id: st.attempts for st, _ in targets}
        for st, _gen in targets:
            if st.error is not None:
                st.next_try = 0.0  # a barrier makes a fresh attempt at once
            if not st.urgent or st.error is not None:
                st.urgent = True
                self.on_ready(st)
        last = 0.0
        while True:
            ev = self.change_event()
            lost = [st for st, _ in targets if st.conflict is not None]
            left = [
                (st, g)
                for st, g in targets
                if st.path is not None and st.committed_gen < g and st.conflict is None
            ]
            hard = [st for st, _ in left if st.failed_since(start[st.id])]
            if hard or (lost and not left):
                raise OSError(errno.EIO, _failure(hard, lost))
            if not left:
                return len(targets)
            now = time.monotonic()
            if on_progress is not None and now - last >= 0.5:
                last = now
                on_progress(
                    {
                        "left": len(left),
                        "total": len(targets),
                        "bytes_left": sum(s.size for s, _ in left),
                    }
                )
            with trio.move_on_after(1.0):
                await ev.wait()

    def pending(self) -> list[Staged]:
        return [st for st in self.all.values() if st.dirty and st.path is not None]

    def close(self) -> None:
        for st in list(self.all.values()):
            with contextlib.suppress(OSError):
                os.close(st.fd)
        self.journal.close()


def _failure(hard: list[Staged], lost: list[Staged]) -> str:
    parts = []
    if lost:
        kept = "; ".join(f"{c[0]} -> {c[1]}" for st in lost[:5] if (c := st.conflict))
        parts.append(
            f"{len(lost)} file(s) lost a conflict with another version at the origin; "
            f"their bytes are kept: {kept}"
        )
    if hard:
        names = ", ".join(str(st.path) for st in hard[:5])
        parts.append(f"{len(hard)} file(s) cannot be committed ({names}): {hard[0].error}")
    return "; ".join(parts)
