"""What a daemon taking over a live ``/dev/fuse`` connection needs to know, written as it
changes by the daemon that serves it (kernel transport only).

The kernel keeps, per connection, state that only the daemon that answered can interpret:
the INIT it negotiated (sent once per connection: a new daemon must not wait for it), the
node ids it was given (with its count of lookups on each), the file and directory handles
it opened, the passthrough backing ids it registered. :class:`StateLog` records these in
``<cache dir>/takeover/``:

* ``init.json``: the negotiated parameters (written once at INIT, atomically, fsynced);
* ``log``: an append-only log of fixed-size binary records (node bound to a path / detached
  / dropped, lookups given to the kernel, forgets, opens and releases of files and
  directories). Records are buffered and written (one ``write``) before the reply that makes
  the kernel depend on them: a daemon killed with SIGKILL loses nothing the kernel knows.
  The write is not fsynced: the log only matters while the connection lives, and a power
  loss ends the connection (the journal's rules for closed files are unchanged).
  The log is rewritten compact (:meth:`StateLog.compact`) at take-over and when it grows
  past :data:`COMPACT_BYTES`.

:func:`load` reads both back into a :class:`KernelState`, or raises :class:`TakeoverRefused`
with a one-line reason (missing, damaged, written by another state version): the caller then
falls back to clear-and-remount.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from airfs.origin.base import Kind

from .negotiate import Negotiated

#: the layout of ``init.json`` and ``log``; a reader refuses any other
STATE_VERSION = 1
DIR = "takeover"
INIT_FILE = "init.json"
LOG_FILE = "log"
#: the log is rewritten from the live state once it grows past this
COMPACT_BYTES = 64 << 20

# record: op (u8), a (u64), b (u64), c (i64), length of the path that follows (u32)
REC = struct.Struct("<BQQqI")
NODE, DETACH, DROP, LOOKUP, FORGET, OPEN, RELEASE, OPENDIR, RELEASEDIR = range(1, 10)
KINDS = list(Kind)
MAGIC = b"AIRFS-TAKEOVER-LOG\n"


class TakeoverRefused(Exception):
    """The state left by the previous daemon cannot be used (one-line reason)."""


@dataclass(slots=True)
class NodeState:
    """A node the kernel may name: its path (None: detached), kind, kernel lookup count."""

    path: str | None
    kind: Kind
    lookups: int = 0


@dataclass(frozen=True, slots=True)
class OpenFile:
    """A file handle the kernel holds: its node, the open flags, the passthrough backing
    id given with it (0: none)."""

    ino: int
    flags: int
    backing: int = 0


@dataclass
class KernelState:
    """Everything :func:`load` read back: the negotiated INIT (its :class:`Negotiated`, the
    protocol minor), the nodes, the open files and directories (handle → node)."""

    negotiated: Negotiated
    nodes: dict[int, NodeState] = field(default_factory=dict)
    files: dict[int, OpenFile] = field(default_factory=dict)
    dirs: dict[int, int] = field(default_factory=dict)

    @property
    def minor(self) -> int:
        return int(self.negotiated.protocol.split(".")[1])


def state_dir(cache_dir: str) -> str:
    return os.path.join(cache_dir, DIR)


def _rec(op: int, a: int, b: int = 0, c: int = 0, path: str | None = None) -> bytes:
    raw = os.fsencode(path) if path is not None else b""
    return REC.pack(op, a, b, c, len(raw)) + raw


class StateLog:
    """The writer: buffers records and writes them at :meth:`flush` (called by the session
    before every reply it writes). Trio loop only (the write is a few microseconds: no
    thread hop)."""

    def __init__(self, cache_dir: str) -> None:
        self.dir = state_dir(cache_dir)
        os.makedirs(self.dir, mode=0o700, exist_ok=True)
        self.path = os.path.join(self.dir, LOG_FILE)
        self._fd = -1
        self._buf = bytearray()
        self.size = 0
        self.writes = 0
        #: the open files and directories now (kept to compact the log)
        self.files: dict[int, OpenFile] = {}
        self.dirs: dict[int, int] = {}

    # -- starting ----------------------------------------------------------------------------

    def start(self) -> None:
        """A fresh connection: an empty log (an older one is for a connection now gone)."""
        self._replace(b"")

    def save_init(self, neg: Negotiated) -> None:
        """Record what INIT negotiated (atomically; before the INIT reply goes out)."""
        body = json.dumps({"version": STATE_VERSION, "negotiated": asdict(neg)}).encode()
        tmp = os.path.join(self.dir, INIT_FILE + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, body)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, os.path.join(self.dir, INIT_FILE))

    def compact(self, nodes: Iterable[tuple[int, str | None, Kind, int]]) -> None:
        """Rewrite the log as the state now: ``nodes`` as (ino, path, kind, lookups), plus
        the open files and directories this log holds."""
        out = bytearray()
        for ino, path, kind, lookups in nodes:
            out += _rec(NODE, ino, KINDS.index(kind), 0, path)
            if path is None:
                out += _rec(DETACH, ino)
            if lookups:
                out += _rec(LOOKUP, ino, lookups)
        for fh, f in self.files.items():
            out += _rec(OPEN, fh, f.ino, (f.backing << 32) | (f.flags & 0xFFFFFFFF))
        for fh, ino in self.dirs.items():
            out += _rec(OPENDIR, fh, ino)
        self._buf.clear()
        self._replace(bytes(out))

    def _replace(self, body: bytes) -> None:
        tmp = self.path + ".tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, MAGIC + body)
        except BaseException:
            os.close(fd)
            raise
        os.replace(tmp, self.path)
        if self._fd >= 0:
            os.close(self._fd)
        os.close(fd)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        self.size = len(MAGIC) + len(body)

    def close(self) -> None:
        self.flush()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    # -- records -----------------------------------------------------------------------------

    def flush(self) -> None:
        """Write what is buffered (one ``write``); nothing to do when nothing changed."""
        if not self._buf or self._fd < 0:
            return
        buf = bytes(self._buf)
        self._buf.clear()
        os.write(self._fd, buf)
        self.size += len(buf)
        self.writes += 1

    def bound(self, ino: int, kind: Kind, path: str | None) -> None:
        """Node ``ino`` is at ``path`` now (made, renamed, or None: detached)."""
        if path is None:
            self._buf += _rec(DETACH, ino)
        else:
            self._buf += _rec(NODE, ino, KINDS.index(kind), 0, path)

    def dropped(self, ino: int) -> None:
        self._buf += _rec(DROP, ino)

    def looked_up(self, ino: int) -> None:
        """An entry reply for ``ino`` (the kernel counts one more lookup)."""
        self._buf += _rec(LOOKUP, ino, 1)

    def forgot(self, items: Iterable[tuple[int, int]]) -> None:
        for ino, n in items:
            self._buf += _rec(FORGET, ino, n)

    def opened(self, fh: int, ino: int, flags: int, backing: int | None) -> None:
        f = OpenFile(ino, flags, backing or 0)
        self.files[fh] = f
        self._buf += _rec(OPEN, fh, ino, (f.backing << 32) | (flags & 0xFFFFFFFF))

    def released(self, fh: int) -> None:
        self.files.pop(fh, None)
        self._buf += _rec(RELEASE, fh)

    def opened_dir(self, fh: int, ino: int) -> None:
        self.dirs[fh] = ino
        self._buf += _rec(OPENDIR, fh, ino)

    def released_dir(self, fh: int) -> None:
        self.dirs.pop(fh, None)
        self._buf += _rec(RELEASEDIR, fh)


def _negotiated(raw: dict[str, Any]) -> Negotiated:
    return Negotiated(**raw)


def load(cache_dir: str, supports: Callable[[Negotiated], str | None]) -> KernelState:
    """Read the state the previous daemon left in ``cache_dir``. ``supports(neg)`` is the
    reason this daemon cannot serve the negotiated protocol (None: it can). Raises
    :class:`TakeoverRefused`."""
    d = state_dir(cache_dir)
    try:
        with open(os.path.join(d, INIT_FILE), "rb") as f:
            raw = json.loads(f.read())
    except FileNotFoundError:
        raise TakeoverRefused("no saved INIT (the old daemon never finished INIT)") from None
    except (OSError, ValueError) as exc:
        raise TakeoverRefused(f"saved INIT unreadable: {exc}") from None
    if not isinstance(raw, dict) or raw.get("version") != STATE_VERSION:
        version = raw.get("version") if isinstance(raw, dict) else None
        raise TakeoverRefused(
            f"state version {version!r} written by another airfs (this one reads {STATE_VERSION})"
        )
    try:
        neg = _negotiated(raw["negotiated"])
    except (KeyError, TypeError) as exc:
        raise TakeoverRefused(f"saved INIT damaged: {exc}") from None
    why = supports(neg)
    if why:
        raise TakeoverRefused(why)
    state = KernelState(neg)
    try:
        with open(os.path.join(d, LOG_FILE), "rb") as f:
            data = f.read()
    except OSError as exc:
        raise TakeoverRefused(f"state log unreadable: {exc.strerror or exc}") from None
    if not data.startswith(MAGIC):
        raise TakeoverRefused("state log damaged (no header)")
    replay(memoryview(data)[len(MAGIC) :], state)
    return state


def replay(data: memoryview, state: KernelState) -> None:
    """Apply the log's records to ``state``. A record cut short at the end (a write torn by
    the kill) is ignored: its reply never went out. Raises :class:`TakeoverRefused` for a
    record that makes no sense."""
    off, n = 0, len(data)
    nodes, files, dirs = state.nodes, state.files, state.dirs
    while off + REC.size <= n:
        op, a, b, c, plen = REC.unpack_from(data, off)
        end = off + REC.size + plen
        if end > n:
            break
        path = os.fsdecode(bytes(data[off + REC.size : end])) if op == NODE else None
        off = end
        if op == NODE:
            if b >= len(KINDS):
                raise TakeoverRefused(f"state log damaged (kind {b})")
            node = nodes.get(a)
            if node is None:
                nodes[a] = NodeState(path, KINDS[b])
            else:
                node.path, node.kind = path, KINDS[b]
        elif op == DETACH:
            if a in nodes:
                nodes[a].path = None
        elif op == DROP:
            nodes.pop(a, None)
        elif op == LOOKUP:
            if a in nodes:
                nodes[a].lookups += b
        elif op == FORGET:
            if a in nodes:
                nodes[a].lookups = max(0, nodes[a].lookups - b)
        elif op == OPEN:
            files[a] = OpenFile(b, c & 0xFFFFFFFF, c >> 32)
        elif op == RELEASE:
            files.pop(a, None)
        elif op == OPENDIR:
            dirs[a] = b
        elif op == RELEASEDIR:
            dirs.pop(a, None)
        else:
            raise TakeoverRefused(f"state log damaged (record type {op})")
