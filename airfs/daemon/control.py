"""The control facade of a running mount: :class:`Daemon` holds the built components (filled in by
:func:`airfs.daemon.process.serve` as it builds and mounts them) and answers what the control socket
(:class:`~airfs.control.server.ControlServer`) and the metrics endpoint ask: status, warm, prefetch,
flush, unmount (drain, then stop), catalog commands, and the lookups that authorise requests.

It starts nothing itself: the process around it (:mod:`airfs.daemon.process`) runs the FUSE
transport and the periodic tasks, and waits on :attr:`Daemon.stop_requested`, which
:meth:`Daemon.unmount` sets once pending commits are drained."""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from typing import TYPE_CHECKING, Any

import trio

from airfs.catalog.model import RESERVED
from airfs.catalog.service import CatalogService
from airfs.control.auth import Peer
from airfs.control.scope import ScopedOrigin
from airfs.control.server import Progress
from airfs.core.context import Caller as CoreCaller
from airfs.core.fs import Filesystem
from airfs.core.readpath import ReadPath
from airfs.core.warm import BackgroundPrefetch, warm
from airfs.fuse.transport import Transport
from airfs.origin.aio import AsyncOrigin
from airfs.origin.base import Entry, Kind, OriginError
from airfs.writeback.staging import StagingArea
from airfs.writeback.uploader import Uploader

from . import gcpolicy
from .build import Built
from .config import MountConfig

if TYPE_CHECKING:
    from airfs.obs.metrics import Snapshot

log = logging.getLogger("airfs")


class Daemon:
    """One mount's running state; also what the control socket talks to. Made complete, by
    :func:`airfs.daemon.process.serve`, from what :func:`~airfs.daemon.build.build` built, the
    FUSE transport and the background prefetcher, before the control socket or the metrics
    endpoint can call in."""

    def __init__(
        self,
        cfg: MountConfig,
        built: Built,
        transport: Transport,
        prefetcher: BackgroundPrefetch,
    ) -> None:
        self.cfg = cfg
        self.started = time.time()
        self.stop_requested = trio.Event()
        self.fuse_done = trio.Event()
        self.fs: Filesystem = built.fs
        self.uploader: Uploader = built.uploader
        self.area: StagingArea = built.area
        self.readpath: ReadPath = built.readpath
        self.origin: AsyncOrigin = built.origin
        self.catalog_service: CatalogService = built.catalog
        self.prefetcher = prefetcher
        self.transport = transport
        #: the mount's readahead was raised (once the kernel's INIT is answered)
        self.read_ahead = False
        #: who owns every object as the mount reports it (see Filesystem's ``owner``)
        self.owner = built.fs.owner

    # -- control operations -----------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        return {
            "mountpoint": self.cfg.mountpoint,
            "origin": self.origin.url,
            "cache_dir": self.cfg.cache_dir,
            "pid": os.getpid(),
            "uptime_s": round(time.time() - self.started, 1),
            "ttl": self.cfg.ttl,
            "read_ahead_kb": self.cfg.read_ahead_kb if self.read_ahead else None,
            "fs": self.fs.statistics().to_dict(),
            "cache": self.readpath.statistics().to_dict(),
            "writeback": self.uploader.statistics().to_dict(),
            "journal": dataclasses.asdict(self.area.disk.statistics()),
            "origin_calls": self.origin.statistics().to_dict(),
            "prefetch": self.prefetcher.statistics().to_dict(),
            "fuse": self.transport.statistics().to_dict(),
            "catalog": self.catalog_service.statistics().to_dict(),
            "gc": gcpolicy.statistics().to_dict(),
        }

    async def catalog(self, caller: Peer, command: str, args: dict[str, Any]) -> Any:
        """A catalog command from the control socket, run with the caller's identity."""
        return await self.catalog_service.command(_core(caller), command, args)

    async def govern(self, caller: Peer, op: str, path: str) -> None:
        """The catalog's check of a control request (``warm``, ``prefetch``, ``flush``)."""
        await self.catalog_service.check_control(_core(caller), op, path)

    def _privileged(self, caller: Peer) -> bool:
        return caller.uid in (0, os.geteuid())

    async def lookup(self, path: str) -> tuple[Kind, int, int, int] | None:
        """Kind, mode and owner (uid, gid) of ``path`` as the mount shows it (None: no such
        object); the control socket authorises requests with it."""
        st = self.area.get(path) if path else None
        if st is not None:
            uid = self.owner.uid if st.uid is None else st.uid
            gid = self.owner.gid if st.gid is None else st.gid
            return Kind.FILE, st.mode, uid, gid
        try:
            entry, _at = await self.fs.origin_entry(path)
        except OriginError as exc:
            node = self.fs.inodes.at(path)
            known = node.entry if node is not None else self.fs.inodes.last_known(path)
            if not exc.transient or known is None:
                raise
            entry = known  # origin down: what the mount shows is what it knows
        if entry is None:
            return None
        uid = self.owner.uid if entry.uid is None else entry.uid
        gid = self.owner.gid if entry.gid is None else entry.gid
        return entry.kind, entry.mode, uid, gid

    def _mode_of(self, path: str, entry: Entry) -> int:
        st = self.area.get(path) if entry.kind is Kind.FILE else None
        return st.mode if st is not None else entry.mode

    async def warm(
        self, paths: list[str], jobs: int, progress: Progress, caller: Peer
    ) -> dict[str, Any]:
        """Warm ``paths`` (already authorised); below them only what ``caller`` may read.
        The catalog's own files (:data:`~airfs.catalog.model.RESERVED`) are never warmed."""
        if caller.uid == 0:
            if "" in paths:
                top = await self.origin.list("")
                paths = [p for p in paths if p] + [e.name for e in top if e.name != RESERVED]
            return await warm(
                self.origin, self.readpath, paths, jobs, progress, on_listing=self.fs.listings.put
            )
        view = ScopedOrigin(
            self.origin, caller, self.owner, self._mode_of, on_listing=self.fs.listings.put
        )
        if "" in paths:  # what the caller may reach at the top, through the same filter
            top = await view.list("")
            paths = [p for p in paths if p] + [e.name for e in top if e.name != RESERVED]
        out = await warm(view.as_origin(), self.readpath, paths, jobs, progress)
        return {**out, "skipped": view.skipped}

    def prefetch(self, paths: list[str]) -> dict[str, Any]:
        self.prefetcher.submit(paths)
        return {"queued": len(paths)}

    def refresh(self, path: str) -> dict[str, Any]:
        return self.fs.refresh(path)

    async def flush(self, path: str, progress: Progress, caller: Peer) -> dict[str, Any]:
        t0 = time.monotonic()
        try:
            out = await self.uploader.flush(path, progress)
        except OSError as exc:
            if self._privileged(caller):
                raise
            # the uploader's message names files: say only what failed, not which
            raise OSError(
                exc.errno,
                f"some files under {path or '/'} cannot be committed (root or the mount's "
                "owner can see which in airfs status)",
            ) from None
        await self.area.settle(sync=True)
        return {**out, "seconds": round(time.monotonic() - t0, 3)}

    async def unmount(self, progress: Progress) -> dict[str, Any]:
        """Drain pending commits while still serving, then unmount."""
        result = await self.drain(progress)
        self.stop_requested.set()
        return result

    async def drain(self, progress: Progress | None = None) -> dict[str, Any]:
        """Commit every pending file, waiting at most ``drain_timeout``: ``{"drained": True,
        ...}``, or ``{"drained": False, "error": ..., "pending": N}`` (what stays pending stays
        in the journal for the next mount). Either way ``"conflicts"`` lists every write this
        daemon lost to a conflict at the origin (``path``, and ``kept``: where its bytes are),
        also those an earlier ``flush`` reported. Never raises for a failed commit."""
        left = self.area.pending()
        if left:
            log.info("draining %d pending file(s) before unmount", len(left))
        with trio.move_on_after(self.cfg.drain_timeout) as scope:
            try:
                out = await self.uploader.flush("", progress)
            except OSError as exc:
                n = len(self.area.pending())
                if n:
                    log.error("unmount: %s; kept in the journal for the next mount", exc)
                else:
                    log.error("unmount: %s", exc)
                return {
                    "drained": False,
                    "error": str(exc),
                    "pending": n,
                    "conflicts": self._conflicts(),
                }
        if scope.cancelled_caught:
            n = len(self.area.pending())
            log.error(
                "unmount: %d file(s) still pending after %ss; they stay in the journal "
                "and are committed at the next mount",
                n,
                self.cfg.drain_timeout,
            )
            return {
                "drained": False,
                "error": "drain timed out",
                "pending": n,
                "conflicts": self._conflicts(),
            }
        return {"drained": True, **out, "conflicts": self._conflicts()}

    def _conflicts(self) -> list[dict[str, str]]:
        return [{"path": c["path"], "kept": c["kept"]} for c in self.uploader.conflicts]

    def activity(self) -> int:
        """A counter that moves while the mount works: requests served, commits, bytes read
        from the origin (what :func:`airfs.daemon.heap.trim_when_idle` watches)."""
        wb = self.uploader.statistics()
        read = self.readpath.statistics().origin_bytes_read or 0
        return sum(self.fs.ops.values()) + wb.committed_files + wb.uploading + read

    def components(self) -> dict[str, Any]:
        """The daemon's running parts, by name (for :mod:`airfs.daemon.memdebug`)."""
        return {
            "fs": self.fs,
            "readpath": self.readpath,
            "area": self.area,
            "uploader": self.uploader,
            "origin": self.origin,
            "prefetcher": self.prefetcher,
            "transport": self.transport,
        }

    def metrics_snapshot(self) -> Snapshot:
        """Every component's statistics record, for the metrics endpoint."""
        from airfs.obs.metrics import Snapshot

        return Snapshot(
            core=self.fs.statistics(),
            readpath=self.readpath.statistics(),
            writeback=self.uploader.statistics(),
            origin=self.origin.statistics(),
            prefetch=self.prefetcher.statistics(),
            transport=self.transport.statistics().to_dict(),
            gc=gcpolicy.statistics(),
        )


def _core(caller: Peer) -> CoreCaller:
    return CoreCaller(caller.uid, caller.gid, caller.pid, caller.groups)
