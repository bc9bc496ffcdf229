"""Who may do what through the control socket (pure: no trio, no daemon state).

Every request is authorised by the caller's credentials taken from the socket itself
(``SO_PEERCRED`` and ``SO_PEERGROUPS``), never from anything the caller says:

* ``unmount`` (and anything else that changes the daemon) — root or the mount's owner;
* ``warm`` / ``prefetch`` — paths inside the mount the caller may *read* through it;
* ``flush`` — paths inside the mount the caller may *write* through it;
* ``status`` — counters to anyone, file names (errors, conflicts) only to root or the owner.

"May read/write" is decided by the rules the kernel applies to the mount
(``default_permissions``): the mode bits of every object on the way, against the owner and
group the mount reports for every object (the mount's owner), with the caller's uid, gid and
supplementary groups. Paths are resolved inside the mount's tree only: a request path is
relative to the mountpoint, and ``..``, absolute paths, NUL bytes and symbolic links on the
way are refused (see :func:`normalize` and :func:`check_path`).
"""

from __future__ import annotations

import collections
import errno
import logging
import socket
import struct
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from airfs.core.attrs import Owner
from airfs.origin.base import Kind

log = logging.getLogger(__name__)

R, W, X = 4, 2, 1

#: Linux's ``SO_PEERGROUPS`` (not exported by the ``socket`` module on every Python).
SO_PEERGROUPS = getattr(socket, "SO_PEERGROUPS", 59)


@dataclass(frozen=True, slots=True)
class Peer:
    """The process at the other end of a control connection."""

    uid: int
    gid: int
    pid: int
    groups: frozenset[int] = frozenset()

    def in_group(self, gid: int) -> bool:
        return gid == self.gid or gid in self.groups


def peer_groups(sock: Any) -> frozenset[int] | None:
    """The peer's supplementary groups as the kernel recorded them at ``connect``, or None
    where ``SO_PEERGROUPS`` is not available."""
    size = 256
    while size <= 65536:
        try:
            raw = sock.getsockopt(socket.SOL_SOCKET, SO_PEERGROUPS, 4 * size)
        except OSError as exc:
            if exc.errno == errno.ERANGE:
                size *= 16
                continue
            return None
        n = len(raw) // 4
        return frozenset(struct.unpack(f"{n}I", raw[: 4 * n]))
    return None


def _proc_groups(pid: int) -> frozenset[int]:
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Groups:"):
                    return frozenset(int(g) for g in line.split()[1:])
    except (OSError, ValueError):
        pass
    return frozenset()


def peer_caller(sock: Any) -> Peer:
    """The credentials of a connected Unix socket's peer (``SO_PEERCRED``). Raises
    ``OSError`` when the kernel cannot say (then nothing is authorised)."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", raw)
    groups = peer_groups(sock)
    if groups is None:  # older kernels: read them now (the pid is still connected to us)
        groups = _proc_groups(pid)
    return Peer(uid=uid, gid=gid, pid=pid, groups=groups)


class Denied(PermissionError):
    """A request the caller may not make; ``errno`` is EACCES or EPERM."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(code, message)


def may(caller: Peer, mode: int, owner_uid: int, owner_gid: int, want: int, is_dir: bool) -> bool:
    """Whether ``caller`` has every access in ``want`` (``R|W|X`` bits) on an object with
    permission bits ``mode`` owned by ``owner_uid:owner_gid``, by the kernel's rules: root may
    read and write anything and search any directory, and execute a file only if some ``x``
    bit is set; everyone else gets the owner, the group or the other class (the first that
    matches, even if a later one would give more)."""
    if caller.uid == 0:
        return not (want & X and not is_dir and not mode & 0o111)
    if caller.uid == owner_uid:
        bits = (mode >> 6) & 7
    elif caller.in_group(owner_gid):
        bits = (mode >> 3) & 7
    else:
        bits = mode & 7
    return bits & want == want


def normalize(path: Any) -> str:
    """A request path as a mount-relative path (``""`` is the mount's root).

    Refused with :class:`Denied` (EPERM): anything that is not a string, NUL bytes, absolute
    paths and ``..`` components (a path never leaves the mount's tree); ``.`` and empty
    components are dropped."""
    if not isinstance(path, str):
        raise Denied(errno.EPERM, f"path {path!r} is not a string")
    if "\0" in path:
        raise Denied(errno.EPERM, "path contains a NUL byte")
    if path.startswith("/"):
        raise Denied(errno.EPERM, f"{path}: absolute paths are not accepted (send it relative)")
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise Denied(errno.EPERM, f"{path}: '..' would leave the mount")
    return "/".join(parts)


#: what the daemon says about a mount-relative path: (kind, permission bits) as the mount
#: shows it, with its owner's uid and gid where the mount reports one per object (else the
#: mount's owner applies), or None when it does not exist
Lookup = Callable[[str], Awaitable[tuple[Kind, int] | tuple[Kind, int, int, int] | None]]


async def check_path(
    caller: Peer, path: str, want: int, owner: Owner, lookup: Lookup
) -> tuple[Kind, int]:
    """Authorise ``want`` (``R`` or ``W``) on the normalised mount-relative ``path``.

    Every directory on the way must be a directory (a symbolic link is refused: the client
    resolves links before sending, so a link here could only point out of the tree) that
    the caller may search; the object itself needs ``want`` (a directory also needs search,
    to be walked). Raises :class:`Denied` (EACCES) or ``FileNotFoundError``. Returns the
    object's kind and mode."""
    parts = path.split("/") if path else []
    cur = ""
    for i in range(len(parts) + 1):
        found = await lookup(cur)
        if found is None:
            raise FileNotFoundError(errno.ENOENT, f"{cur or '/'}: no such file or directory")
        kind, mode = found[0], found[1]
        ouid, ogid = (found[2], found[3]) if len(found) == 4 else (owner.uid, owner.gid)
        last = i == len(parts)
        if kind is Kind.SYMLINK:
            raise Denied(errno.EACCES, f"{cur}: a symbolic link inside a request path")
        if not last:
            if kind is not Kind.DIR:
                raise FileNotFoundError(errno.ENOTDIR, f"{cur}: not a directory")
            if not may(caller, mode, ouid, ogid, X, True):
                raise Denied(errno.EACCES, f"{path}: permission denied")
            cur = f"{cur}/{parts[i]}" if cur else parts[i]
            continue
        is_dir = kind is Kind.DIR
        need = want | (X if is_dir else 0)
        if not may(caller, mode, ouid, ogid, need, is_dir):
            raise Denied(errno.EACCES, f"{path or '/'}: permission denied")
        return kind, mode
    raise AssertionError("unreachable")


class ConnectionLimit:
    """At most ``per_uid`` connections open at once per uid (root: ``root``)."""

    def __init__(self, per_uid: int = 16, root: int = 256) -> None:
        self.per_uid = per_uid
        self.root = root
        self.open: collections.Counter[int] = collections.Counter()
        self.refused = 0

    def acquire(self, uid: int) -> bool:
        cap = self.root if uid == 0 else self.per_uid
        if self.open[uid] >= cap:
            self.refused += 1
            return False
        self.open[uid] += 1
        return True

    def release(self, uid: int) -> None:
        self.open[uid] -= 1
        if self.open[uid] <= 0:
            del self.open[uid]


class Denials:
    """Refused requests, counted by operation and logged: one line each, at most one a second
    per uid and operation (a caller cannot flood the log), with the count left out."""

    def __init__(self, log_interval: float = 1.0) -> None:
        self.by_op: collections.Counter[str] = collections.Counter()
        self.log_interval = log_interval
        self._logged: dict[tuple[int, str], tuple[float, int]] = {}

    def record(self, caller: Peer, op: str, reason: str) -> None:
        self.by_op[op] += 1
        now = time.monotonic()
        last, quiet = self._logged.get((caller.uid, op), (-1e9, 0))
        if now - last < self.log_interval:
            self._logged[(caller.uid, op)] = (last, quiet + 1)
            return
        if len(self._logged) > 4096:
            self._logged.clear()
        self._logged[(caller.uid, op)] = (now, 0)
        more = f" (and {quiet} more not logged)" if quiet else ""
        log.warning(
            "control: denied %s to uid %d (pid %d): %s%s", op, caller.uid, caller.pid, reason, more
        )

    @property
    def total(self) -> int:
        return sum(self.by_op.values())


#: status fields whose text is not a file name (kept for every caller, at any depth)
PUBLIC_TEXT = frozenset({"mountpoint", "origin", "cache_dir", "kind"})


def redact(status: dict[str, Any]) -> dict[str, Any]:
    """The status record as a caller that is neither root nor the owner sees it: numbers,
    booleans and the mount's own names; every other string (errors name files) is dropped
    (``None``) and every list (of failing files, conflicts, ...) becomes empty, with its
    length kept as ``<name>_count``."""

    def walk(obj: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k, v in obj.items():
            if isinstance(v, dict):
                out[k] = walk(v)
            elif isinstance(v, (list, tuple)):
                out[k] = []
                out[f"{k}_count"] = len(v)
            elif isinstance(v, str):
                out[k] = v if k in PUBLIC_TEXT else None
            else:
                out[k] = v
        return out

    return {**walk(status), "redacted": True}
