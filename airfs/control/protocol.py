"""Where a mount's control socket lives, and how messages are framed.

Location: one socket per mount, named by a hash of the mountpoint, in a directory that only
the mount's owner can write, so that whoever finds it there knows who serves it:

* mounts owned by root: ``/run/airfs/<hash>.sock``; the directory is root's, mode 0755, and
  the socket is 0666, so every local user's tools (``airfs status``, the dataset's prefetch,
  the checkpoint commit barrier) reach it; each request is authorised by the caller's peer
  credentials (:mod:`airfs.control.auth`);
* mounts owned by another user: ``/run/user/<uid>/airfs/`` when the login manager made
  ``/run/user/<uid>`` for that user, else ``/tmp/airfs-<uid>/``; the directory must belong to
  that user and be closed to everyone else (0700), else it is refused, so that another user
  cannot pre-create it to hijack or block the socket.

The location depends only on the mountpoint and the owner's uid (never on environment
variables), so any process can find it; clients read the owner from the mount table
(``user_id=`` of a FUSE mount).

Framing: the client sends one JSON object on one line, ``{"op": NAME, ...args}``. The server
answers with zero or more progress lines ``{"progress": {...}}`` and then exactly one final
line: ``{"ok": true, "result": ...}`` or ``{"ok": false, "error": MESSAGE, "errno": N}``.
A request line is at most :data:`MAX_LINE` bytes and nests arrays and objects at most
:data:`MAX_DEPTH` deep (checked before it is parsed); anything else is answered with a
:class:`BadMessage` (EMSGSIZE for a line too long, EINVAL otherwise).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import socket
import stat
import time
from typing import Any

MOUNT_TYPE = "fuse.airfs"
ROOT_DIR = "/run/airfs"


class SocketDirError(OSError):
    """A socket directory that cannot be trusted (wrong owner, open to others, a link)."""


def runtime_dir(uid: int | None = None) -> str:
    """The directory holding the control sockets of mounts owned by ``uid`` (default: the
    effective uid of this process)."""
    uid = os.geteuid() if uid is None else uid
    if uid == 0:
        return ROOT_DIR
    user_run = f"/run/user/{uid}"
    try:
        st = os.lstat(user_run)
    except OSError:
        st = None
    if st is not None and stat.S_ISDIR(st.st_mode) and st.st_uid == uid:
        return os.path.join(user_run, "airfs")
    return f"/tmp/airfs-{uid}"


def socket_path(mountpoint: str, uid: int | None = None, *, resolve: bool = True) -> str:
    """The control socket of the mount at ``mountpoint`` (any spelling of the path) owned by
    ``uid`` (default: this process's effective uid). ``resolve=False``: ``mountpoint`` is
    already the real path (a daemon taking over a mount nobody serves yet must not look at
    the path: the look-up would wait for its own answer)."""
    real = os.path.realpath(mountpoint) if resolve else mountpoint
    key = hashlib.sha256(real.encode()).hexdigest()[:20]
    return os.path.join(runtime_dir(uid), f"{key}.sock")


def check_dir(path: str, uid: int, mode: int) -> None:
    """Raise :class:`SocketDirError` unless ``path`` is a real directory (not a link) owned by
    ``uid`` that nobody else may write (``mode`` 0755) or enter (``mode`` 0700)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise SocketDirError(errno.ENOENT, f"socket directory {path} does not exist") from None
    if not stat.S_ISDIR(st.st_mode):
        raise SocketDirError(errno.EPERM, f"socket directory {path} is not a directory")
    if st.st_uid != uid:
        raise SocketDirError(
            errno.EPERM, f"socket directory {path} belongs to uid {st.st_uid}, not {uid}"
        )
    allowed = ~mode & 0o777
    if stat.S_IMODE(st.st_mode) & (allowed | 0o7000):
        raise SocketDirError(
            errno.EPERM,
            f"socket directory {path} has mode {stat.S_IMODE(st.st_mode):o} "
            f"(other users could replace the socket; expected {mode:o})",
        )


def prepare_dir(path: str, uid: int) -> None:
    """Create the socket directory of ``uid``'s mounts if needed and check it: root's is
    0755 (the sockets in it are for everyone), another user's 0700. Raises
    :class:`SocketDirError` with a one-line reason when it cannot be trusted."""
    mode = 0o755 if uid == 0 else 0o700
    try:
        os.mkdir(path, mode)
        os.chmod(path, mode)  # mkdir applies the umask
    except FileExistsError:
        pass
    except FileNotFoundError:
        os.makedirs(os.path.dirname(path), 0o755, exist_ok=True)
        os.mkdir(path, mode)
        os.chmod(path, mode)
    check_dir(path, uid, mode)


#: the longest request line (a prefetch of a few hundred thousand paths fits)
MAX_LINE = 8 << 20
#: how deep a request may nest arrays and objects (requests use 3)
MAX_DEPTH = 32

_ESCAPE = re.compile(rb"\\.", re.DOTALL)
_STRING = re.compile(rb'"[^"]*"')
_NOT_BRACKET = bytes(b for b in range(256) if b not in b"[]{}")
_ONE_KIND = bytes.maketrans(b"{}", b"[]")


class BadMessage(ValueError):
    """A request line the server does not parse: the reply's message and errno."""

    def __init__(self, message: str, err: int = errno.EINVAL) -> None:
        super().__init__(message)
        self.errno = err


#: a socket younger than this is never taken for a dead one (a starting daemon binds it a
#: moment before it listens, and refuses connections meanwhile)
DEAD_SOCKET_AGE_S = 60.0


def remove_dead_sockets(directory: str, *, min_age_s: float = DEAD_SOCKET_AGE_S) -> list[str]:
    """Remove the control sockets in ``directory`` that no daemon serves any more (left by a
    daemon killed with SIGKILL): a socket file (``*.sock``, owned by this user) that refuses
    a connection and was last modified over ``min_age_s`` seconds ago. Anything else is
    never touched. Returns the paths removed."""
    removed: list[str] = []
    now = time.time()
    try:
        names = sorted(n for n in os.listdir(directory) if n.endswith(".sock"))
    except OSError:
        return removed
    for name in names:
        path = os.path.join(directory, name)
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if not stat.S_ISSOCK(st.st_mode) or st.st_uid != os.geteuid():
            continue
        if now - st.st_mtime < min_age_s:
            continue
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(1.0)
            try:
                s.connect(path)
                continue  # served
            except ConnectionRefusedError:
                pass
            except OSError:
                continue  # busy, timed out, ...: not known to be dead
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
            removed.append(path)
    return removed


def encode(msg: dict[str, Any]) -> bytes:
    return json.dumps(msg, separators=(",", ":")).encode() + b"\n"


def too_deep(line: bytes, limit: int = MAX_DEPTH) -> bool:
    """Whether the JSON text ``line`` nests arrays and objects more than ``limit`` deep (or
    its brackets do not pair up), found without parsing it: escapes and strings are cut out,
    then the innermost bracket pairs removed ``limit`` times (linear passes; ``[`` and ``{``
    count alike: a mismatch is the parser's to refuse)."""
    if line.count(b"[") + line.count(b"{") <= limit:
        return False
    rest = _STRING.sub(b"", _ESCAPE.sub(b"", line)).translate(_ONE_KIND, _NOT_BRACKET)
    if b"[" * (limit + 1) in rest:
        return True
    for _ in range(limit):  # each pass removes the innermost level
        if not rest:
            return False
        rest = rest.replace(b"[]", b"")
    return bool(rest)


def decode(line: bytes) -> dict[str, Any]:
    """The request object of one line; :class:`BadMessage` when it is too long, nested too
    deep, not JSON or not an object."""
    if len(line) > MAX_LINE:
        raise BadMessage(f"request line longer than {MAX_LINE} bytes", errno.EMSGSIZE)
    if too_deep(line):
        raise BadMessage(f"request nested more than {MAX_DEPTH} levels deep (or unbalanced)")
    try:
        obj = json.loads(line)
    except (ValueError, RecursionError) as exc:
        raise BadMessage(f"request is not JSON: {str(exc)[:100]}") from None
    if not isinstance(obj, dict):
        raise BadMessage("control message is not a JSON object")
    return obj
