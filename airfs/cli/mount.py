"""The client side of ``airfs mount``: the checks of the mountpoint, the origin, the cache dir and
the log file (each a one-line reason, exit 1), the clearing of a dead mount left by a killed daemon,
the :class:`~airfs.daemon.config.MountConfig` built from the options, and the start of the daemon
(``python -m airfs.daemon.process``, detached) with the wait for its readiness line."""

from __future__ import annotations

import argparse
import contextlib
import errno
import hashlib
import os
import subprocess
import sys
import time
from typing import Any

from airfs.control.protocol import MOUNT_TYPE
from airfs.daemon.config import MountConfig, MountError, check_cache_dir, prepare_cache_dir

from .options import fail


def default_cache_dir(mountpoint: str) -> str:
    """The cache dir of a mount without ``--cache-dir``: one per mountpoint, under
    ``/var/cache/airfs`` as root, else ``~/.cache/airfs``."""
    key = hashlib.sha256(os.path.realpath(mountpoint).encode()).hexdigest()[:12]
    base = "/var/cache/airfs" if os.geteuid() == 0 else os.path.expanduser("~/.cache/airfs")
    return os.path.join(base, key)


def mounts() -> dict[str, str]:
    """mountpoint → filesystem type, from /proc/self/mounts."""
    out = {}
    with open("/proc/self/mounts", encoding="utf-8") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 3:
                out[parts[1].encode().decode("unicode_escape")] = parts[2]
    return out


# -- mount -------------------------------------------------------------------------------------


def _mount_config(args: argparse.Namespace) -> Any:
    """The daemon's configuration from ``airfs mount``'s options (paths made absolute)."""
    mp = os.path.realpath(args.mountpoint)
    cache_dir = os.path.abspath(args.cache_dir) if args.cache_dir else default_cache_dir(mp)
    origin = args.origin
    if origin is not None and "://" not in origin:
        origin = os.path.realpath(origin)
    return MountConfig(
        mountpoint=mp,
        origin=origin,
        cache_dir=cache_dir,
        cache_size=args.cache_size,
        staging_size=args.staging_size,
        staging_min_free=args.staging_min_free,
        ttl=args.ttl,
        immutable=args.immutable,
        log_file=args.log_file or os.path.join(cache_dir, "airfs.log"),
        allow_other=args.allow_other,
        s3_endpoint=args.s3_endpoint,
        s3_region=args.s3_region,
        s3_path_style=args.s3_path_style,
        s3_default_mode=args.s3_default_mode,
        s3_list_heads=args.s3_list_heads,
        s3_timeout=args.s3_timeout,
        drain_timeout=args.drain_timeout,
        debug=args.debug,
        no_cache=args.no_cache,
        write_wait=args.write_wait,
        commit_delay=args.commit_delay,
        allow_devices=args.allow_devices,
        rebuild_cache=args.rebuild_cache,
        emulate_latency=args.emulate_latency,
        emulate_bandwidth=args.emulate_bandwidth,
        emulate_request_size=args.emulate_request_size,
        fuse=args.fuse,
        passthrough=not args.no_passthrough,
        drop_behind=not args.no_drop_behind,
        rebuild_journal=args.rebuild_journal,
        metrics=args.metrics,
    )


def clear_dead_mount(mp: str) -> bool:
    """Unmount (lazily) an airfs mount on ``mp`` whose daemon is gone (the kernel answers
    ENOTCONN or ECONNABORTED), as left by a daemon killed with SIGKILL; True if one was
    cleared. Asked with ``statfs``, which the kernel always sends to the daemon (a ``stat``
    is answered from its attribute cache for a while after the daemon died: the mount
    looked alive, and the new mount was refused, after a change of the mount root)."""
    if mounts().get(mp) != MOUNT_TYPE:
        return False
    try:
        os.statvfs(mp)
        return False  # alive
    except OSError as exc:
        if exc.errno not in (errno.ENOTCONN, errno.ECONNABORTED):
            return False
    cmd = ["umount", "-l", mp] if os.geteuid() == 0 else ["fusermount3", "-u", "-z", mp]
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        subprocess.run(cmd, capture_output=True, timeout=30)
    return mounts().get(mp) != MOUNT_TYPE


def check_mountpoint(mountpoint: str, origin: str | None) -> str | None:
    """The reason ``mountpoint`` cannot be used, or None. A dead airfs mount left by a
    killed daemon is cleared first (its journal is replayed by the new mount)."""
    mp = os.path.realpath(mountpoint)
    if clear_dead_mount(mp):
        sys.stderr.write(f"airfs: cleared a dead mount on {mountpoint} (its daemon had died)\n")
    if not os.path.exists(mp):
        return f"mountpoint {mountpoint} does not exist"
    if not os.path.isdir(mp):
        return f"mountpoint {mountpoint} is not a directory"
    current = mounts()
    if current.get(mp) == MOUNT_TYPE:
        return f"{mountpoint} is already an airfs mount (airfs umount {mountpoint} first)"
    if origin is not None:
        if "://" not in origin and os.path.realpath(origin) == mp:
            return None
        if os.listdir(mp):
            return (
                f"mountpoint {mountpoint} is not empty; to overlay it in place, mount without "
                "--origin"
            )
    return None


def check_origin(origin: str | None) -> str | None:
    """The reason a directory ``origin`` cannot be served, or None (URLs are checked by the
    daemon)."""
    if origin is None or "://" in origin:
        return None
    if not os.path.exists(origin):
        return f"origin {origin} does not exist"
    if not os.path.isdir(origin):
        return f"origin {origin} is not a directory"
    if not os.access(origin, os.R_OK | os.X_OK):
        return f"origin {origin} is not readable"
    return None


def check_log_file(log_file: str) -> str | None:
    """The reason the daemon could not write ``log_file``, or None (its cache-dir default
    directory is created by the mount)."""
    if os.path.isdir(log_file):
        return f"log file {log_file} is a directory"
    parent = os.path.dirname(os.path.abspath(log_file))
    if not os.path.isdir(parent):
        return f"log file directory {parent} does not exist"
    return None


def cmd_mount(args: argparse.Namespace) -> int:
    """``airfs mount``: check, then run the daemon in this process (``--foreground``) or
    start it detached and wait for its readiness line. Returns the exit code."""
    if (
        args.origin is not None
        and "://" not in args.origin
        and os.path.realpath(args.origin) == os.path.realpath(args.mountpoint)
    ):
        args.origin = None  # ORIGIN == MOUNTPOINT: overlay in place
    reason = check_mountpoint(args.mountpoint, args.origin) or check_origin(args.origin)
    if reason:
        return fail(reason)
    cfg = _mount_config(args)
    reason = check_cache_dir(cfg.cache_dir, cfg.mountpoint, cfg.origin)
    if reason is None and args.log_file:
        reason = check_log_file(cfg.log_file)
    if reason:
        return fail(reason)

    if args.restartable and cfg.fuse != "kernel":
        return fail(
            "--restartable needs the kernel transport (--fuse kernel; libfuse owns the "
            "pyfuse3 connection)"
        )
    if args.foreground and args.restartable:
        # this process is the holder (systemd's main process); the daemons log to the file
        from airfs.daemon.holder import run_holder

        try:
            prepare_cache_dir(cfg.cache_dir)
        except MountError as exc:
            return fail(str(exc))
        return run_holder(cfg.to_json(), cfg.mountpoint, None)
    if args.foreground:
        from airfs.daemon.process import run  # the daemon itself, in this process

        return run(cfg, None, foreground=True)
    try:
        prepare_cache_dir(cfg.cache_dir)
    except MountError as exc:
        return fail(str(exc))
    try:
        log_fd = os.open(cfg.log_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        os.fchmod(log_fd, 0o600)  # the log names files: the mounting user's only
    except OSError as exc:
        return fail(f"{exc.filename}: {exc.strerror}")
    rfd, wfd = os.pipe()
    module = "airfs.daemon.holder" if args.restartable else "airfs.daemon.process"
    with os.fdopen(log_fd, "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", module, cfg.to_json(), "--ready-fd", str(wfd)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            pass_fds=(wfd,),
            start_new_session=True,
            close_fds=True,
        )
    os.close(wfd)
    msg = b""
    deadline = time.monotonic() + args.timeout
    with os.fdopen(rfd, "rb") as r:
        os.set_blocking(r.fileno(), False)
        while time.monotonic() < deadline:
            with contextlib.suppress(BlockingIOError):
                chunk = r.read()
                if chunk:
                    msg += chunk
                elif chunk == b"" and proc.poll() is not None:
                    break
            if b"\n" in msg:
                break
            if proc.poll() is not None and not msg:
                break
            time.sleep(0.02)
    line = msg.decode(errors="replace").strip()
    if line == "OK":
        if not args.quiet:
            print(
                f"airfs: mounted {cfg.origin or cfg.mountpoint} on {cfg.mountpoint} "
                f"(pid {proc.pid}, log {cfg.log_file})"
            )
        return 0
    if line.startswith("ERR "):
        proc.wait(timeout=30)
        return fail(line[4:])
    if proc.poll() is None:
        proc.kill()
        proc.wait()
        return fail(f"the mount did not become ready within {args.timeout}s (log: {cfg.log_file})")
    return fail(f"the daemon exited with code {proc.returncode} (log: {cfg.log_file})")


def cmd_restart(args: argparse.Namespace) -> int:
    """``airfs restart``: ask the mount's holder for a new daemon that takes over."""
    from airfs.daemon.holder import request_restart

    mp = os.path.realpath(args.mountpoint)
    if mounts().get(mp) != MOUNT_TYPE:
        return fail(f"{args.mountpoint} is not an airfs mount")
    try:
        answer = request_restart(mp, args.timeout)
    except FileNotFoundError:
        return fail(
            f"{args.mountpoint} has no holder (mounted without --restartable): "
            "unmount and mount it again to replace its daemon"
        )
    except OSError as exc:
        return fail(f"cannot reach the holder of {args.mountpoint}: {exc.strerror or exc}")
    if answer.startswith("OK"):
        if not args.quiet:
            took = answer[2:].strip()
            print(f"airfs: restarted the daemon of {args.mountpoint} (hand-over {took}s)")
        return 0
    return fail(answer.removeprefix("ERR ").strip())
