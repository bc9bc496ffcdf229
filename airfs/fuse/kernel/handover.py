"""Taking over a live ``/dev/fuse`` connection from a daemon that is gone (killed, crashed,
or retired by ``airfs restart``): read what it recorded (:mod:`.takeover`), rebuild the
core's nodes and handles (:mod:`airfs.core.restore`), release the passthrough backing ids it
registered (the kernel's open files keep their backing file; the ids are its bookkeeping),
start a fresh state log, and ask the kernel to send again what the old daemon read and never
answered (``FUSE_NOTIFY_RESEND``).

Refused (:class:`~.takeover.TakeoverRefused`, one line) when the state is missing, damaged,
of another state version, or negotiated a protocol this code cannot serve: the caller then
clears the mount and mounts again.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from airfs.core.fs import Filesystem
from airfs.core.restore import Restored, SavedNode, SavedOpen, restore

from . import proto
from .negotiate import Negotiated
from .passthrough import close_backing
from .session import Session
from .takeover import KernelState, StateLog, load

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class TakenOver:
    """What a take-over rebuilt: the core's record, the backing ids released, whether the
    kernel accepted the resend request."""

    restored: Restored
    backing_closed: int
    resent: bool


def servable(neg: Negotiated) -> str | None:
    """Why this code cannot serve a connection that negotiated ``neg`` (None: it can)."""
    try:
        minor = int(neg.protocol.split(".")[1])
    except (IndexError, ValueError):
        return f"saved protocol {neg.protocol!r} unreadable"
    if not proto.OLDEST_MINOR <= minor <= proto.KERNEL_MINOR:
        speaks = f"7.{proto.OLDEST_MINOR}..7.{proto.KERNEL_MINOR}"
        return f"the old daemon negotiated FUSE {neg.protocol}, this one speaks {speaks}"
    return None


def read_state(cache_dir: str) -> KernelState:
    """The old daemon's state (raises :class:`TakeoverRefused`)."""
    return load(cache_dir, servable)


async def take_over(
    session: Session, fs: Filesystem, state: KernelState, log_: StateLog
) -> TakenOver:
    """Make ``session`` (not running yet) and ``fs`` (fresh) serve the connection ``state``
    describes; ``log_`` is rewritten from the rebuilt state and records from now on."""
    referenced = {f.ino for f in state.files.values()} | set(state.dirs.values())
    nodes = [
        SavedNode(ino, n.path, n.kind, n.lookups)
        for ino, n in state.nodes.items()
        if n.lookups or ino in referenced
    ]
    opens = [SavedOpen(fh, f.ino, f.flags) for fh, f in state.files.items()]
    opens += [SavedOpen(fh, ino, 0, directory=True) for fh, ino in state.dirs.items()]
    done = await restore(fs, nodes, opens)
    closed = 0
    for backing in sorted({f.backing for f in state.files.values() if f.backing > 0}):
        try:
            close_backing(session.fd, backing)
            closed += 1
        except OSError as exc:
            log.debug("closing backing id %d: %s", backing, exc)
    lost = set(done.lost)
    for fh, f in state.files.items():
        if fh not in lost:
            log_.files[fh] = f.__class__(f.ino, f.flags, 0)
    for fh, ino in state.dirs.items():
        if fh not in lost:
            log_.dirs[fh] = ino
    log_.compact((n.ino, n.path, n.kind, n.lookups) for n in fs.inodes.nodes())
    fs.inodes.log = log_
    session.adopt(state.negotiated)
    resent = session.resend()
    return TakenOver(done, closed, resent)
