"""Staging: the local copies of files being written, until their content is at the origin.

A file opened for writing gets a staging file under ``<cache-dir>/staging/``; every write goes
there, at local-disk speed, and every process on the node reads the staged bytes. The area is
keyed by the path the file will be committed to (renames and deletions of staged files are
local), so it is also the *pending state* the filesystem core merges into lookups and listings.

Versions. Each path has a :class:`PathState`: the origin version the next commit there
replaces (``base``, *If-Match*), and the staged *versions* of the file, oldest first; the last
one is what every process sees. A file that was closed (journaled) and is opened for writing
again gets a new version (a copy, or empty with ``O_TRUNC``); the closed version stays
untouched and journaled until the new one is itself closed, then its record is deleted in the
same journal transaction that writes the new one. So a crash at any moment leaves the last
closed version intact and committable, never a torn rewrite (the rewrite's bytes are kept in
``recovered/``). At most one version of a path is uploaded at a time, always the newest closed
one; when it lands, ``base`` becomes its version and the versions before it are dropped.

A :class:`Staged` version is:

* open for writing while ``writers > 0`` (open handles hold versions through
  :class:`~airfs.writeback.opens.Opens`, the only owner of ``writers`` and of the handles'
  references; whether a version is closed is :func:`~airfs.writeback.versions.close_due`'s
  rule, applied by :meth:`StagingArea.close_version`);
* ``dirty`` (``gen != committed_gen``): has content the origin does not have; once closed it has
  a journal record (``seq``) describing exactly its bytes (``closed_version``);
* dropped (its file deleted) by :meth:`StagingArea.release` once clean or superseded and
  unreferenced.

Every state change that must survive a crash is queued for the journal by the method that makes
it, in the same call, and is on disk once :meth:`StagingArea.settle` returns (the filesystem
core settles at the end of each operation; :mod:`airfs.writeback.diskq`, off the loop while the
disk is slow). No long ``pwrite`` runs on the trio loop. Counters never go negative (checked).
Space: dirty bytes are never evicted; :meth:`StagingArea.reserve` makes a writer wait for
commits to free space, then fail with ENOSPC. Sizes are counted in allocated bytes, so a sparse
file costs what it stores.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import time
from collections.abc import Callable

import trio

from airfs.util.fileutil import copy_sparse
from airfs.util.pathindex import PathDict

from .barrier import failure_message, wait_committed
from .diskq import DiskQueue
from .journal import Journal
from .records import Records
from .space import DiskFloor, StatVfs, default_min_free
from .stagedio import WRITE_HOP_MIN, StagedBytes, allocated
from .stagefiles import SPARES, Spares
from .versions import UNSURE_MAX, Close, PathState, Staged, close_due

__all__ = ["SPARES", "WRITE_HOP_MIN", "PathState", "Staged", "StagingArea", "failure_message"]

log = logging.getLogger(__name__)


class StagingArea:
    """Staged files by path, their journal, and the space they use. Trio loop only."""

    def __init__(
        self,
        cache_dir: str,
        *,
        limit: int,
        min_free: int | None = None,
        statvfs: StatVfs = os.statvfs,
    ) -> None:
        """The area under ``cache_dir``: at most ``limit`` staged bytes, and never less than
        ``min_free`` bytes left free on its filesystem (None: :func:`default_min_free`; 0:
        no floor). ``statvfs`` measures the filesystem (a test's fake)."""
        self.dir = os.path.join(cache_dir, "staging")
        self.recovered_dir = os.path.join(cache_dir, "recovered")
        self.conflicts_dir = os.path.join(cache_dir, "conflicts")
        for d in (self.dir, self.recovered_dir, self.conflicts_dir):
            os.makedirs(d, mode=0o700, exist_ok=True)
        self.journal_dir = os.path.join(cache_dir, "journal")
        self.journal = Journal(self.journal_dir)
        #: every journal and staging-file change besides file bytes, applied off the loop
        self.disk = DiskQueue(self.journal)
        #: the versions' records, queued on ``disk``
        self.records = Records(self.disk)
        self.limit = limit
        if min_free is None:
            min_free = default_min_free(self.dir, statvfs)
        self.floor = DiskFloor(self.dir, min_free, statvfs=statvfs)
        #: bytes the staged versions take (allocated, so a sparse file costs what it stores)
        self.bytes = 0
        #: reads, writes and truncates of the versions' bytes, and space reservations
        self.io = StagedBytes(self)
        #: live files by path, indexed by directory (``children``/``under`` cost what they
        #: return, not the number of staged files)
        self.paths: PathDict[PathState] = PathDict()
        #: every staged version, including deleted ones still open and superseded ones
        #: still uploading or read
        self.all: dict[str, Staged] = {}
        self._changed = trio.Event()
        self._crashed = False
        #: conflicts not yet reported to a barrier (path, kept copy): the next flush covering
        #: the path fails naming them, even when the conflict happened before it started
        self.unreported: list[tuple[str, str]] = []
        #: empty staging files made ahead, so that a create needs no thread
        self.spares = Spares(self.dir)
        #: called with a path whose commit may have become possible (the uploader's queue)
        self.on_ready: Callable[[PathState], None] = lambda ps: None

    # -- creation --------------------------------------------------------------------------

    async def _new_file(self, path: str) -> Staged:
        """A new staging file for ``path``: one of the :attr:`spares`. Its path attribute
        (what recovery names the bytes of a file open at a crash by: ``recovered/<path>``) is a
        durable change: the operation creating it settles before it answers."""
        sid, file, fd = await self.spares.take()
        st = Staged(sid, file, fd, 0o644, time.time_ns(), 0)
        self.records.name(st, path)
        self.all[sid] = st
        return st

    async def create(self, path: str, base_version: str | None, mode: int) -> Staged:
        """A new, empty file at ``path`` replacing what is staged there (which is
        discarded); its commit replaces origin version ``base_version``."""
        st = await self._new_file(path)
        old = self.paths.get(path)
        ps = PathState(path, base_version)
        if old is not None:
            ps.unsure = list(old.unsure)  # what its failed puts may have left is still there
            self.discard_path(old)
        st.mode = mode
        st.ps = ps
        ps.versions.append(st)
        self.paths[path] = ps
        return st

    def adopt(self, ps: PathState, st: Staged) -> None:
        """Bind a recovered version (see :mod:`airfs.writeback.recovery`)."""
        assert ps.path is not None
        st.ps = ps
        ps.versions.append(st)
        self.paths[ps.path] = ps
        self.all[st.id] = st
        self.bytes += allocated(st)
        if st.seq is not None:
            self.records.seen(st.seq)

    async def new_version(self, st: Staged, *, copy: bool) -> Staged:
        """A new version after live version ``st`` (a copy of its bytes when ``copy``),
        appended once complete (readers never see a partial copy). ENOENT when ``st`` was
        deleted or replaced meanwhile. Writers are moved to it by
        :class:`~airfs.writeback.opens.Opens`, never here."""
        ps = st.ps
        assert ps is not None and ps.path is not None
        path = ps.path
        st.refs += 1  # not dropped meanwhile (its commit may end while we wait)
        try:
            new = await self._new_file(path)
            new.mode, new.uid, new.gid, new.atime_ns = st.mode, st.uid, st.gid, st.atime_ns
            try:
                if copy and st.size:
                    await self.io.reserve(new, allocated(st), 0)  # what it stores, holes aside
                    await trio.to_thread.run_sync(copy_sparse, st.fd, new.fd, st.size)
                    new.size = st.size
                    self.bytes += allocated(new)
            except BaseException:
                self._drop(new)
                raise
        finally:
            st.refs -= 1
        if ps.live is not st or ps.path is None:
            self._drop(new)  # deleted or replaced while we copied
            self.release(st)
            raise OSError(errno.ENOENT, f"{path}: removed while being opened")
        if ps.path != path:  # renamed meanwhile: the new file commits to the new name
            self.records.name(new, ps.path)
        new.mtime_ns = st.mtime_ns if copy else time.time_ns()
        new.ps = ps
        ps.versions.append(new)
        self.records.describe(new)
        self.release(st)  # committed meanwhile: no longer needed
        return new

    def close_version(self, st: Staged, *, other_writers: int = 0, barrier: bool = False) -> None:
        """``st`` may be closed now: journaled when :func:`~airfs.writeback.versions.close_due`
        says so (deferred to the end of the writes in flight), else nothing. The older
        versions it supersedes are dropped in the same journal transaction (but one being
        uploaded, until its upload ends)."""
        due = close_due(st, other_writers=other_writers, barrier=barrier)
        if due is Close.AFTER_WRITES:
            st.close_wanted = True  # StagedBytes closes it when the writes in flight end
        elif due is Close.NOW:
            self._journal(st)

    def _journal(self, st: Staged) -> None:
        ps = st.ps
        assert ps is not None and ps.path is not None
        st.close_wanted = False
        older = ps.versions[: ps.versions.index(st)]
        drop = [v for v in older if not v.uploading]
        self.records.close(st, drop)
        for v in drop:
            v.replaced_by = st
            self._unlink_version(v)
        self.on_ready(ps)

    # -- lookups ---------------------------------------------------------------------------

    def get(self, path: str) -> Staged | None:
        """The live staged version at ``path`` (what every process sees), if any."""
        ps = self.paths.get(path)
        return ps.live if ps is not None else None

    def children(self, dir_path: str) -> list[Staged]:
        """Live staged files directly inside directory ``dir_path``."""
        return [live for p in self.paths.children(dir_path) if (live := self.paths[p].live)]

    def under(self, dir_path: str) -> list[Staged]:
        """Live staged files at or anywhere under ``dir_path`` (all of them for the root)."""
        return [live for p in self.paths.under(dir_path) if (live := self.paths[p].live)]

    def hold(self, *paths: str) -> list[PathState]:
        """Stop new commits at or under ``paths`` until :meth:`unhold` (a rename is changing
        those names at the origin; a commit started meanwhile would race it)."""
        held = []
        for path in paths:
            for p in self.paths.under(path):
                ps = self.paths[p]
                ps.held += 1
                held.append(ps)
        return held

    def unhold(self, held: list[PathState]) -> None:
        for ps in held:
            ps.held -= 1
            if ps.held < 0:
                raise AssertionError(f"{ps.path}: hold count went negative")
            if not ps.held and ps.path is not None:
                self.on_ready(ps)

    def versions(self, st: Staged) -> list[Staged]:
        """The versions of ``st``'s file, oldest first (``[st]`` if it was deleted)."""
        return list(st.ps.versions) if st.ps is not None else [st]

    # -- changes ---------------------------------------------------------------------------

    def set_attrs(
        self,
        st: Staged,
        *,
        mode: int | None,
        mtime_ns: int | None,
        uid: int | None = None,
        gid: int | None = None,
        atime_ns: int | None = None,
    ) -> None:
        """chmod/chown/utime of a staged file: kept through its commit (journaled at once).
        A mode or owner applies to every version; times to the live one (what was set)."""
        now = time.time_ns()
        for v in self.versions(st):
            if mode is not None:
                v.mode = mode
            if uid is not None:
                v.uid = uid
            if gid is not None:
                v.gid = gid
            v.ctime_ns = now
        if mtime_ns is not None:
            st.mtime_ns = mtime_ns
        if atime_ns is not None:
            st.atime_ns = atime_ns
        self.records.rewrite(self.versions(st))

    def move(self, old: str, new: str, *, rebase: bool = False, base: str | None = None) -> None:
        """Rename staged files at ``old`` (or under it, for a directory) to ``new``; what was
        staged at or under ``new`` is discarded. With ``rebase``, ``base`` is the origin
        version the file moved to ``new`` now replaces. Journaled in one transaction. The
        commit delay of the closed versions moved starts again (name operations come in
        runs: a directory put in place, then its old copy deleted)."""
        if not old or not new:
            raise AssertionError("the root is never renamed")
        # the origin may still hold what failed puts of the file replaced at ``new`` left:
        # the file moved there commits over it
        replaced = self.paths.get(new)
        carried = list(replaced.unsure) if replaced is not None else []
        for p in self.paths.under(new):
            self.discard_path(self.paths[p])
        moved = [self.paths[p] for p in self.paths.under(old)]
        for ps in moved:
            assert ps.path is not None
            del self.paths[ps.path]
        changed: list[Staged] = []
        for ps in moved:
            assert ps.path is not None
            ps.path = new + ps.path[len(old) :]
            self.paths[ps.path] = ps
            if rebase and ps.path == new:
                ps.base = base
            if carried and ps.path == new:
                ps.unsure = (carried + ps.unsure)[-UNSURE_MAX:]
            for v in ps.versions:
                self.records.name(v, ps.path)
                changed.append(v)
                if v.closed_at:  # (0: recovered from the journal, committed at once)
                    v.closed_at = time.monotonic()
        self.records.rewrite(changed)

    def discard(self, st: Staged) -> None:
        """``st``'s file was deleted or replaced: none of its versions will be committed."""
        if st.ps is not None:
            self.discard_path(st.ps)
        else:
            self._drop(st)

    def discard_path(self, ps: PathState) -> None:
        if ps.path is not None and self.paths.get(ps.path) is ps:
            del self.paths[ps.path]
        self.records.rewrite((), forget=ps.versions)
        self._drop_priors(ps)
        ps.path = None
        for v in list(ps.versions):
            v.committed_gen = v.gen
            if not v.uploading:
                self._unlink_version(v)
        self.notify()

    def mark_committed(self, st: Staged, gen: int, version: str) -> None:
        """The origin has generation ``gen`` of ``st`` as ``version``: the next commit of its
        file replaces ``version``; older versions are dropped; ``st`` too unless it is what
        every process sees."""
        st.committed_gen = max(st.committed_gen, gen)
        st.error = None
        st.attempts = 0
        ps = st.ps
        if ps is None:
            return
        ps.base = version
        ps.unsure.clear()  # what failed before is replaced at the origin by what landed now
        i = ps.versions.index(st) if st in ps.versions else -1
        done = ps.versions[: i + 1] if not st.dirty else ps.versions[:i]
        newer = ps.versions[i + 1 :]
        self.records.rewrite(newer, forget=done, done=True)
        for v in done:
            if v is not st:
                v.replaced_by = st
        if not st.dirty:
            st.seq = None
        for v in done:
            if v is not ps.live:
                v.committed_gen = v.gen
                self._unlink_version(v)
        self._drop_priors(ps)
        if newer:
            self.on_ready(ps)
        self.notify()

    def _unlink_version(self, v: Staged) -> None:
        """Take ``v`` out of its file's versions (it will never be committed) and drop it
        once unreferenced."""
        ps = v.ps
        if ps is not None and v in ps.versions:
            ps.versions.remove(v)
            if not ps.versions and ps.path is not None and self.paths.get(ps.path) is ps:
                del self.paths[ps.path]
        v.ps = None
        self.release(v)

    def _drop_priors(self, ps: PathState) -> None:
        """Forget the older versions kept from a crash (records, then files: a file whose
        prior record is gone is deleted by recovery)."""
        if ps.priors:
            self.disk.write(deletes=[os.path.basename(f) for f in ps.priors])
        for f in ps.priors:
            self.disk.unlink(f, os.path.basename(f))
        ps.priors.clear()

    def rebase(self, ps: PathState, version: str | None) -> None:
        """The next commit at ``ps``'s path replaces origin version ``version`` (one of our
        own: a commit, attributes we set, a claim): recorded in memory and in the journal
        records of its closed versions, so that after a crash the interrupted commit still
        says *If-Match* what is at the origin (our own version is never a conflict). On disk
        at the next settle (the uploader settles before every put)."""
        if ps.base == version:
            return
        ps.base = version
        self.records.rewrite(ps.versions)

    def upload_finished(self, ps: PathState, st: Staged) -> None:
        """The uploader is done with ``st`` (whatever the outcome)."""
        if ps.uploading is st:
            ps.uploading = None
        st.upload_done.set()
        if ps.path is None and st.ps is ps:
            self._unlink_version(st)  # its file was deleted while it was uploaded
        else:
            self.release(st)
        if ps.path is not None:
            self.on_ready(ps)
        self.notify()

    def _drop(self, st: Staged) -> None:
        st.committed_gen = st.gen
        st.ps = None
        self.release(st)

    def release(self, st: Staged) -> bool:
        """Drop ``st`` (delete its file) if it is clean, closed and unreferenced."""
        if st.writers < 0 or st.refs < 0:
            raise AssertionError(f"staged {st.id}: negative count ({st.writers}, {st.refs})")
        if st.writers or st.refs or st.uploading or st.inflight:
            return False
        ps = st.ps
        if ps is not None and st in ps.versions:
            if st.dirty:
                return False  # still to be committed
            ps.versions.remove(st)
            if ps.path is not None and self.paths.get(ps.path) is ps and not ps.versions:
                del self.paths[ps.path]
        if self.all.pop(st.id, None) is None:
            return False
        self.bytes -= allocated(st)
        self.records.drop(st)
        self.notify()
        return True

    def conflict_copy(self, st: Staged) -> str:
        """Where to keep ``st``'s bytes after it lost a conflict (``conflicts/``, 0600)."""
        safe = (st.path or st.id).replace("/", "__")
        return os.path.join(self.conflicts_dir, f"{safe}.{int(time.time())}.{st.id[:8]}")

    def lost(self, st: Staged, path: str, kept: str) -> None:
        """``st`` lost a conflict at ``path``; its bytes are in ``kept``: forget it."""
        st.conflict = (path, kept)
        self.unreported.append(st.conflict)
        self.records.rewrite((), forget=[st])
        st.committed_gen = st.gen
        ps = st.ps
        if ps is not None and ps.live is st and len(ps.versions) == 1:
            self.discard_path(ps)  # the origin's version is what the path shows now
        else:
            self._unlink_version(st)

    def forget_open(self, st: Staged) -> None:
        """Version ``st``, adopted open by a take-over (no journal record) but reopened by
        no handle, leaves the area: nothing will commit it (its bytes were kept aside)."""
        if st.writers or st.seq is not None:
            raise AssertionError(f"staged {st.id}: not an unclaimed open version")
        st.committed_gen = st.gen
        self._unlink_version(st)

    def notify(self) -> None:
        """Wake every task waiting for a change (uploader, writers waiting for space,
        barriers)."""
        self._changed.set()
        self._changed = trio.Event()

    def change_event(self) -> trio.Event:
        """An event set at the next :meth:`notify`. Take it *before* checking a condition,
        then ``await ev.wait()`` if the condition is not met (no missed wake-ups)."""
        return self._changed

    async def settle(self, *, sync: bool = False, files: bool = False) -> None:
        """Return once every change made so far is on disk (see
        :meth:`~airfs.writeback.diskq.DiskQueue.settle`; ``sync``: the journal synced too;
        ``files``: the staging files dropped so far deleted too)."""
        await self.disk.settle(sync=sync, files=files)

    async def run_settler(self, interval: float = 1.0) -> None:
        """Forever: every ``interval`` seconds, apply what no operation settled (a commit's
        journal changes, a batch the journal refused) and sync the journal to disk (power
        loss). Started by :func:`airfs.daemon.build.build`."""
        while True:
            await trio.sleep(interval)
            try:
                await self.settle(sync=True)
            except OSError as exc:
                log.error("journal sync failed: %s", exc)

    async def wait_committed(
        self,
        targets: list[tuple[Staged, int]],
        on_progress: Callable[[dict[str, object]], None] | None = None,
    ) -> int:
        """See :func:`airfs.writeback.barrier.wait_committed`."""
        return await wait_committed(self, targets, on_progress)

    def pending(self) -> list[Staged]:
        return [st for st in self.all.values() if st.dirty and st.path is not None]

    def crashed(self) -> None:
        """Test hook (:mod:`airfs.testing.corehost`): :meth:`close` will drop what is still
        queued for the disk instead of applying it, as a crash of the daemon would."""
        self._crashed = True

    def close(self) -> None:
        """Apply what is queued (errors logged), close every staging file and the journal."""
        try:
            if not self._crashed:
                self.disk.settle_now()
        except OSError as exc:
            log.error("staging: could not write the last journal changes: %s", exc)
        self.disk.close()
        self.spares.close()
        for st in list(self.all.values()):
            with contextlib.suppress(OSError):
                os.close(st.fd)
        self.journal.close()
