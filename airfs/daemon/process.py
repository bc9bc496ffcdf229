"""The daemon process: options → origin → :func:`airfs.daemon.build.build` → FUSE transport →
control socket and metrics → periodic tasks; then serves until unmounted, draining pending commits
first. What the control socket talks to is the facade :class:`airfs.daemon.control.Daemon`, which
this module fills in; the configuration and the checks before a mount are in
:mod:`airfs.daemon.config`.

Run as ``python -m airfs.daemon.process CONFIG_JSON [--ready-fd N]`` by ``airfs mount`` (which
detaches it), or in-process with ``--foreground``. Readiness is reported once, on the ready fd:
``OK`` when the mount is up, or ``ERR <one-line reason>``. Errors map to one line
(:func:`first_leaf`, :class:`MountError`)."""

from __future__ import annotations

import contextlib
import fcntl
import functools
import logging
import logging.handlers
import os
import resource
import signal
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from airfs.control.protocol import SocketDirError, socket_path
from airfs.control.server import ControlServer
from airfs.core.readpath import DirectReadPath, ReadPath
from airfs.core.warm import BackgroundPrefetch
from airfs.daemon import heap, memdebug
from airfs.fuse.transport import TransportError, TransportOptions, make_transport
from airfs.origin.aio import AsyncOrigin
from airfs.origin.base import Origin, OriginError
from airfs.origin.latency import LatencyOrigin
from airfs.origin.posix import PosixOrigin, tmp_tag
from airfs.writeback.journal import JournalDamaged

from .build import Built, build
from .config import UMASK as UMASK
from .config import MountConfig as MountConfig
from .config import MountError as MountError
from .config import check_cache_dir as check_cache_dir
from .config import prepare_cache_dir as prepare_cache_dir
from .control import Daemon

log = logging.getLogger("airfs")


def open_origin(cfg: MountConfig, overlay_fd: int | None) -> Origin:
    """Build the origin named by the config (wrapped in a latency emulator if asked).
    Raises :class:`MountError`."""
    origin = _open_origin(cfg, overlay_fd)
    if cfg.emulate_latency or cfg.emulate_bandwidth:
        return LatencyOrigin(origin, cfg.emulate_latency, cfg.emulate_bandwidth)
    return origin


def posix_of(origin: Origin) -> PosixOrigin | None:
    """The POSIX origin ``origin`` is (or emulates the latency of), else None."""
    inner = origin.inner if isinstance(origin, LatencyOrigin) else origin
    return inner if isinstance(inner, PosixOrigin) else None


def _open_origin(cfg: MountConfig, overlay_fd: int | None) -> Origin:
    spec = cfg.origin
    try:
        if spec is None:
            assert overlay_fd is not None
            return PosixOrigin(cfg.mountpoint, dir_fd=overlay_fd, tag=tmp_tag(cfg.cache_dir))
        if spec.startswith("s3://"):
            try:
                from airfs.origin.s3 import S3Origin
            except ImportError as exc:  # pragma: no cover - s3 support is part of the package
                raise MountError(f"S3 origins are not available: {exc}") from None
            extra: dict[str, Any] = {}
            if cfg.s3_default_mode is not None:
                extra["default_mode"] = cfg.s3_default_mode
            if cfg.s3_timeout is not None:
                extra["stall_timeout"] = cfg.s3_timeout
            return S3Origin.from_url(
                spec,
                endpoint=cfg.s3_endpoint,
                region=cfg.s3_region,
                path_style=cfg.s3_path_style,
                list_heads=cfg.s3_list_heads,
                **extra,
            )
        if "://" in spec and not spec.startswith("file://"):
            raise MountError(f"unsupported origin {spec!r} (use a directory or s3://bucket/prefix)")
        return PosixOrigin(spec.removeprefix("file://"), tag=tmp_tag(cfg.cache_dir))
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


async def serve(cfg: MountConfig, ready: Callable[[str | None], None]) -> int:
    """Open the origin, lock the cache dir, build everything, mount and serve until
    unmounted; then drain and tear down. Calls ``ready(None)`` once the mount is up. Returns
    the exit code (0, or 3 when pending writes stayed in the journal); a mount that cannot
    start raises :class:`MountError`."""
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
    posix = posix_of(sync_origin)
    prepare_cache_dir(cfg.cache_dir)
    lock_fd = os.open(os.path.join(cfg.cache_dir, "lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise MountError(f"cache dir {cfg.cache_dir} is in use by another airfs mount") from None
    code = 1
    try:
        async with build(
            sync_origin,
            cfg.cache_dir,
            ttl=cfg.ttl,
            immutable=cfg.immutable,
            staging_size=cfg.staging_size,
            staging_min_free=cfg.staging_min_free,
            write_wait=cfg.write_wait,
            allow_devices=cfg.allow_devices,
            readpath=functools.partial(make_readpath, cfg),
            rebuild_journal=cfg.rebuild_journal,
            journal_hint=f"airfs mount --rebuild-journal --cache-dir {cfg.cache_dir} ...",
            remove_temporaries=posix.remove_temporaries if posix is not None else None,
        ) as built:
            if built.recovery.replayed:
                log.info("journal replay: %d closed file(s) to commit", built.recovery.replayed)
            code = await _serve(cfg, built, ready)
    except JournalDamaged as exc:
        raise MountError(str(exc)) from None
    except OriginError as exc:
        raise MountError(f"origin {sync_origin.url}: {exc.strerror or exc}") from None
    finally:
        sync_origin.close()
        os.close(lock_fd)
        log.info("daemon exits with code %d", code)
    return code


async def _serve(cfg: MountConfig, built: Built, ready: Callable[[str | None], None]) -> int:
    """Transport, control socket and metrics, then the mount and its tasks (see :func:`serve`)."""
    prefetcher = BackgroundPrefetch(built.origin, built.readpath, resolve=built.fs.origin_entry)
    initialized = trio.Event()
    fsname = (built.origin.url or "airfs").replace(",", "_").replace(" ", "_")
    try:
        opts = TransportOptions(
            fsname, _allow_other(cfg), cfg.debug, initialized.set, cfg.passthrough
        )
        transport = make_transport(cfg.fuse, built.fs, cfg.ttl, opts)
    except TransportError as exc:
        raise MountError(str(exc)) from None
    d = Daemon(cfg, built, transport, prefetcher)
    # Everything that touches the mountpoint path happens before the mount: once mounted,
    # a stat of it would wait for this very process to answer.
    control = ControlServer(d, socket_path(cfg.mountpoint))
    serve_metrics = await _metrics_server(d)
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
            nursery.start_soon(_raise_read_ahead, d, initialized)
            try:
                await nursery.start(control.serve)
            except SocketDirError as exc:
                raise MountError(str(exc.strerror or exc)) from None
            nursery.start_soon(_fuse_main, d)
            nursery.start_soon(_signals, d)
            nursery.start_soon(_abort_stale_uploads, d)
            nursery.start_soon(d.prefetcher.run)
            if serve_metrics is not None:
                nursery.start_soon(serve_metrics)
            nursery.start_soon(heap.trim_when_idle, d.activity, trim_idle_s)
            if os.environ.get(memdebug.ENV):  # a debugging hook: see airfs/memdebug.py
                nursery.start_soon(memdebug.serve, d.components(), os.environ[memdebug.ENV])
            log.info("mounted %s on %s (cache %s)", d.origin.url, cfg.mountpoint, cfg.cache_dir)
            ready(None)
            with trio.CancelScope() as wait_scope:
                nursery.start_soon(_set_when, d.fuse_done, wait_scope)
                await d.stop_requested.wait()
            if not d.fuse_done.is_set():
                transport.terminate()
                await d.fuse_done.wait()
            else:
                log.info("unmounted externally; committing pending writes")
            result = await d.drain()
            code = 0 if result.get("drained") else 3
            nursery.cancel_scope.cancel()
    finally:
        transport.close()
    return code


async def _metrics_server(d: Daemon) -> Callable[[], Awaitable[None]] | None:
    """With ``--metrics``: bind its socket now (a port in use fails the mount with a
    one-line reason) and return the task that serves it."""
    if d.cfg.metrics is None:
        return None
    from airfs.obs import metrics

    address, port = metrics.parse_address(d.cfg.metrics)
    try:
        listener = await metrics.open_listener(address, port)
    except OSError as exc:
        raise MountError(
            f"--metrics {address}:{port}: cannot listen: {exc.strerror or exc}"
        ) from None
    render = metrics.render_with(metrics.registry(d.metrics_snapshot))
    log.info("metrics on http://%s:%d/metrics", address, port)
    return functools.partial(metrics.serve, listener, render)


async def _raise_read_ahead(d: Daemon, initialized: trio.Event) -> None:
    """The kernel sets the mount's readahead from the INIT reply (128 KiB): raise it
    once that reply is out, so sequential reads arrive as 1 MiB requests."""
    await initialized.wait()
    for _ in range(20):
        await trio.sleep(0.05)
        d.read_ahead = await trio.to_thread.run_sync(
            raise_read_ahead, d.cfg.mountpoint, d.cfg.read_ahead_kb
        )
        if d.read_ahead:
            return


async def _fuse_main(d: Daemon) -> None:
    assert d.transport is not None
    try:
        await d.transport.main()
    finally:
        d.fuse_done.set()


async def _signals(d: Daemon) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as sigs:
        async for sig in sigs:
            log.info("signal %d: draining and unmounting", sig)
            if sig == signal.SIGHUP:
                continue
            result = await d.drain()
            if not result.get("drained"):
                log.error("unmounting with %d file(s) still pending", result.get("pending", 0))
            d.stop_requested.set()


async def _abort_stale_uploads(d: Daemon) -> None:
    """S3: abort multipart uploads left behind by a killed daemon (over an hour old)."""
    from airfs.origin.s3 import S3Origin

    if not isinstance(d.origin.sync, S3Origin):
        return
    try:
        n = await trio.to_thread.run_sync(d.origin.sync.abort_stale_uploads)
    except OriginError as exc:
        log.warning("could not look for abandoned multipart uploads: %s", exc)
        return
    if n:
        log.info("aborted %d abandoned multipart upload(s) older than an hour", n)


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


#: the log file is rotated at this size, keeping LOG_BACKUPS older ones (``airfs.log.1``
#: ...): at most (1 + LOG_BACKUPS) * LOG_MAX_BYTES of logs on the cache disk
LOG_MAX_BYTES = 16 << 20
LOG_BACKUPS = 3


def setup_logging(cfg: MountConfig, foreground: bool) -> None:
    """Log to ``cfg.log_file`` (rotated: :data:`LOG_MAX_BYTES`, :data:`LOG_BACKUPS`) and,
    in the foreground or without a file, to stderr."""
    level = logging.DEBUG if cfg.debug else logging.INFO
    fmt = "%(asctime)s %(levelname)s %(name)s: %(message)s"
    handlers: list[logging.Handler] = []
    if cfg.log_file:
        os.makedirs(os.path.dirname(os.path.abspath(cfg.log_file)), exist_ok=True)
        handlers.append(
            logging.handlers.RotatingFileHandler(
                cfg.log_file, maxBytes=LOG_MAX_BYTES, backupCount=LOG_BACKUPS
            )
        )
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
        return trio.run(serve, cfg, ready)
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
