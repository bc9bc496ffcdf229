"""The uploader: commits closed staged files to the origin in the background.

Order: a heap by the time a file first became pending (rewriting a pending file does not push
it back, so nothing starves), files asked for by ``fsync``/``flush`` before the rest. A file is
uploaded once no process has it open for writing (or at once when fsync'ed), and only after
the closed version it supersedes (so one path's versions reach the origin in order, each
*If-Match* the one before). A rewrite never waits for an upload: it writes a new staged file.

Commits are idempotent: a conditional put that fails because the origin already holds exactly
these bytes (a retried PUT whose first attempt landed, a crash between the PUT and the journal
update) is a success, not a conflict. Sizes, then the MD5 ETag (S3 single-part) or the bytes
themselves, are compared. Our own half-done commit is never a conflict: before every put the
journal is settled, so that the record on disk says *If-Match* exactly what the put says; a
crash during the put therefore leaves either the old version (the version the record names)
or our bytes (recognised as landed) at the origin. Nor is a version of ours whose put failed
and still landed (a lost response), though the file was rewritten or renamed before the retry:
such puts' fingerprints are kept until a commit lands (:mod:`airfs.writeback.unsure`).

Failures: transient errors (origin down, timeouts) are retried with backoff, forever; other
errors (permission denied...) are retried slowly and reported in ``status`` and the log; a
conditional commit that loses to a different object at the origin (:class:`Conflict`) keeps
its bytes in ``<cache-dir>/conflicts/`` (mode 0600), and every barrier that covered it
(``fsync``, ``airfs flush``, unmount) fails naming the file and where its bytes are.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import heapq
import itertools
import logging
import os
import random
import shutil
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import Any

import trio

from airfs.origin.aio import AsyncOrigin
from airfs.origin.base import Conflict, Entry, NotFound, OriginError, PutCancel, PutCancelled

from . import unsure
from .staging import PathState, Staged, StagingArea, failure_message
from .versions import UNSURE_MAX

log = logging.getLogger(__name__)

CommittedHook = Callable[[str, Entry, Staged], Awaitable[None]]


@dataclass(frozen=True)
class WriteBackStats:
    """``Uploader.statistics()`` (``airfs status`` shows it under ``writeback``)."""

    pending_files: int
    pending_bytes: int
    oldest_pending_s: float
    uploading: int
    staging_bytes: int
    staging_limit: int
    committed_files: int
    committed_bytes: int
    commit_mib_s: float
    recent_commit_mib_s: float
    already_committed: int
    #: uploads stopped by a rename or unlink of their file (committed later, or never)
    cancelled_uploads: int
    errors: int
    last_error: str | None
    failing: tuple[dict[str, Any], ...]
    conflicts: tuple[dict[str, Any], ...]

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["failing"] = list(self.failing)
        d["conflicts"] = list(self.conflicts)
        return d


class Uploader:
    """Background commit loop. Start :meth:`run` in the daemon's nursery.

    A closed version is committed ``commit_delay`` seconds after its close (sooner when a
    barrier asks for it: ``fsync``, ``msync``, ``airfs flush``, unmount), so that the name
    operations that follow a close at once find a file not yet uploaded and stay local: the
    temporary file of an atomic write (written, closed, renamed over its target) is committed
    once, at its final name, and a scratch file deleted soon after its close is never
    uploaded; without the delay each such rename or unlink waits for the upload of the old
    name and then renames (on S3: copies) or deletes it at the origin."""

    def __init__(
        self,
        area: StagingArea,
        origin: AsyncOrigin,
        *,
        concurrency: int = 8,
        commit_delay: float = 0.0,
        on_committed: CommittedHook | None = None,
    ) -> None:
        self.area = area
        self.origin = origin
        self.concurrency = concurrency
        self.commit_delay = commit_delay
        self.on_committed = on_committed
        self.active = 0
        self.committed_files = 0
        self.committed_bytes = 0
        self.already_committed = 0
        #: uploads stopped by a name operation (:meth:`Staged.cancel_upload`)
        self.cancelled = 0
        self.commit_seconds = 0.0
        self.errors = 0
        self.last_error: str | None = None
        self.conflicts: collections.deque[dict[str, Any]] = collections.deque(maxlen=100)
        self._recent: collections.deque[tuple[float, int]] = collections.deque(maxlen=256)
        self._heap: list[tuple[bool, int, int, PathState]] = []
        self._tie = itertools.count()
        area.on_ready = self.enqueue
        for ps in area.paths.values():
            self.enqueue(ps)

    # -- the queue -------------------------------------------------------------------------

    def enqueue(self, ps: PathState) -> None:
        """``ps`` may have a version ready to commit (closed, fsync'ed, its previous upload
        done, or its retry delay passed); checked again when popped."""
        cand = ps.candidate()
        if cand is None:
            return
        urgent = any(v.urgent for v in ps.versions)
        heapq.heappush(self._heap, (not urgent, cand.seq or 0, next(self._tie), ps))
        self.area.notify()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            task_status.started()
            while True:
                ev = self.area.change_event()
                now = time.monotonic()
                later: list[tuple[bool, int, int, PathState]] = []
                while self._heap and self.active < self.concurrency:
                    item = heapq.heappop(self._heap)
                    ps = item[3]
                    cand = ps.candidate()
                    if cand is None:
                        continue  # nothing to do, or an upload runs (it re-queues the path)
                    if self.due(cand) > now:
                        later.append(item)  # its commit delay or retry delay not over yet
                        continue
                    self._start(nursery, ps, cand)
                for item in later:
                    heapq.heappush(self._heap, item)
                waits = [self.due(c) - now for it in later if (c := it[3].candidate())]
                with trio.move_on_after(min(waits) if waits else 5.0):
                    await ev.wait()

    def due(self, st: Staged) -> float:
        """When (monotonic) the commit of ``st`` may start: after its retry delay, and after
        the commit delay from its close unless a barrier made it urgent."""
        if st.urgent:
            return st.next_try
        return max(st.next_try, st.closed_at + self.commit_delay)

    def _start(self, nursery: trio.Nursery, ps: PathState, st: Staged) -> None:
        ps.uploading = st
        st.upload_done = trio.Event()
        st.put_cancel = PutCancel() if self.origin.capabilities.cancel_puts else None
        self.active += 1
        nursery.start_soon(self._upload, ps, st)

    async def _upload(self, ps: PathState, st: Staged) -> None:
        path, gen = ps.path, st.gen
        assert path is not None
        t0 = time.monotonic()
        try:
            entry = await self._commit(ps, st, path)
        except PutCancelled:
            # a name operation stopped it before it published anything: still pending
            self.cancelled += 1
            log.debug("commit of %s stopped for a name operation", path)
        except Conflict as exc:
            await self._lost(st, path, exc)
        except OriginError as exc:
            if exc.transient:
                await self._remember_unsure(ps, st)
            self._fail(st, f"commit of {path} failed: {exc}", transient=exc.transient)
        except Exception as exc:  # a bug must not kill the uploader and strand the queue
            log.exception("commit of %s failed", path)
            self._fail(st, f"commit of {path} failed: {exc!r}", transient=False)
        else:
            try:
                if ps.path != path:  # deleted (or renamed) while its upload ran
                    if ps.path is None and self.area.get(path) is None:
                        await self._undo_stray(path)
                else:
                    live = ps.live is st
                    self._done(st, path, gen, entry, time.monotonic() - t0)
                    if live and self.on_committed is not None:
                        await self.on_committed(path, entry, st)
            except Exception:
                log.exception("bookkeeping after the commit of %s failed", path)
        finally:
            self.active -= 1
            st.put_cancel = None
            self.area.upload_finished(ps, st)
        # the commit's journal changes go with the next batch (an operation's, or the
        # daemon's every second): a crash before leaves a record the next commit recognises
        # as landed ("the origin already holds these bytes")

    async def _commit(self, ps: PathState, st: Staged, path: str) -> Entry:
        """Put ``st`` at ``path``, conditional on the version it replaces where the origin can
        check it. A conflict is no conflict when the origin holds our very bytes (a commit
        that landed), or the bytes of our own older version (a crash after its commit
        landed): then the put is retried on top of it."""
        caps = self.origin.capabilities
        for _ in range(2):
            # the record on disk must name the version this put replaces (a crash during
            # the put leaves that version or ours at the origin, never a false conflict);
            # with the journal refusing writes (disk full) the commit still goes ahead: it is
            # what frees space (the settler retries and logs every second)
            with contextlib.suppress(OSError):
                await self.area.settle()
            if_match = (ps.base or "") if caps.conditional_put else None
            try:
                return await self.origin.put(
                    path,
                    st.file,
                    if_match,
                    mode=st.mode & 0o7777,
                    mtime_ns=st.mtime_ns,
                    uid=st.uid,
                    gid=st.gid,
                    cancel=st.put_cancel,
                )
            except Conflict:
                entry = await self._stat(path)
                if entry is None:
                    raise
                if await self._same(path, entry, st.fd, st.size):
                    self.already_committed += 1
                    log.info("%s: the origin already holds these bytes", path)
                    return entry
                if not await self._is_prior(ps, path, entry):
                    raise
                log.info("%s: the origin holds our previous version: committing over it", path)
                self.area.rebase(ps, entry.version)
        raise Conflict(f"{path}: changed at the origin since it was opened")

    async def _stat(self, path: str) -> Entry | None:
        try:
            return await self.origin.stat(path)
        except NotFound:
            return None

    async def _remember_unsure(self, ps: PathState, st: Staged) -> None:
        """``st``'s put failed and may still have landed: keep its fingerprint in
        ``ps.unsure`` (once per generation; its bytes cannot change meanwhile: it is still
        the upload). Not past :data:`~airfs.writeback.unsure.COMPARE_MAX`."""
        if st.unsure_gen == st.gen:
            return
        if not unsure.worth_keeping(st.size):
            return
        try:
            digest = await trio.to_thread.run_sync(unsure.md5_of_file, st.fd, st.size)
        except OSError as exc:
            log.warning("%s: could not fingerprint a failed commit: %s", ps.path, exc)
            return
        st.unsure_gen = st.gen
        ps.unsure.append((st.size, digest))
        del ps.unsure[:-UNSURE_MAX]

    async def _is_prior(self, ps: PathState, path: str, entry: Entry) -> bool:
        """Whether origin object ``entry`` is an older version of ours that may have landed:
        one whose put failed since the last commit that landed (``ps.unsure``), or one kept
        from a crash (``ps.priors``)."""
        if await unsure.holds_one(self.origin, path, entry, ps.unsure):
            return True
        for f in ps.priors:
            try:
                fd = os.open(f, os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                continue
            try:
                if await self._same(path, entry, fd, os.fstat(fd).st_size):
                    return True
            finally:
                os.close(fd)
        return False

    async def _same(self, path: str, entry: Entry, fd: int, size: int) -> bool:
        """Whether origin object ``entry`` holds exactly the ``size`` bytes of ``fd``."""
        if entry.size != size:
            return False
        m = unsure.MD5_ETAG.match(entry.version)
        if self.origin.capabilities.md5_etag and m:
            return await trio.to_thread.run_sync(unsure.md5_of_file, fd, size) == m.group(1).lower()
        if size > unsure.COMPARE_MAX:
            return False
        sync = self.origin.sync

        def same() -> bool:
            off = 0
            while off < size:
                n = min(8 << 20, size - off)
                if sync.read_range(path, off, n, entry.version) != os.pread(fd, n, off):
                    return False
                off += n
            return True

        try:
            return await trio.to_thread.run_sync(same)
        except OriginError:
            return False

    def _done(self, st: Staged, path: str, gen: int, entry: Entry, elapsed: float) -> None:
        self.committed_files += 1
        self.committed_bytes += entry.size
        self.commit_seconds += elapsed
        self._recent.append((time.monotonic(), entry.size))
        self.area.mark_committed(st, gen, entry.version)
        if gen == st.gen:
            st.urgent = False
        log.debug("committed %s (%d bytes, %.3fs)", path, entry.size, elapsed)

    async def _lost(self, st: Staged, path: str, exc: Conflict) -> None:
        """Another writer won at the origin: keep our bytes aside (0600), report, discard."""
        dst = self.area.conflict_copy(st)
        try:
            await trio.to_thread.run_sync(_copy_private, st.file, dst)
        except OSError as copy_exc:
            # the bytes must not be lost: keep the staged file pending and say why
            self._fail(st, f"{path}: {exc}; could not keep a copy: {copy_exc}", transient=False)
            return
        msg = f"{path}: {exc} (kept in {dst})"
        self.conflicts.append({"path": path, "kept": dst, "error": str(exc)})
        self.errors += 1
        self.last_error = msg
        log.error("commit lost a conflict: %s", msg)
        self.area.lost(st, path, dst)

    async def _undo_stray(self, path: str) -> None:
        """``path`` was deleted locally while its upload ran: remove what the upload put
        there, unless another staged file now owns the path."""
        try:
            await self.origin.delete(path)
        except NotFound:
            pass
        except OriginError as exc:
            log.error("could not remove %s after a delete during its commit: %s", path, exc)

    def _fail(self, st: Staged, msg: str, *, transient: bool) -> None:
        self.errors += 1
        self.last_error = msg
        st.error = msg
        st.error_transient = transient
        st.attempts += 1
        base = 0.5 * 2 ** min(st.attempts, 6) if transient else 30.0
        st.next_try = time.monotonic() + min(30.0, base) * random.uniform(0.8, 1.2)
        # a failure that will be retried soon is a warning; one that needs an operator (a
        # permission, a bad name: retried only every 30 s) is an error
        (log.warning if transient else log.error)("%s (attempt %d)", msg, st.attempts)

    # -- barriers --------------------------------------------------------------------------

    async def flush(
        self, dir_path: str, on_progress: Callable[[dict[str, Any]], None] | None = None
    ) -> dict[str, Any]:
        """Return once every write under ``dir_path`` made before the call is at the origin.

        Files still open for writing are committed as they are now. Raises ``OSError`` naming
        the files that cannot be committed (non-transient failure) or that lost a conflict
        (with where their bytes are); keeps waiting through transient failures (cancel the
        caller to give up)."""
        live = self.area.under(dir_path)
        for st in live:
            await self.area.io.quiesce(st)
            if st.dirty:
                # committed as it is now: journaled, so that later writes go to a new version
                self.area.close_version(st, barrier=True)
        targets = [(v, v.gen) for st in live for v in self.area.versions(st) if v.dirty]
        out = await self.commit(targets, on_progress)
        for st, _ in targets:  # its bookkeeping done too (the staging file dropped)
            while st.uploading:
                await st.upload_done.wait()
        prefix = dir_path + "/" if dir_path else ""
        earlier = [
            c
            for c in self.area.unreported
            if not dir_path or c[0] == dir_path or c[0].startswith(prefix)
        ]
        if earlier:  # lost before this flush started: still a write made before the call
            for c in earlier:
                self.area.unreported.remove(c)
            raise OSError(errno.EIO, failure_message([], earlier))
        with contextlib.suppress(OSError):  # (journal full: the daemon retries every second)
            # the records of what was committed deleted on disk, and their staging files
            # (a flush gives the staging space of what it committed back)
            await self.area.settle(files=True)
        return out

    async def commit(
        self,
        targets: list[tuple[Staged, int]],
        on_progress: Callable[[dict[str, Any]], None] | None = None,
    ) -> dict[str, Any]:
        """Commit each ``(staged, generation)`` now and wait (the rules of :meth:`flush`)."""
        return {"files": await self.area.wait_committed(targets, on_progress)}

    def statistics(self) -> WriteBackStats:
        pending = self.area.pending()
        now_ns = time.time_ns()
        oldest = min((st.first_pending_ns for st in pending if st.seq is not None), default=0)
        window = [(t, n) for t, n in self._recent if time.monotonic() - t < 60]
        span = (window[-1][0] - window[0][0]) if len(window) > 1 else 0.0
        return WriteBackStats(
            pending_files=len(pending),
            pending_bytes=sum(st.size for st in pending),
            oldest_pending_s=round((now_ns - oldest) / 1e9, 3) if oldest else 0.0,
            uploading=self.active,
            staging_bytes=self.area.bytes,
            staging_limit=self.area.limit,
            committed_files=self.committed_files,
            committed_bytes=self.committed_bytes,
            commit_mib_s=round(self.committed_bytes / self.commit_seconds / 2**20, 1)
            if self.commit_seconds
            else 0.0,
            recent_commit_mib_s=round(sum(n for _, n in window) / span / 2**20, 1) if span else 0.0,
            already_committed=self.already_committed,
            cancelled_uploads=self.cancelled,
            errors=self.errors,
            last_error=self.last_error,
            failing=tuple(
                {"path": st.path, "error": st.error, "attempts": st.attempts}
                for st in pending
                if st.error
            )[:20],
            conflicts=tuple(self.conflicts)[-20:],
        )


def _copy_private(src: str, dst: str) -> None:
    fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "wb") as out, open(src, "rb") as inp:
        shutil.copyfileobj(inp, out, 8 << 20)
        with contextlib.suppress(OSError):
            os.fsync(out.fileno())
