"""Blocking client of a mount's control socket (used by the CLI and by :mod:`airfs.data`).

Nothing here needs trio; every call opens a connection, sends one request and reads the reply.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import time
from collections.abc import Callable, Iterable
from typing import Any

from .auth import peer_caller
from .protocol import MOUNT_TYPE, decode, encode, socket_path


class ControlError(RuntimeError):
    """The daemon answered with an error, or could not be reached."""

    def __init__(self, message: str, err: int | None = None) -> None:
        super().__init__(message)
        self.errno = err


def _airfs_mounts() -> set[str]:
    out: set[str] = set()
    try:
        with open("/proc/self/mounts", encoding="utf-8") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 3 and parts[2] == MOUNT_TYPE:
                    out.add(parts[1].encode().decode("unicode_escape"))
    except OSError:
        pass
    return out


def mount_owner(mountpoint: str) -> int | None:
    """The uid that owns the airfs mount at ``mountpoint`` (FUSE's ``user_id=`` in the mount
    table), or None if it is not listed."""
    mp = os.path.realpath(mountpoint)
    found = None
    try:
        with open("/proc/self/mountinfo", encoding="utf-8") as f:
            for line in f:
                left, sep, right = line.partition(" - ")
                parts, tail = left.split(), right.split()
                if not sep or len(parts) < 5 or len(tail) < 3 or tail[0] != MOUNT_TYPE:
                    continue
                if parts[4].encode().decode("unicode_escape") != mp:
                    continue
                for opt in tail[2].split(","):
                    if opt.startswith("user_id="):
                        found = int(opt[len("user_id=") :])
    except (OSError, ValueError):
        return None
    return found


def find_mount(path: str) -> str | None:
    """The mountpoint of the airfs mount containing ``path``, or None if it is not on one."""
    mounts = _airfs_mounts()
    if not mounts:
        return None
    p = os.path.realpath(path)
    while True:
        if p in mounts:
            return p
        parent = os.path.dirname(p)
        if parent == p:
            return None
        p = parent


def request(
    mountpoint: str,
    op: str,
    *,
    on_progress: Callable[[dict[str, Any]], None] | None = None,
    timeout: float | None = None,
    **args: Any,
) -> Any:
    """Send ``op`` with ``args`` to the daemon of ``mountpoint``; return its result.

    Progress lines are passed to ``on_progress``. Raises :class:`ControlError` when the daemon
    cannot be reached or answers with an error, ``TimeoutError`` when ``timeout`` seconds
    pass without the result (progress lines do not extend it).
    """
    owner = mount_owner(mountpoint)
    if owner is None:  # not in the mount table (yet): assume it is ours
        owner = os.geteuid()
    path = socket_path(mountpoint, owner)
    deadline = None if timeout is None else time.monotonic() + timeout
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        try:
            s.connect(path)
        except OSError as exc:
            raise ControlError(
                f"cannot reach the airfs daemon of {mountpoint} ({path}): {exc.strerror or exc}",
                exc.errno,
            ) from None
        server = peer_caller(s)
        if server.uid not in (0, owner):
            raise ControlError(
                f"{path} is served by uid {server.uid}, not by the mount's owner (uid {owner}); "
                "refusing to talk to it",
                errno.EPERM,
            )
        # refused before reading (too many connections): the reply is read below
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            s.sendall(encode({"op": op, **args}))
        try:
            return _read_reply(s, op, on_progress, deadline, timeout)
        except (ConnectionResetError, BrokenPipeError):
            pass
        raise ControlError(f"the airfs daemon of {mountpoint} closed the connection")
    finally:
        s.close()


def _read_reply(
    s: socket.socket,
    op: str,
    on_progress: Callable[[dict[str, Any]], None] | None,
    deadline: float | None,
    timeout: float | None,
) -> Any:
    """Read progress lines, then return the result or raise :class:`ControlError`; raises
    ``ConnectionResetError`` when the stream ends without a final line."""
    with s.makefile("rb") as f:
        for line in f:
            msg = decode(line)
            if "progress" in msg:
                if on_progress is not None:
                    on_progress(msg["progress"])
                if deadline is not None:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise TimeoutError(f"{op} did not finish within {timeout}s")
                    s.settimeout(left)
                continue
            if msg.get("ok"):
                return msg.get("result")
            raise ControlError(str(msg.get("error", "unknown error")), msg.get("errno"))
    raise ConnectionResetError(errno.ECONNRESET, "the daemon closed the connection")


def status(mountpoint: str) -> dict[str, Any]:
    """The daemon's status record (see ``airfs status --json``)."""
    result = request(mountpoint, "status")
    assert isinstance(result, dict)
    return result


def rel_paths(mountpoint: str, paths: Iterable[str]) -> list[str]:
    """``paths`` relative to the mount at ``mountpoint`` (what control requests name); a
    path outside it is a :class:`ControlError`."""
    root = os.path.realpath(mountpoint)
    out = []
    for p in paths:
        rp = os.path.realpath(p)
        rel = os.path.relpath(rp, root)
        if rel == ".":
            rel = ""
        if rel.startswith(".."):
            raise ControlError(f"{p}: not under the airfs mount {mountpoint}")
        out.append(rel)
    return out


def warm(
    mountpoint: str,
    paths: Iterable[str],
    jobs: int = 128,
    on_progress: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Fetch whole files (directories recursively) into the mount's cache."""
    result = request(
        mountpoint, "warm", paths=rel_paths(mountpoint, paths), jobs=jobs, on_progress=on_progress
    )
    assert isinstance(result, dict)
    return result


def prefetch(mountpoint: str, paths: Iterable[str]) -> None:
    """Ask the daemon to start fetching ``paths`` in the background; returns at once."""
    request(mountpoint, "prefetch", paths=rel_paths(mountpoint, paths))


def refresh(mountpoint: str, path: str) -> dict[str, Any]:
    """Make the mount ask the origin again about ``path`` and everything under it."""
    result = request(mountpoint, "refresh", path=rel_paths(mountpoint, [path])[0])
    assert isinstance(result, dict)
    return result


def flush(mountpoint: str, path: str | None = None, timeout: float | None = None) -> dict[str, Any]:
    """Return once every write under ``path`` (default: the whole mount) made before the call
    is committed at the origin. Raises :class:`ControlError` if some cannot be committed."""
    rel = rel_paths(mountpoint, [path or mountpoint])[0]
    result = request(mountpoint, "flush", path=rel, timeout=timeout)
    assert isinstance(result, dict)
    return result
