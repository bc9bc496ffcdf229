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
import functools
import logging
import logging.handlers
import math
import os
import resource
import signal
import sys
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import trio

from airfs.control.protocol import SocketDirError, socket_path
from airfs.control.server import ControlServer
from airfs.core.warm import BackgroundPrefetch
from airfs.daemon import gcpolicy, heap, memdebug
from airfs.fuse.transport import KernelTransport, TransportError, TransportOptions, make_transport
from airfs.origin.base import OriginError
from airfs.writeback.journal import JournalDamaged
from airfs.writeback.recovery import finish_take_over

from .build import Built, build
from .config import UMASK as UMASK
from .config import MountConfig as MountConfig
from .config import MountError as MountError
from .config import check_cache_dir as check_cache_dir
from .config import pop_option
from .config import prepare_cache_dir as prepare_cache_dir
from .control import Daemon
from .holder import RETIRED, Link
from .origins import keep_known, load_known, make_readpath, open_origin, posix_of, save_known
from .takeover import (
    lock_cache_dir,
    mount_or_take_over,
    paths_open_for_writing,
    saved_state,
)

if TYPE_CHECKING:
    from airfs.fuse.kernel.takeover import KernelState, TakeoverRefused

log = logging.getLogger("airfs")


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


def raise_read_ahead(mountpoint: str, kb: int) -> bool | None:
    """Raise the mount's kernel readahead so sequential reads arrive as 1 MiB requests: True
    when it is; False when it may be later (the mount is not in mountinfo yet, or the kernel
    set it back); None when it cannot be (not root, a read-only ``/sys``: logged once)."""
    dev = mount_device(mountpoint)
    if dev is None:
        return False
    path = f"/sys/class/bdi/{dev}/read_ahead_kb"
    try:
        with open(path, "w", encoding="ascii") as f:
            f.write(str(kb))
        with open(path, encoding="ascii") as f:
            return int(f.read()) == kb
    except FileNotFoundError:
        return False
    except OSError as exc:
        log.info("could not raise %s to %d: %s", path, kb, exc)
        return None


#: the longest the mount's readiness waits for its readahead to be raised (seconds)
READ_AHEAD_WAIT_S = 2.0

#: seconds a retiring daemon waits for the requests it is serving to be answered
RETIRE_GRACE = 10.0


async def serve(
    cfg: MountConfig,
    ready: Callable[[str | None], None],
    link: Link | None = None,
    takeover: list[int] | None = None,
    standby: bool = False,
) -> int:
    """Open the origin, lock the cache dir, build everything, mount and serve until
    unmounted; then drain and tear down. Calls ``ready(None)`` once the mount is up. Returns
    the exit code (0, or 3 when pending writes stayed in the journal); a mount that cannot
    start raises :class:`MountError`."""
    os.umask(UMASK)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 1 << 20)), hard))
    overlay_fd = None
    if takeover is not None:
        # the mount is there and nobody serves it: nothing may touch the mountpoint's path
        overlay_fd = takeover[1] if cfg.origin is None and len(takeover) > 1 else None
    else:
        if cfg.origin is None:
            overlay_fd = os.open(cfg.mountpoint, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        reason = check_cache_dir(cfg.cache_dir, cfg.mountpoint, cfg.origin)
        if reason:
            raise MountError(reason)
    sync_origin = open_origin(cfg, overlay_fd)
    posix = posix_of(sync_origin)
    prepare_cache_dir(cfg.cache_dir)
    load_known(sync_origin, cfg.cache_dir)
    if standby and link is not None:
        # loaded and waiting: what a take-over needs later is imported now
        import airfs.cache
        import airfs.fuse.kernel.handover  # noqa: F401

        lock_fd = lock_cache_dir(cfg.cache_dir, math.inf)
        if not link.activate():
            os.close(lock_fd)
            sync_origin.close()
            return 0
        log.info("standby daemon: the serving one is gone, taking over")
    else:
        if takeover is not None and link is not None:
            link.send("WAITING")  # ready to take over: the holder retires the old daemon now
        lock_fd = lock_cache_dir(cfg.cache_dir, 60.0 if takeover is not None else 0.0)
    code = 1
    # a take-over reads what the previous daemon recorded once, after the lock (it is done)
    saved = saved_state(cfg.cache_dir) if takeover else None
    try:
        async with build(
            sync_origin,
            cfg.cache_dir,
            ttl=cfg.ttl,
            immutable=cfg.immutable,
            staging_size=cfg.staging_size,
            staging_min_free=cfg.staging_min_free,
            write_wait=cfg.write_wait,
            commit_delay=cfg.commit_delay,
            allow_devices=cfg.allow_devices,
            readpath=functools.partial(make_readpath, cfg),
            rebuild_journal=cfg.rebuild_journal,
            keep_open=paths_open_for_writing(saved) if saved is not None else frozenset(),
            journal_hint=f"airfs mount --rebuild-journal --cache-dir {cfg.cache_dir} ...",
            remove_temporaries=posix.remove_temporaries if posix is not None else None,
        ) as built:
            if built.recovery.replayed:
                log.info("journal replay: %d closed file(s) to commit", built.recovery.replayed)
            code = await _serve(cfg, built, ready, link, takeover, overlay_fd, saved)
    except JournalDamaged as exc:
        raise MountError(str(exc)) from None
    except OriginError as exc:
        raise MountError(f"origin {sync_origin.url}: {exc.strerror or exc}") from None
    finally:
        sync_origin.close()
        os.close(lock_fd)
        # after the lock: a daemon taking over waits for the lock, not for this file (it
        # loaded the last one saved already; the write replaces the file atomically)
        save_known(sync_origin, cfg.cache_dir)
        log.info("daemon exits with code %d", code)
    return code


async def _serve(
    cfg: MountConfig,
    built: Built,
    ready: Callable[[str | None], None],
    link: Link | None,
    takeover: list[int] | None,
    overlay_fd: int | None,
    saved: KernelState | TakeoverRefused | None = None,
) -> int:
    """Transport, control socket and metrics, then the mount and its tasks (see :func:`serve`).
    With a holder ``link`` the kernel's state is recorded as it changes; ``takeover``: the
    descriptors of a live connection to serve instead of mounting (``saved``: what its
    previous daemon recorded)."""
    prefetcher = BackgroundPrefetch(built.origin, built.readpath, resolve=built.fs.origin_entry)
    built.fs.core.ahead.submit = prefetcher.submit_refs  # a directory read in order
    initialized = trio.Event()
    fsname = (built.origin.url or "airfs").replace(",", "_").replace(" ", "_")
    try:
        if link is not None and cfg.fuse != "kernel":
            raise TransportError(
                "--restartable needs --fuse kernel (libfuse owns the pyfuse3 transport's "
                "connection: it cannot be handed to another daemon)"
            )
        opts = TransportOptions(
            fsname,
            _allow_other(cfg),
            cfg.debug,
            initialized.set,
            # a passthrough open binds its inode to one kernel backing object that another
            # daemon could not name: a restartable mount serves every read itself
            cfg.passthrough and link is None,
            state_dir=cfg.cache_dir if link is not None else None,
            drop_behind=cfg.drop_behind,
        )
        transport = make_transport(cfg.fuse, built.fs, cfg.ttl, opts)
    except TransportError as exc:
        raise MountError(str(exc)) from None
    d = Daemon(cfg, built, transport, prefetcher)
    # Everything that touches the mountpoint path happens before the mount: once mounted,
    # a stat of it would wait for this very process to answer.
    control = ControlServer(d, socket_path(cfg.mountpoint, resolve=takeover is None))
    serve_metrics = await _metrics_server(d)
    try:
        trim_idle_s = heap.trim_idle_seconds()
    except ValueError as exc:
        raise MountError(str(exc)) from None
    retired = False
    if await mount_or_take_over(cfg, transport, link, takeover, overlay_fd, saved):
        initialized.set()  # INIT was the old daemon's
    # commits may start at the files held open for writing; the versions open for writing
    # that recovery adopted and no handle reopened are kept in recovered/ (each logged)
    finish_take_over(built.area, built.recovery)
    code = 0
    try:
        async with trio.open_nursery() as nursery:
            ahead = trio.Event()
            nursery.start_soon(_raise_read_ahead, d, initialized, ahead)
            try:
                await nursery.start(control.serve)
            except SocketDirError as exc:
                raise MountError(str(exc.strerror or exc)) from None
            nursery.start_soon(_fuse_main, d)
            nursery.start_soon(_signals, d)
            nursery.start_soon(_abort_stale_uploads, d)
            nursery.start_soon(d.prefetcher.run)
            nursery.start_soon(keep_known, built.origin.sync, cfg.cache_dir)
            if serve_metrics is not None:
                nursery.start_soon(serve_metrics)
            nursery.start_soon(heap.trim_when_idle, d.activity, trim_idle_s)
            if os.environ.get(memdebug.ENV):  # a debugging hook: see airfs/memdebug.py
                nursery.start_soon(memdebug.serve, d.components(), os.environ[memdebug.ENV])
            # a file keeps the readahead of the moment it was opened: the mount is ready
            # once it is raised (or could not be), so that a job's first open has it too
            with trio.move_on_after(READ_AHEAD_WAIT_S):
                await ahead.wait()
            log.info("mounted %s on %s (cache %s)", d.origin.url, cfg.mountpoint, cfg.cache_dir)
            ready(None)
            if link is not None:
                link.send("READY")
            with trio.CancelScope() as wait_scope:
                nursery.start_soon(_set_when, d.fuse_done, wait_scope)
                if link is not None:
                    nursery.start_soon(_set_when_retire, link, wait_scope)
                await d.stop_requested.wait()
            if link is not None and not d.stop_requested.is_set() and not d.fuse_done.is_set():
                assert isinstance(transport, KernelTransport)
                left = await transport.retire(RETIRE_GRACE)
                log.info("retired: the next daemon takes over (%d request(s) to resend)", left)
                retired = True
                nursery.cancel_scope.cancel()
                return RETIRED
            if not d.fuse_done.is_set():
                transport.terminate()
                await d.fuse_done.wait()
            else:
                log.info("unmounted externally; committing pending writes")
            result = await d.drain()
            code = 0 if result.get("drained") else 3
            nursery.cancel_scope.cancel()
    finally:
        if link is not None and not retired:
            link.send("BYE")
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


async def _raise_read_ahead(d: Daemon, initialized: trio.Event, done: trio.Event) -> None:
    """The kernel sets the mount's readahead from the INIT reply (128 KiB): raise it
    once that reply is out, so sequential reads arrive as 1 MiB requests; ``done`` is set
    when it is raised or given up. A file keeps the readahead of the moment it was opened,
    so the mount is reported ready only after this (``READ_AHEAD_WAIT_S`` at most)."""
    try:
        await initialized.wait()
        # the kernel transport's INIT reply is applied by the kernel as it is written; libfuse
        # writes pyfuse3's after its init callback: give it a moment
        first = 0.0 if d.cfg.fuse == "kernel" else 0.05
        for attempt in range(20):
            await trio.sleep(first if attempt == 0 else 0.05)
            raised = await trio.to_thread.run_sync(
                raise_read_ahead, d.cfg.mountpoint, d.cfg.read_ahead_kb
            )
            d.read_ahead = bool(raised)
            if raised is not False:  # raised, or it cannot be (a user's mount): no retry
                return
    finally:
        done.set()


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


async def _set_when_retire(link: Link, scope: trio.CancelScope) -> None:
    await link.wait_retire()
    scope.cancel()


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


def run(
    cfg: MountConfig,
    ready_fd: int | None = None,
    foreground: bool = False,
    holder_fd: int | None = None,
    takeover: list[int] | None = None,
    standby: bool = False,
) -> int:
    """Run a daemon to completion; report readiness on ``ready_fd``. Returns the exit code.
    ``holder_fd``: the link to the holder (:mod:`airfs.daemon.holder`); ``takeover``: the
    descriptors of the live connection it passed (the /dev/fuse one first)."""
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
        try:
            young = gcpolicy.young_threshold()
        except ValueError as exc:
            raise MountError(str(exc)) from None
        gcpolicy.tune(young)  # modules are imported: freeze them (airfs/daemon/gcpolicy.py)
        link = Link(holder_fd) if holder_fd is not None else None
        return trio.run(serve, cfg, ready, link, takeover, standby)
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
    ready = pop_option(args, "--ready-fd")
    ready_fd = None if ready is None else int(ready)
    holder = pop_option(args, "--holder-fd")
    holder_fd = None if holder is None else int(holder)
    fds = pop_option(args, "--takeover")
    takeover = None if fds is None else [int(x) for x in fds.split(",")]
    standby = "--standby" in args
    if standby:
        args.remove("--standby")
    cfg = MountConfig.from_json(args[0])
    foreground = ready_fd is None and holder_fd is None
    return run(cfg, ready_fd, foreground, holder_fd, takeover, standby)


if __name__ == "__main__":
    sys.exit(main())
