"""The uploader: commits closed staged files to the origin in the background.

Order: oldest first (by the time a file first became pending; rewriting a pending file does not
push it back, so nothing starves), files asked for by ``fsync``/``flush`` before the rest. A file
is uploaded once no process has it open for writing (or at once when fsync'ed); writes that
arrive while its upload runs wait for the upload to finish and then make it pending again, so
the origin always ends with the latest content, and never a mix: ``Origin.put`` is atomic.

Failures: transient errors (origin down, timeouts) are retried with backoff, forever; other
errors (permission denied...) are retried slowly and reported in ``status`` and the log; a
conditional commit that loses to a newer object at the origin (:class:`Conflict`) is kept
aside in ``<cache-dir>/conflicts/`` and reported. Nothing is dropped.
"""

from __future__ import annotations

import collections
import errno
import logging
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from airfs.origin.aio import AsyncOrigin
from airfs.origin.base import Conflict, Entry, NotFound, OriginError

from .staging import Staged, StagingArea

log = logging.getLogger(__name__)

CommittedHook = Callable[[str, Entry, Staged], Awaitable[None]]


class Uploader:
    """Background commit loop. Start :meth:`run` in the daemon's nursery."""

    def __init__(
        self,
        area: StagingArea,
        origin: AsyncOrigin,
        *,
        concurrency: int = 8,
        conditional: bool = False,
        on_committed: CommittedHook | None = None,
    ) -> None:
        self.area = area
        self.origin = origin
        self.concurrency = concurrency
        self.conditional = conditional
        self.on_committed = on_committed
        self.active = 0
        self.committed_files = 0
        self.committed_bytes = 0
        self.commit_seconds = 0.0
        self.errors = 0
        self.last_error: str | None = None
        self.conflicts: list[dict[str, Any]] = []
        self._recent: collections.deque[tuple[float, int]] = collections.deque(maxlen=256)

    # -- the loop --------------------------------------------------------------------------

    def _ready(self, now: float) -> list[Staged]:
        out = [
            st
            for st in self.area.all.values()
            if st.path is not None
            and st.dirty
            and not st.uploading
            and (st.urgent or (st.writers == 0 and st.seq is not None))
            and st.next_try <= now
        ]
        out.sort(key=lambda st: (not st.urgent, st.seq if st.seq is not None else 0))
        return out

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            task_status.started()
            while True:
                ev = self.area.change_event()
                now = time.monotonic()
                for st in self._ready(now)[: max(0, self.concurrency - self.active)]:
                    self._start(nursery, st)
                waits = [
                    st.next_try - now
                    for st in self.area.all.values()
                    if st.dirty and not st.uploading and st.next_try > now
                ]
                with trio.move_on_after(min(waits) if waits else 5.0):
                    await ev.wait()

    def _start(self, nursery: trio.Nursery, st: Staged) -> None:
        st.uploading = True
        st.upload_done = trio.Event()
        self.active += 1
        nursery.start_soon(self._upload, st)

    async def _upload(self, st: Staged) -> None:
        path, gen = st.path, st.gen
        assert path is not None
        t0 = time.monotonic()
        try:
            # conditional commits: replace only the version this node started from; a new
            # file only if nobody created one meanwhile ("" = must not exist)
            if_match = (st.base_version or "") if self.conditional else None
            entry = await self.origin.put(path, st.file, if_match)
            if entry.mode != st.mode & 0o7777 and st.base_version is None:
                entry = await self.origin.set_attrs(path, mode=st.mode & 0o7777)
        except Conflict as exc:
            kept = self.area.set_aside(st, str(exc))
            self.conflicts.append({"path": path, "kept": kept, "error": str(exc)})
            self._fail(st, f"{path}: {exc} (kept in {kept})", final=True)
            self.area.discard(st)
        except OriginError as exc:
            self._fail(st, f"commit of {path} failed: {exc}", final=False, transient=exc.transient)
        except Exception as exc:  # a bug must not kill the uploader and strand the queue
            log.exception("commit of %s failed", path)
            self._fail(st, f"commit of {path} failed: {exc!r}", final=False, transient=False)
        else:
            elapsed = time.monotonic() - t0
            self.committed_files += 1
            self.committed_bytes += entry.size
            self.commit_seconds += elapsed
            self._recent.append((time.monotonic(), entry.size))
            if st.path != path:
                await self._undo_stray(path)
            else:
                self.area.mark_committed(st, gen)
                st.base_version = entry.version
                if gen == st.gen:
                    st.urgent = False
                if self.on_committed is not None:
                    await self.on_committed(path, entry, st)
                log.debug("committed %s (%d bytes, %.3fs)", path, entry.size, elapsed)
        finally:
            self.active -= 1
            st.uploading = False
            st.upload_done.set()
            self.area.release(st)
            self.area.notify()

    async def _undo_stray(self, path: str) -> None:
        """``path`` was renamed or deleted locally while its upload ran: remove what the upload
        put there, unless another staged file now owns the path."""
        if self.area.get(path) is not None:
            return
        try:
            await self.origin.delete(path)
        except NotFound:
            pass
        except OriginError as exc:
            log.error("could not remove %s after a rename during its commit: %s", path, exc)

    def _fail(self, st: Staged, msg: str, *, final: bool, transient: bool = True) -> None:
        self.errors += 1
        self.last_error = msg
        st.error = msg
        st.error_transient = transient
        st.attempts += 1
        if not final:
            base = 0.5 * 2 ** min(st.attempts, 6) if transient else 30.0
            st.next_try = time.monotonic() + min(30.0, base) * random.uniform(0.8, 1.2)
        log.error("%s (attempt %d)", msg, st.attempts)

    # -- barriers --------------------------------------------------------------------------

    async def flush(
        self, dir_path: str, on_progress: Callable[[dict[str, Any]], None] | None = None
    ) -> dict[str, Any]:
        """Return once every write under ``dir_path`` made before the call is at the origin.

        Files still open for writing are committed as they are now. Raises ``OSError`` naming
        the files that failed for a non-transient reason; keeps waiting through transient
        ones (cancel the caller to give up).
        """
        targets = [(st, st.gen) for st in self.area.under(dir_path) if st.dirty]
        total = len(targets)
        for st, _gen in targets:
            if st.writers:
                st.urgent = True
        self.area.notify()
        last = 0.0
        while True:
            ev = self.area.change_event()
            left = [(st, g) for st, g in targets if st.path is not None and st.committed_gen < g]
            if not left:
                return {"files": total}
            hard = [
                st
                for st, _ in left
                if st.error and not st.error_transient and st.attempts >= 2 and not st.uploading
            ]
            if hard:
                names = ", ".join(str(st.path) for st in hard[:5])
                raise OSError(
                    errno.EIO, f"{len(hard)} file(s) cannot be committed ({names}): {hard[0].error}"
                )
            now = time.monotonic()
            if on_progress is not None and now - last >= 0.5:
                last = now
                on_progress(
                    {
                        "left": len(left),
                        "total": total,
                        "bytes_left": sum(st.size for st, _ in left),
                    }
                )
            with trio.move_on_after(1.0):
                await ev.wait()

    def statistics(self) -> dict[str, Any]:
        pending = self.area.pending()
        now_ns = time.time_ns()
        oldest = min((st.first_pending_ns for st in pending if st.seq is not None), default=0)
        window = [(t, n) for t, n in self._recent if time.monotonic() - t < 60]
        span = (window[-1][0] - window[0][0]) if len(window) > 1 else 0.0
        return {
            "pending_files": len(pending),
            "pending_bytes": sum(st.size for st in pending),
            "oldest_pending_s": round((now_ns - oldest) / 1e9, 3) if oldest else 0.0,
            "uploading": self.active,
            "staging_bytes": self.area.bytes,
            "staging_limit": self.area.limit,
            "committed_files": self.committed_files,
            "committed_bytes": self.committed_bytes,
            "commit_mib_s": round(self.committed_bytes / self.commit_seconds / 2**20, 1)
            if self.commit_seconds
            else 0.0,
            "recent_commit_mib_s": round(sum(n for _, n in window) / span / 2**20, 1)
            if span
            else 0.0,
            "errors": self.errors,
            "last_error": self.last_error,
            "failing": [
                {"path": st.path, "error": st.error, "attempts": st.attempts}
                for st in pending
                if st.error
            ][:20],
            "conflicts": self.conflicts[-20:],
        }
