"""The client side of ``airfs umount``, ``status``, ``warm`` and ``flush``: find the mount a
path is on, ask its daemon over the control socket (:mod:`airfs.control.client`), show progress
on a terminal, and turn the answer into output and an exit code (0; 1 with a one-line reason; 3
when an unmount left writes pending). The status text itself is :mod:`airfs.cli.status`.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import subprocess
import sys
import time
from typing import Any

from airfs.control import client
from airfs.control.protocol import MOUNT_TYPE

from .mount import mounts
from .options import fail
from .status import human, print_status


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
    lost = result.get("conflicts") or []
    if lost and not result.get("pending"):
        kept = "; ".join(f"{c['path']} -> {c['kept']}" for c in lost[:10])
        more = f" (and {len(lost) - 10} more)" if len(lost) > 10 else ""
        return fail(
            f"unmounted {args.mountpoint}, but {len(lost)} write(s) were lost to a conflict "
            f"with another version at the origin (not committed); their bytes are kept: "
            f"{kept}{more}",
            4,
        )
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


def cmd_status(args: argparse.Namespace) -> int:
    mp = _require_mount(args.mountpoint)
    try:
        st = client.status(mp)
    except client.ControlError as exc:
        return fail(str(exc))
    if args.json:
        print(json.dumps(st, indent=2))
        return 0
    print_status(st)
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
        f"warmed {res['files']} files, {human(res['bytes'])} ({human(res['fetched'])} from the "
        f"origin) in {res['seconds']:.2f} s, {res['mib_s']} MiB/s"
    )
    for f in res.get("failures", []):
        print(f"  failed: {f['path']}: {f['error']}", file=sys.stderr)
    return 1 if res.get("failed") else 0


def cmd_refresh(args: argparse.Namespace) -> int:
    mp = _require_mount(args.path)
    try:
        res = client.refresh(mp, args.path)
    except client.ControlError as exc:
        return fail(str(exc))
    print(f"refreshed {args.path}: {res['names']} name(s), {res['listings']} listing(s) forgotten")
    return 0


def cmd_flush(args: argparse.Namespace) -> int:
    mp = _require_mount(args.path)
    try:
        res = client.request(
            mp,
            "flush",
            path=client.rel_paths(mp, [args.path])[0],
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
