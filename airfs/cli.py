"""``airfs``: mount, umount, status, warm, flush, catalog (:mod:`airfs.catalog.cli`).

Exit codes: 0 success; 1 failure (a one-line reason on stderr); 2 bad usage; 3 unmounted with
writes still pending (they stay in the journal and commit at the next mount).
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import hashlib
import json
import math
import os
import re
import subprocess
import sys
import time
from typing import Any, NoReturn

from airfs.catalog.cli import register as register_catalog
from airfs.control import client
from airfs.control.protocol import MOUNT_TYPE
from airfs.fuse import DEFAULT_TRANSPORT, TRANSPORTS

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgtp]?)(i?b?)\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """``"50G"``, ``"512MiB"``, ``"1073741824"`` → bytes (powers of 1024)."""
    m = _SIZE.match(str(text))
    if not m:
        if str(text).strip().startswith("-"):
            raise argparse.ArgumentTypeError(f"a size cannot be negative: {text!r}")
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 50G, 512M)")
    mult = 1024 ** "_kmgtp".index(m.group(2).lower() or "_")
    return int(float(m.group(1)) * mult)


def positive_size(text: str) -> int:
    """A size of at least one byte (a limit of 0 would make the mount useless)."""
    n = parse_size(text)
    if n <= 0:
        raise argparse.ArgumentTypeError(f"must be more than 0, got {text!r}")
    return n


def seconds(text: str) -> float:
    """A finite number of seconds, 0 or more."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not math.isfinite(v) or v < 0:
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds >= 0, got {text!r}")
    return v


def positive_seconds(text: str) -> float:
    """A finite number of seconds, more than 0 (a timeout)."""
    v = seconds(text)
    if v <= 0:
        raise argparse.ArgumentTypeError(f"must be more than 0 seconds, got {text!r}")
    return v


def metrics_address(text: str) -> str:
    """``[ADDR:]PORT`` for ``--metrics``, normalised to ``ADDR:PORT``."""
    from airfs.metrics import parse_address

    try:
        host, port = parse_address(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if v <= 0:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {text!r}")
    return v


class _Parser(argparse.ArgumentParser):
    """Usage errors are one line (``airfs mount: error: ...``) and exit 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _join_negative_values(argv: list[str]) -> list[str]:
    """``--cache-size -5G`` → ``--cache-size=-5G``, so that argparse hands a negative value to
    the option's type (which says what is wrong) instead of taking it for an unknown option.
    No airfs option starts with a digit, so ``-<digit>...`` is always a value."""
    out: list[str] = []
    for arg in argv:
        prev = out[-1] if out else ""
        if _NEGATIVE.match(arg) and prev.startswith("-") and "=" not in prev and prev != "--":
            out[-1] = f"{prev}={arg}"
        else:
            out.append(arg)
    return out


_NEGATIVE = re.compile(r"^-\.?\d")


def fail(msg: str, code: int = 1) -> int:
    print(f"airfs: {msg}", file=sys.stderr)
    return code


def _octal_mode(text: str) -> int:
    try:
        mode = int(text, 8)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an octal mode (e.g. 640)") from None
    if not 0 <= mode <= 0o777:
        raise argparse.ArgumentTypeError(f"{text!r} is not a mode between 000 and 777")
    return mode


def default_cache_dir(mountpoint: str) -> str:
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
    from airfs.mount import MountConfig

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
        ttl=args.ttl,
        log_file=args.log_file or os.path.join(cache_dir, "airfs.log"),
        allow_other=args.allow_other,
        s3_endpoint=args.s3_endpoint,
        s3_region=args.s3_region,
        s3_path_style=args.s3_path_style,
        s3_default_mode=args.s3_default_mode,
        s3_list_heads=args.s3_list_heads,
        drain_timeout=args.drain_timeout,
        debug=args.debug,
        no_cache=args.no_cache,
        write_wait=args.write_wait,
        allow_devices=args.allow_devices,
        rebuild_cache=args.rebuild_cache,
        emulate_latency=args.emulate_latency,
        emulate_bandwidth=args.emulate_bandwidth,
        fuse=args.fuse,
        passthrough=not args.no_passthrough,
        rebuild_journal=args.rebuild_journal,
        metrics=args.metrics,
    )


def clear_dead_mount(mp: str) -> bool:
    """Unmount (lazily) an airfs mount on ``mp`` whose daemon is gone (the kernel answers
    ENOTCONN or ECONNABORTED), as left by a daemon killed with SIGKILL; True if one was
    cleared."""
    if mounts().get(mp) != MOUNT_TYPE:
        return False
    try:
        os.stat(mp)
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
    from airfs.mount import MountError, check_cache_dir, prepare_cache_dir, run

    reason = check_cache_dir(cfg.cache_dir, cfg.mountpoint, cfg.origin)
    if reason is None and args.log_file:
        reason = check_log_file(cfg.log_file)
    if reason:
        return fail(reason)

    if args.foreground:
        return run(cfg, None, foreground=True)
    try:
        prepare_cache_dir(cfg.cache_dir)
    except MountError as exc:
        return fail(str(exc))
    try:
        log_fd = os.open(
            cfg.log_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600
        )
        os.fchmod(log_fd, 0o600)  # the log names files: the mounting user's only
    except OSError as exc:
        return fail(f"{exc.filename}: {exc.strerror}")
    rfd, wfd = os.pipe()
    with os.fdopen(log_fd, "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "airfs.mount", cfg.to_json(), "--ready-fd", str(wfd)],
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


# -- umount, status, warm, flush ----------------------------------------------------------------


def _require_mount(path: str) -> str:
    mp = client.find_mount(path)
    if mp is None:
        raise SystemExit(fail(f"{path} is not on an airfs mount"))
    return mp


def _progress_printer(kind: str, enabled: bool) -> Any:
    if not enabled or not sys.stderr.isatty():
        return None

    def show(p: dict[str, Any]) -> None:
        if kind == "warm":
            tf, tb = p.get("total_files", 0), p.get("total_bytes", 0)
            frac = p["bytes"] / tb if tb else 1.0
            bar = "#" * int(frac * 30)
            rate = p["bytes"] / max(p.get("seconds", 0), 1e-9) / 2**20
            sys.stderr.write(
                f"\r[{bar:<30}] {p['files']}/{tf} files {p['bytes'] / 2**20:.0f}/"
                f"{tb / 2**20:.0f} MiB {rate:.0f} MiB/s"
            )
        else:
            sys.stderr.write(
                f"\r{kind}: {p.get('left', 0)}/{p.get('total', 0)} files left "
                f"({p.get('bytes_left', 0) / 2**20:.0f} MiB)   "
            )
        sys.stderr.flush()

    return show


def cmd_umount(args: argparse.Namespace) -> int:
    mp = os.path.realpath(args.mountpoint)
    if mounts().get(mp) != MOUNT_TYPE:
        return fail(f"{args.mountpoint} is not an airfs mount")
    pid = None
    try:
        pid = client.status(mp).get("pid")
        result = client.request(
            mp, "unmount", on_progress=_progress_printer("draining", not args.quiet)
        )
    except client.ControlError as exc:
        if exc.errno in (errno.EPERM, errno.EACCES):
            return fail(str(exc))  # refused: --force would not help
        if not args.force:
            return fail(f"{exc} (use --force to unmount without draining)")
        result = {"drained": False, "error": str(exc)}
        try:
            subprocess.run(["fusermount3", "-u", "-z", mp], check=False, timeout=60)
        except (OSError, subprocess.TimeoutExpired) as exc2:
            return fail(f"fusermount3 -u -z {mp} failed: {exc2}")
    if sys.stderr.isatty() and not args.quiet:
        sys.stderr.write("\n")
    deadline = time.monotonic() + args.timeout
    while time.monotonic() < deadline and mounts().get(mp) == MOUNT_TYPE:
        time.sleep(0.05)
    while pid and time.monotonic() < deadline and _alive(pid):
        time.sleep(0.05)
    if mounts().get(mp) == MOUNT_TYPE:
        return fail(f"{args.mountpoint} is still mounted (busy?)")
    if not result.get("drained", False):
        return fail(
            f"unmounted {args.mountpoint}, but {result.get('pending', '?')} file(s) are not yet "
            f"at the origin ({result.get('error')}); they stay in the journal and are committed "
            "at the next mount with the same --cache-dir",
            3,
        )
    if not args.quiet:
        print(f"airfs: unmounted {args.mountpoint} (all writes committed)")
    return 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().split()[2] != "Z"
    except OSError:
        return False


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return str(n)


def _duration(s: float | None) -> str:
    """A duration for people: µs below 1 ms, ms below 1 s, else s."""
    if s is None:
        return "-"
    if s < 1e-3:
        return f"{s * 1e6:.0f}µs"
    if s < 1.0:
        return f"{s * 1e3:.3g}ms"
    return f"{s:.3g}s"


def _latency_line(hists: dict[str, Any], most: int = 6) -> str:
    """``op p50/p99`` for the ``most`` operations with the most calls (status JSON records:
    see :meth:`airfs.histogram.LatencyHistogram.to_dict`)."""
    top = sorted(hists.items(), key=lambda kv: (-int(kv[1].get("count") or 0), kv[0]))[:most]
    return ", ".join(
        f"{op} {_duration(h.get('p50'))}/{_duration(h.get('p99'))}"
        for op, h in top
        if h.get("count")
    )


def cmd_status(args: argparse.Namespace) -> int:
    mp = _require_mount(args.mountpoint)
    try:
        st = client.status(mp)
    except client.ControlError as exc:
        return fail(str(exc))
    if args.json:
        print(json.dumps(st, indent=2))
        return 0
    wb, cache = st["writeback"], st["cache"]
    print(f"mountpoint   {st['mountpoint']}")
    print(f"origin       {st['origin']}")
    print(f"cache dir    {st['cache_dir']}")
    print(f"pid          {st['pid']}   uptime {st['uptime_s']} s   ttl {st['ttl']} s")
    ops = st["fs"]["ops"]
    print("operations   " + ", ".join(f"{k} {v}" for k, v in sorted(ops.items())) or "-")
    fs_lat = _latency_line(st["fs"].get("latency") or {})
    if fs_lat:
        print(f"latency      {fs_lat} (p50/p99)")
    origin_lat = _latency_line((st.get("origin_calls") or {}).get("latency") or {})
    if origin_lat:
        print(f"origin time  {origin_lat} (p50/p99 per attempt)")
    if "cache_bytes_used" in cache:
        print(
            f"cache        {_human(cache['cache_bytes_used'])} of "
            f"{_human(cache['cache_bytes_limit'])} in {cache['cache_objects']} objects; "
            f"evictions {cache['evictions']}, corrupt blocks refetched {cache['corrupt_blocks']}"
        )
        print(
            f"reads        hits {_human(cache['hit_bytes'])}, misses {_human(cache['miss_bytes'])}"
            f", origin {_human(cache['origin_bytes_read'])} in {cache['origin_requests']} "
            "requests"
        )
        print(
            f"prefetch     window {_human(cache['prefetch_window_current'])} (max "
            f"{_human(cache['prefetch_window_max'])}), prefetched "
            f"{_human(cache['prefetch_bytes'])}, in flight {_human(cache['inflight_bytes'])}"
        )
    else:
        print(f"cache        {json.dumps(cache)}")
    print(
        f"pending      {wb['pending_files']} file(s), {_human(wb['pending_bytes'])}, oldest "
        f"{wb['oldest_pending_s']} s; uploading {wb['uploading']}"
    )
    print(
        f"committed    {wb['committed_files']} file(s), {_human(wb['committed_bytes'])} at "
        f"{wb['commit_mib_s']} MiB/s; errors {wb['errors']}"
    )
    if wb.get("last_error"):
        print(f"last error   {wb['last_error']}")
    fuse = st.get("fuse") or {}
    if fuse:
        extra = ""
        if fuse.get("protocol"):
            extra = (
                f" {fuse['protocol']}, requests up to {_human(fuse['max_write'])}, passthrough "
                f"{'on' if fuse.get('passthrough') else 'off'}; {' '.join(fuse['flags'])}"
            )
        print(f"fuse         {fuse.get('transport')}{extra}")
    gov = st.get("catalog") or {}
    if gov.get("catalog", {}).get("governed"):
        print(
            f"catalog      governed (serial {gov['catalog']['serial']}); denied "
            f"{gov['denied']} of {gov['checks']} checks"
            + "".join(f", {k} {v}" for k, v in sorted(gov["denied_by_privilege"].items()))
        )
    return 0


def cmd_warm(args: argparse.Namespace) -> int:
    for p in args.paths:
        if not os.path.lexists(p):
            return fail(f"{p}: no such file or directory")
    mp = _require_mount(args.paths[0])
    for p in args.paths[1:]:
        if client.find_mount(p) != mp:
            return fail(f"{p} is not on the same airfs mount as {args.paths[0]}")
    try:
        res = client.warm(mp, args.paths, args.jobs, _progress_printer("warm", not args.quiet))
    except client.ControlError as exc:
        return fail(str(exc))
    if sys.stderr.isatty() and not args.quiet:
        sys.stderr.write("\n")
    print(
        f"warmed {res['files']} files, {_human(res['bytes'])} ({_human(res['fetched'])} from the "
        f"origin) in {res['seconds']:.2f} s, {res['mib_s']} MiB/s"
    )
    for f in res.get("failures", []):
        print(f"  failed: {f['path']}: {f['error']}", file=sys.stderr)
    return 1 if res.get("failed") else 0


def cmd_flush(args: argparse.Namespace) -> int:
    mp = _require_mount(args.path)
    try:
        res = client.request(
            mp,
            "flush",
            path=client._rel_paths(mp, [args.path])[0],
            on_progress=_progress_printer("flush", not args.quiet),
            timeout=args.timeout,
        )
    except client.ControlError as exc:
        return fail(str(exc))
    except TimeoutError:
        return fail(f"flush of {args.path} did not finish within {args.timeout}s")
    if sys.stderr.isatty() and not args.quiet:
        sys.stderr.write("\n")
    if not args.quiet:
        print(f"flushed {res['files']} file(s) in {res['seconds']} s")
    return 0


# -- parser ------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="airfs",
        description="Mount shared storage (a directory or an S3-compatible bucket) as a fast, "
        "cached local filesystem for ML training.",
    )
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    m = sub.add_parser(
        "mount",
        help="mount an origin on MOUNTPOINT",
        description="Mount ORIGIN on MOUNTPOINT. Returns once the mount is ready; the daemon "
        "runs detached and logs to a file (printed). Without --origin, MOUNTPOINT is overlaid "
        "in place: what is in it stays visible and becomes the origin.",
    )
    m.add_argument("mountpoint", metavar="MOUNTPOINT")
    m.add_argument(
        "--origin",
        metavar="DIR|s3://BUCKET[/PREFIX]",
        help="the storage to serve (default: MOUNTPOINT itself, overlaid in place)",
    )
    m.add_argument(
        "--cache-dir",
        metavar="DIR",
        help="local cache and staging directory (default /var/cache/airfs/<id> as "
        "root, ~/.cache/airfs/<id> otherwise)",
    )
    m.add_argument(
        "--cache-size",
        type=positive_size,
        default=parse_size("50G"),
        metavar="SIZE",
        help="block cache limit (default 50G)",
    )
    m.add_argument(
        "--staging-size",
        type=positive_size,
        default=parse_size("100G"),
        metavar="SIZE",
        help="limit on written data not yet committed; writers wait, then get ENOSPC "
        "(default 100G)",
    )
    m.add_argument(
        "--ttl",
        type=seconds,
        default=1.0,
        metavar="SECONDS",
        help="attribute/entry cache time; changes at the origin are seen within it (default 1)",
    )
    m.add_argument(
        "--foreground", "-f", action="store_true", help="stay attached and log to stderr"
    )
    m.add_argument("--log-file", metavar="FILE", help="daemon log (default CACHE_DIR/airfs.log)")
    m.add_argument(
        "--allow-other",
        dest="allow_other",
        action="store_true",
        default=None,
        help="let other users access the mount (default: on as root, else only if "
        "/etc/fuse.conf has user_allow_other)",
    )
    m.add_argument("--no-allow-other", dest="allow_other", action="store_false")
    m.add_argument(
        "--s3-endpoint", metavar="URL", help="S3 endpoint (default $AWS_ENDPOINT_URL, else AWS)"
    )
    m.add_argument("--s3-region", metavar="REGION", help="S3 region (default from AWS config)")
    m.add_argument(
        "--s3-path-style",
        action="store_true",
        default=None,
        help="path-style S3 addressing (most self-hosted stores need it)",
    )
    m.add_argument(
        "--s3-default-mode",
        type=_octal_mode,
        default=None,
        metavar="OCTAL",
        help="mode of S3 objects that carry none (written by other tools; default 644)",
    )
    m.add_argument(
        "--s3-trust-listings",
        dest="s3_list_heads",
        action="store_false",
        help="list objects not seen yet with the default mode instead of a HEAD each "
        "(faster first listings; only where no private files are written)",
    )
    m.add_argument(
        "--drain-timeout",
        type=seconds,
        default=3600.0,
        metavar="SECONDS",
        help="how long unmount waits for pending commits (default 3600)",
    )
    m.add_argument(
        "--write-wait",
        type=seconds,
        default=30.0,
        metavar="SECONDS",
        help="how long a writer waits for staging space before ENOSPC (default 30)",
    )
    m.add_argument(
        "--allow-devices",
        action="store_true",
        help="let mknod create device nodes (POSIX origins; they cannot be opened through "
        "the mount, which is nodev)",
    )
    m.add_argument("--no-cache", action="store_true", help="read through to the origin, no cache")
    m.add_argument(
        "--fuse",
        choices=TRANSPORTS,
        default=DEFAULT_TRANSPORT,
        help=f"FUSE transport: airfs's own kernel-protocol loop, or libfuse through pyfuse3 "
        f"(default {DEFAULT_TRANSPORT})",
    )
    m.add_argument(
        "--no-passthrough",
        action="store_true",
        help="kernel transport: serve every read and write through the daemon, never by FUSE "
        "passthrough of local (cached or staged) files",
    )
    m.add_argument(
        "--rebuild-journal",
        action="store_true",
        help="rebuild a lost or damaged write-back journal from the staging files' own "
        "records (what the refusal to start says to run)",
    )
    m.add_argument(
        "--rebuild-cache",
        action="store_true",
        help="if the block cache's index is damaged, move it aside (CACHE_DIR/blocks/"
        "index.damaged-TIME) and start with an empty block cache; pending writes are kept",
    )
    m.add_argument(
        "--emulate-latency",
        type=seconds,
        default=0.0,
        metavar="SECONDS",
        help="testing/benchmarks: add this latency to every origin request",
    )
    m.add_argument(
        "--emulate-bandwidth",
        type=positive_size,
        default=None,
        metavar="SIZE",
        help="testing/benchmarks: cap origin transfer at SIZE bytes/s (e.g. 100M)",
    )
    m.add_argument(
        "--timeout",
        type=positive_seconds,
        default=60.0,
        metavar="SECONDS",
        help="how long to wait for the mount to be ready (default 60)",
    )
    m.add_argument(
        "--metrics",
        type=metrics_address,
        default=None,
        metavar="[ADDR:]PORT",
        help="serve Prometheus metrics at http://ADDR:PORT/metrics (default off; ADDR "
        "defaults to 127.0.0.1)",
    )
    m.add_argument("--debug", action="store_true", help="verbose daemon log")
    m.add_argument("--quiet", "-q", action="store_true")
    m.set_defaults(func=cmd_mount)

    u = sub.add_parser(
        "umount",
        help="drain pending writes, then unmount",
        description="Commit every pending write to the origin (with progress), then unmount "
        "and stop the daemon. Exit 3 if writes could not be committed (they stay in the "
        "journal for the next mount).",
    )
    u.add_argument("mountpoint", metavar="MOUNTPOINT")
    u.add_argument(
        "--force",
        action="store_true",
        help="unmount even if the daemon does not answer (pending writes stay in the journal)",
    )
    u.add_argument("--timeout", type=positive_seconds, default=7200.0, metavar="SECONDS")
    u.add_argument("--quiet", "-q", action="store_true")
    u.set_defaults(func=cmd_umount)

    s = sub.add_parser(
        "status",
        help="show a mount's state",
        description="Origin, cache, operation counts, pending commits, errors.",
    )
    s.add_argument("mountpoint", metavar="MOUNTPOINT")
    s.add_argument("--json", action="store_true", help="machine-readable output")
    s.set_defaults(func=cmd_status)

    w = sub.add_parser(
        "warm",
        help="prefetch files into the cache",
        description="Fetch whole files (directories recursively) into the mount's cache with "
        "many concurrent fetches; shows progress and a summary.",
    )
    w.add_argument("paths", nargs="+", metavar="PATH")
    w.add_argument(
        "-j", "--jobs", type=positive_int, default=128, help="concurrent fetches (default 128)"
    )
    w.add_argument("--quiet", "-q", action="store_true")
    w.set_defaults(func=cmd_warm)

    f = sub.add_parser(
        "flush",
        help="wait until writes are at the origin",
        description="Return once every write under PATH made before the call is committed "
        "at the origin. Exit 1 naming the files that cannot be committed.",
    )
    f.add_argument("path", metavar="PATH")
    f.add_argument("--timeout", type=positive_seconds, default=None, metavar="SECONDS")
    f.add_argument("--quiet", "-q", action="store_true")
    f.set_defaults(func=cmd_flush)
    register_catalog(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(_join_negative_values(argv))
    try:
        return int(args.func(args))
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
