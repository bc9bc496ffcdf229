"""The one place that builds a mount: origin → read path → staging + uploader → core → FUSE
adapter → control socket; then serves until unmounted, draining pending commits first.

Run as ``python -m airfs.mount CONFIG_JSON [--ready-fd N]`` by ``airfs mount`` (which detaches
it), or in-process with ``--foreground``. Readiness is reported once, on the ready fd: ``OK`` when
the mount is up, or ``ERR <one-line reason>``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import functools
import json
import logging
import os
import resource
import signal
import stat
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import trio

from airfs import heap, memdebug
from airfs.build import build
from airfs.catalog.model import RESERVED
from airfs.catalog.service import CatalogService
from airfs.control.auth import Caller, MountOwner
from airfs.control.protocol import SocketDirError, socket_path
from airfs.control.scope import ScopedOrigin
from airfs.control.server import ControlServer, Progress
from airfs.core.attrs import Owner
from airfs.core.context import Caller as CoreCaller
from airfs.core.fs import Filesystem
from airfs.core.warm import BackgroundPrefetch, warm
from airfs.fuse import DEFAULT_TRANSPORT
from airfs.fuse.transport import Transport, TransportError, TransportOptions, make_transport
from airfs.origin.aio import AsyncOrigin
from airfs.origin.base import Entry, Kind, Origin, OriginError
from airfs.origin.posix import PosixOrigin
from airfs.readpath import DirectReadPath, ReadPath
from airfs.writeback.journal import JournalDamaged
from airfs.writeback.staging import StagingArea
from airfs.writeback.uploader import Uploader

if TYPE_CHECKING:
    from airfs.metrics import Snapshot

log = logging.getLogger("airfs")


@dataclass
class MountConfig:
    """Everything a daemon needs; the CLI fills it and passes it as JSON."""

    mountpoint: str
    origin: str | None  # None: overlay the mountpoint in place
    cache_dir: str
    cache_size: int = 50 << 30
    min_free: int = 5 << 30
    staging_size: int = 100 << 30
    ttl: float = 1.0
    log_file: str | None = None
    allow_other: bool | None = None
    s3_endpoint: str | None = None
    s3_region: str | None = None
    s3_path_style: bool | None = None
    #: mode of S3 objects written by other tools (None: the origin's default, 0o644)
    s3_default_mode: int | None = None
    #: False: S3 listings show unseen objects with the default mode (no HEAD per object)
    s3_list_heads: bool = True
    drain_timeout: float = 3600.0
    read_ahead_kb: int = 1024
    debug: bool = False
    no_cache: bool = False
    write_wait: float = 30.0
    #: let ``mknod`` create device nodes (they still cannot be opened: the mount is nodev)
    allow_devices: bool = False
    #: a damaged block-cache index is moved aside (the cache starts empty) instead of refused
    rebuild_cache: bool = False
    #: benchmarking/testing: emulate a remote origin (seconds per request, bytes/s)
    emulate_latency: float = 0.0
    emulate_bandwidth: int | None = None
    #: how requests reach the core: "pyfuse3" (libfuse) or "kernel" (airfs's own transport)
    fuse: str = DEFAULT_TRANSPORT
    #: kernel transport: FUSE passthrough of local bytes when the kernel and CAP_SYS_ADMIN allow
    passthrough: bool = True
    #: rebuild a lost or damaged journal from the staging files' own records
    rebuild_journal: bool = False
    #: serve Prometheus metrics on ``[ADDR:]PORT`` (None: off)
    metrics: str | None = None

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> MountConfig:
        return cls(**json.loads(text))


class MountError(Exception):
    """A mount cannot start; the message is the one line shown to the user."""


#: the daemon's umask: everything it creates under the cache dir (blocks, index, staging,
#: journal, conflicts, recovered files, the log) is 0600, directories 0700
UMASK = 0o077


def prepare_cache_dir(path: str) -> None:
    """Create the cache dir (mode 0700), or check an existing one: it must be a directory
    owned by this user that no other user can enter (it holds copies of files and their
    paths). An empty directory that others could enter is closed (0700); a non-empty one is
    refused. Raises :class:`MountError` with a one-line reason."""
    uid = os.geteuid()
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, 0o755, exist_ok=True)
    try:
        os.mkdir(path, 0o700)
        os.chmod(path, 0o700)
        return
    except FileExistsError:
        pass
    except OSError as exc:
        raise MountError(f"cannot create cache dir {path}: {exc.strerror or exc}") from None
    try:
        st = os.stat(path)
    except OSError as exc:
        raise MountError(f"cache dir {path}: {exc.strerror or exc}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise MountError(f"cache dir {path} is not a directory")
    if st.st_uid != uid:
        raise MountError(
            f"cache dir {path} belongs to uid {st.st_uid}, not to the mounting user (uid {uid})"
        )
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o077:
        if not os.listdir(path):
            os.chmod(path, 0o700)
            return
        raise MountError(
            f"cache dir {path} is open to other users (mode {mode:o}): they could read the "
            f"cached files and their paths; run chmod 700 {path} first, or use a new cache dir"
        )


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def check_cache_dir(cache_dir: str, mountpoint: str, origin: str | None) -> str | None:
    """The reason ``cache_dir`` cannot serve a mount of ``origin`` on ``mountpoint``, or None.

    Refused: a cache dir that exists and is not a directory, and one at or under the
    mountpoint (including an overlaid one: the daemon would write into its own mount and
    deadlock) or under a directory origin (its files would show up in the mount)."""
    real = os.path.realpath(cache_dir)
    if os.path.lexists(cache_dir) and not os.path.isdir(cache_dir):
        return f"cache dir {cache_dir} is not a directory"
    if _inside(real, os.path.realpath(mountpoint)):
        return (
            f"cache dir {cache_dir} is on the mount at {mountpoint} (the daemon would write "
            "into its own mount); choose a --cache-dir outside it"
        )
    if origin is not None and "://" not in origin and _inside(real, os.path.realpath(origin)):
        return (
            f"cache dir {cache_dir} is inside the origin {origin}; choose a --cache-dir outside it"
        )
    return None


def open_origin(cfg: MountConfig, overlay_fd: int | None) -> Origin:
    """Build the origin named by the config (wrapped in a latency emulator if asked).
    Raises :class:`MountError`."""
    origin = _open_origin(cfg, overlay_fd)
    if cfg.emulate_latency or cfg.emulate_bandwidth:
        from airfs.origin.latency import LatencyOrigin

        return LatencyOrigin(origin, cfg.emulate_latency, cfg.emulate_bandwidth)
    return origin


def _open_origin(cfg: MountConfig, overlay_fd: int | None) -> Origin:
    spec = cfg.origin
    try:
        if spec is None:
            assert overlay_fd is not None
            return PosixOrigin(cfg.mountpoint, dir_fd=overlay_fd)
        if spec.startswith("s3://"):
            try:
                from airfs.origin.s3 import S3Origin
            except ImportError as exc:  # pragma: no cover - s3 support is part of the package
                raise MountError(f"S3 origins are not available: {exc}") from None
            if cfg.s3_default_mode is None:
                return S3Origin.from_url(
                    spec,
                    endpoint=cfg.s3_endpoint,
                    region=cfg.s3_region,
                    path_style=cfg.s3_path_style,
                    list_heads=cfg.s3_list_heads,
                )
            return S3Origin.from_url(
                spec,
                endpoint=cfg.s3_endpoint,
                region=cfg.s3_region,
                path_style=cfg.s3_path_style,
                list_heads=cfg.s3_list_heads,
                default_mode=cfg.s3_default_mode,
            )
        if "://" in spec and not spec.startswith("file://"):
            raise MountError(f"unsupported origin {spec!r} (use a directory or s3://bucket/prefix)")
        return PosixOrigin(spec.removeprefix("file://"))
    except OriginError as exc:
        raise MountError(f"origin {spec or cfg.mountpoint}: {exc.strerror or exc}") from None


async def make_readpath(cfg: MountConfig, origin: AsyncOrigin, nursery: trio.Nursery) -> ReadPath:
    """The block cache + prefetcher (direct origin reads with ``no_cache``)."""
    if cfg.no_cache:
        return DirectReadPath(origin)
    from airfs.cache import CacheDamaged, CachedReadPath, CacheInUse, set_aside

    blocks = os.path.join(cfg.cache_dir, "blocks")
    for attempt in range(2):
        try:
            return await CachedReadPath.create(
                nursery, origin, blocks, cache_size=cfg.cache_size, min_free=cfg.min_free
            )
        except CacheInUse as exc:
            raise MountError(str(exc)) from None
        except CacheDamaged as exc:
            if not cfg.rebuild_cache or attempt:
                raise MountError(
                    f"{exc}; mount with --rebuild-cache to move it aside and start with an "
                    "empty block cache (pending writes are kept)"
                ) from None
            moved = await trio.to_thread.run_sync(set_aside, exc.path)
            log.warning("%s; moved to %s, starting with an empty block cache", exc, moved)
    raise AssertionError("unreachable")


def _allow_other(cfg: MountConfig) -> bool:
    if cfg.allow_other is not None:
        return cfg.allow_other
    if os.geteuid() == 0:
        return True
    try:
        with open("/etc/fuse.conf", encoding="utf-8") as f:
            return any(line.strip() == "user_allow_other" for line in f)
    except OSError:
        return False


def mount_device(mountpoint: str) -> str | None:
    """``major:minor`` of the filesystem mounted at ``mountpoint`` (from mountinfo, so the
    mount itself is never touched: stat'ing it before the FUSE loop runs would deadlock)."""
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        found = None
        for line in f:
            parts = line.split()
            if len(parts) > 4 and parts[4].encode().decode("unicode_escape") == mountpoint:
                found = parts[2]
        return found


def raise_read_ahead(mountpoint: str, kb: int) -> bool:
    """Raise the mount's kernel readahead so sequential reads arrive as 1 MiB requests."""
    dev = mount_device(mountpoint)
    if dev is None:
        return False
    path = f"/sys/class/bdi/{dev}/read_ahead_kb"
    try:
        with open(path, "w", encoding="ascii") as f:
            f.write(str(kb))
        with open(path, encoding="ascii") as f:
            return int(f.read()) == kb
    except OSError as exc:
        log.info("could not raise %s to %d: %s", path, kb, exc)
        return False


class Daemon:
    """One mount's running state; also what the control socket talks to."""

    def __init__(self, cfg: MountConfig) -> None:
        self.cfg = cfg
        self.started = time.time()
        self.stop_requested = trio.Event()
        self.fuse_done = trio.Event()
        self.fs: Filesystem
        self.uploader: Uploader
        self.area: StagingArea
        self.readpath: ReadPath
        self.origin: AsyncOrigin
        self.prefetcher: BackgroundPrefetch
        self.read_ahead = False
        self.transport: Transport | None = None
        self.catalog_service: CatalogService
        #: who owns every object as the mount reports it (see Filesystem's ``owner``)
        self.owner = MountOwner(os.getuid(), os.getgid())

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
            "origin_calls": self.origin.statistics().to_dict(),
            "prefetch": self.prefetcher.statistics().to_dict(),
            "fuse": self.transport.statistics() if self.transport is not None else None,
            "catalog": self.catalog_service.statistics(),
        }

    async def catalog(self, caller: Caller, command: str, args: dict[str, Any]) -> Any:
        """A catalog command from the control socket, run with the caller's identity."""
        return await self.catalog_service.command(_core(caller), command, args)

    async def govern(self, caller: Caller, op: str, path: str) -> None:
        """The catalog's check of a control request (``warm``, ``prefetch``, ``flush``)."""
        await self.catalog_service.check_control(_core(caller), op, path)

    def _privileged(self, caller: Caller) -> bool:
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
        self, paths: list[str], jobs: int, progress: Progress, caller: Caller
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

    async def flush(self, path: str, progress: Progress, caller: Caller) -> dict[str, Any]:
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
        result = await self._drain(progress)
        self.stop_requested.set()
        return result

    async def _drain(self, progress: Progress | None = None) -> dict[str, Any]:
        left = self.area.pending()
        if left:
            log.info("draining %d pending file(s) before unmount", len(left))
        with trio.move_on_after(self.cfg.drain_timeout) as scope:
            try:
                out = await self.uploader.flush("", progress)
            except OSError as exc:
                log.error("unmount: %s; kept in the journal for the next mount", exc)
                return {"drained": False, "error": str(exc), "pending": len(self.area.pending())}
        if scope.cancelled_caught:
            n = len(self.area.pending())
            log.error(
                "unmount: %d file(s) still pending after %ss; they stay in the journal "
                "and are committed at the next mount",
                n,
                self.cfg.drain_timeout,
            )
            return {"drained": False, "error": "drain timed out", "pending": n}
        return {"drained": True, **out}

    # -- lifecycle --------------------------------------------------------------------------

    async def run(self, ready: Callable[[str | None], None]) -> int:
        cfg = self.cfg
        os.umask(UMASK)
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 1 << 20)), hard))
        overlay_fd = None
        if cfg.origin is None:
            overlay_fd = os.open(cfg.mountpoint, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        reason = check_cache_dir(cfg.cache_dir, cfg.mountpoint, cfg.origin)
        if reason:
            raise MountError(reason)
        sync_origin = open_origin(cfg, overlay_fd)
        prepare_cache_dir(cfg.cache_dir)
        lock_fd = os.open(os.path.join(cfg.cache_dir, "lock"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise MountError(
                f"cache dir {cfg.cache_dir} is in use by another airfs mount"
            ) from None
        code = 1
        try:
            async with build(
                sync_origin,
                cfg.cache_dir,
                ttl=cfg.ttl,
                staging_size=cfg.staging_size,
                write_wait=cfg.write_wait,
                allow_devices=cfg.allow_devices,
                owner=Owner(os.getuid(), os.getgid()),
                readpath=functools.partial(make_readpath, cfg),
                rebuild_journal=cfg.rebuild_journal,
                journal_hint=f"airfs mount --rebuild-journal --cache-dir {cfg.cache_dir} ...",
            ) as built:
                self.origin, self.readpath, self.area = built.origin, built.readpath, built.area
                self.fs, self.uploader = built.fs, built.uploader
                self.catalog_service = built.catalog
                if built.recovery.replayed:
                    log.info("journal replay: %d closed file(s) to commit", built.recovery.replayed)
                code = await self._serve(ready, built.root)
        except JournalDamaged as exc:
            raise MountError(str(exc)) from None
        except OriginError as exc:
            raise MountError(f"origin {sync_origin.url}: {exc.strerror or exc}") from None
        finally:
            sync_origin.close()
            os.close(lock_fd)
            log.info("daemon exits with code %d", code)
        return code

    async def _serve(self, ready: Callable[[str | None], None], root: Entry) -> int:
        cfg = self.cfg
        self.prefetcher = BackgroundPrefetch(
            self.origin, self.readpath, resolve=self.fs.origin_entry
        )
        initialized = trio.Event()
        fsname = (self.origin.url or "airfs").replace(",", "_").replace(" ", "_")
        try:
            opts = TransportOptions(
                fsname, _allow_other(cfg), cfg.debug, initialized.set, cfg.passthrough
            )
            self.transport = transport = make_transport(cfg.fuse, self.fs, cfg.ttl, opts)
        except TransportError as exc:
            raise MountError(str(exc)) from None
        # Everything that touches the mountpoint path happens before the mount: once mounted,
        # a stat of it would wait for this very process to answer.
        control = ControlServer(self, socket_path(cfg.mountpoint))
        serve_metrics = await self._metrics_server()
        try:
            trim_idle_s = heap.trim_idle_seconds()
        except ValueError as exc:
            raise MountError(str(exc)) from None
        try:
            transport.mount(cfg.mountpoint)
        except TransportError as exc:
            raise MountError(str(exc)) from None
        code = 0
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._raise_read_ahead, initialized)
                try:
                    await nursery.start(control.serve)
                except SocketDirError as exc:
                    raise MountError(str(exc.strerror or exc)) from None
                nursery.start_soon(self._fuse_main)
                nursery.start_soon(self._signals)
                nursery.start_soon(self._sync_journal)
                nursery.start_soon(self._abort_stale_uploads)
                nursery.start_soon(self.prefetcher.run)
                if serve_metrics is not None:
                    nursery.start_soon(serve_metrics)
                nursery.start_soon(heap.trim_when_idle, self._activity, trim_idle_s)
                if os.environ.get(memdebug.ENV):  # a debugging hook: see airfs/memdebug.py
                    nursery.start_soon(memdebug.serve, self._components(), os.environ[memdebug.ENV])
                log.info(
                    "mounted %s on %s (cache %s)", self.origin.url, cfg.mountpoint, cfg.cache_dir
                )
                ready(None)
                with trio.CancelScope() as wait_scope:
                    nursery.start_soon(_set_when, self.fuse_done, wait_scope)
                    await self.stop_requested.wait()
                if not self.fuse_done.is_set():
                    transport.terminate()
                    await self.fuse_done.wait()
                else:
                    log.info("unmounted externally; committing pending writes")
                result = await self._drain()
                code = 0 if result.get("drained") else 3
                nursery.cancel_scope.cancel()
        finally:
            transport.close()
        return code

    def _activity(self) -> int:
        """A counter that moves while the mount works: requests served, commits, bytes read
        from the origin (what :func:`airfs.heap.trim_when_idle` watches)."""
        wb = self.uploader.statistics()
        read = self.readpath.statistics().origin_bytes_read or 0
        return sum(self.fs.ops.values()) + wb.committed_files + wb.uploading + read

    def _components(self) -> dict[str, Any]:
        """The daemon's running parts, by name (for :mod:`airfs.memdebug`)."""
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
        from airfs.metrics import Snapshot

        return Snapshot(
            core=self.fs.statistics(),
            readpath=self.readpath.statistics(),
            writeback=self.uploader.statistics(),
            origin=self.origin.statistics(),
            prefetch=self.prefetcher.statistics(),
            transport=self.transport.statistics() if self.transport is not None else None,
        )

    async def _metrics_server(self) -> Callable[[], Awaitable[None]] | None:
        """With ``--metrics``: bind its socket now (a port in use fails the mount with a
        one-line reason) and return the task that serves it."""
        if self.cfg.metrics is None:
            return None
        from airfs import metrics

        address, port = metrics.parse_address(self.cfg.metrics)
        try:
            listener = await metrics.open_listener(address, port)
        except OSError as exc:
            raise MountError(
                f"--metrics {address}:{port}: cannot listen: {exc.strerror or exc}"
            ) from None
        render = metrics.render_with(metrics.registry(self.metrics_snapshot))
        log.info("metrics on http://%s:%d/metrics", address, port)
        return functools.partial(metrics.serve, listener, render)

    async def _raise_read_ahead(self, initialized: trio.Event) -> None:
        """The kernel sets the mount's readahead from the INIT reply (128 KiB): raise it
        once that reply is out, so sequential reads arrive as 1 MiB requests."""
        await initialized.wait()
        for _ in range(20):
            await trio.sleep(0.05)
            self.read_ahead = await trio.to_thread.run_sync(
                raise_read_ahead, self.cfg.mountpoint, self.cfg.read_ahead_kb
            )
            if self.read_ahead:
                return

    async def _fuse_main(self) -> None:
        assert self.transport is not None
        try:
            await self.transport.main()
        finally:
            self.fuse_done.set()

    async def _signals(self) -> None:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as sigs:
            async for sig in sigs:
                log.info("signal %d: draining and unmounting", sig)
                if sig == signal.SIGHUP:
                    continue
                result = await self._drain()
                if not result.get("drained"):
                    log.error("unmounting with %d file(s) still pending", result.get("pending", 0))
                self.stop_requested.set()

    async def _abort_stale_uploads(self) -> None:
        """S3: abort multipart uploads left behind by a killed daemon (over an hour old)."""
        from airfs.origin.s3 import S3Origin

        if not isinstance(self.origin.sync, S3Origin):
            return
        try:
            n = await trio.to_thread.run_sync(self.origin.sync.abort_stale_uploads)
        except OriginError as exc:
            log.warning("could not look for abandoned multipart uploads: %s", exc)
            return
        if n:
            log.info("aborted %d abandoned multipart upload(s) older than an hour", n)

    async def _sync_journal(self) -> None:
        while True:
            await trio.sleep(1.0)
            try:
                # applies what no operation settled (and retries a batch the journal
                # refused), then syncs the journal
                await self.area.settle(sync=True)
            except OSError as exc:
                log.error("journal sync failed: %s", exc)


def _core(caller: Caller) -> CoreCaller:
    return CoreCaller(caller.uid, caller.gid, caller.pid, caller.groups)


async def _set_when(event: trio.Event, scope: trio.CancelScope) -> None:
    await event.wait()
    scope.cancel()


def first_leaf(exc: BaseException) -> BaseException:
    """The first exception that is not an exception group inside ``exc`` (``exc`` itself when
    it is not a group); a :class:`MountError` anywhere inside wins."""
    if isinstance(exc, BaseExceptionGroup):
        mount_errors, _ = exc.split(MountError)
        leaf: BaseException = mount_errors if mount_errors is not None else exc
        while isinstance(leaf, BaseExceptionGroup):
            leaf = leaf.exceptions[0]
        return leaf
    return exc


def setup_logging(cfg: MountConfig, foreground: bool) -> None:
    level = logging.DEBUG if cfg.debug else logging.INFO
    fmt = "%(asctime)s %(levelname)s %(name)s: %(message)s"
    handlers: list[logging.Handler] = []
    if cfg.log_file:
        os.makedirs(os.path.dirname(os.path.abspath(cfg.log_file)), exist_ok=True)
        handlers.append(logging.FileHandler(cfg.log_file))
    if foreground or not handlers:
        handlers.append(logging.StreamHandler(sys.stderr))
    logging.basicConfig(level=level, format=fmt, handlers=handlers, force=True)
    logging.getLogger("trio").setLevel(logging.WARNING)


def run(cfg: MountConfig, ready_fd: int | None = None, foreground: bool = False) -> int:
    """Run a daemon to completion; report readiness on ``ready_fd``. Returns the exit code."""
    os.umask(UMASK)
    said = False

    def ready(err: str | None) -> None:
        nonlocal said
        if said:
            return
        said = True
        if ready_fd is not None:
            msg = "OK\n" if err is None else f"ERR {err}\n"
            with contextlib.suppress(OSError):
                os.write(ready_fd, msg.encode())
                os.close(ready_fd)
        elif err is not None:
            print(f"airfs: {err}", file=sys.stderr)

    try:
        prepare_cache_dir(cfg.cache_dir)  # before the log file is created in it
        setup_logging(cfg, foreground)
        heap.limit_arenas()  # before any worker thread: see airfs/heap.py
        return trio.run(Daemon(cfg).run, ready)
    except Exception as exc:
        leaf = first_leaf(exc)  # nurseries wrap errors in groups: report the error itself
        if isinstance(leaf, MountError):
            log.error("%s", leaf)
            ready(str(leaf))
        else:
            log.exception("daemon failed")
            what = " ".join(f"{type(leaf).__name__}: {leaf}".split())
            ready(f"daemon failed: {what} (log: {cfg.log_file})")
        return 1
    finally:
        ready("daemon exited before the mount was ready")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    ready_fd = None
    if "--ready-fd" in args:
        i = args.index("--ready-fd")
        ready_fd = int(args[i + 1])
        del args[i : i + 2]
    cfg = MountConfig.from_json(args[0])
    return run(cfg, ready_fd, foreground=ready_fd is None)


if __name__ == "__main__":
    sys.exit(main())
