"""The daemon's side of a ``--restartable`` mount's hand-over (:mod:`airfs.daemon.holder`):
the cache dir's lock, waited for while the previous daemon lets go of it, and the start of
serving: take the live connection over, or mount (afresh, or after a take-over that was
refused: one line says why) and hand the descriptors to the holder."""

from __future__ import annotations

import fcntl
import logging
import math
import os
import time

from airfs.fuse.kernel.takeover import KernelState, TakeoverRefused
from airfs.fuse.transport import KernelTransport, Transport, TransportError

from .config import MountConfig, MountError
from .holder import Link

log = logging.getLogger("airfs")


def lock_cache_dir(cache_dir: str, wait: float) -> int:
    """The cache dir's lock (one daemon per cache dir); waits up to ``wait`` seconds for a
    daemon that is retiring or dying to let go of it (``math.inf``: a standby, blocking).
    Raises :class:`MountError` when it stays taken."""
    lock_fd = os.open(os.path.join(cache_dir, "lock"), os.O_RDWR | os.O_CREAT, 0o600)
    if wait == math.inf:  # a standby: nothing else to do until it is ours
        fcntl.flock(lock_fd, fcntl.LOCK_EX)
        return lock_fd
    deadline = time.monotonic() + wait
    while True:
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return lock_fd
        except BlockingIOError:
            if time.monotonic() >= deadline:
                os.close(lock_fd)
                raise MountError(
                    f"cache dir {cache_dir} is in use by another airfs mount"
                ) from None
            time.sleep(0.002)


def saved_state(cache_dir: str) -> KernelState | TakeoverRefused:
    """What the previous daemon of a live connection recorded, read once for the whole
    take-over (recovery, then the transport), or why it cannot be used."""
    from airfs.fuse.kernel.handover import read_state

    try:
        return read_state(cache_dir)
    except TakeoverRefused as exc:
        return exc


def paths_open_for_writing(saved: KernelState | TakeoverRefused) -> frozenset[str]:
    """The paths of the files the kernel holds open for writing on the connection
    (none when its state cannot be used: the take-over will be refused). Their staged
    versions are adopted by recovery, not set aside."""
    if isinstance(saved, TakeoverRefused):
        return frozenset()
    paths = set()
    for f in saved.files.values():
        node = saved.nodes.get(f.ino)
        if f.flags & os.O_ACCMODE != os.O_RDONLY and node is not None and node.path:
            paths.add(node.path)
    return frozenset(paths)


async def mount_or_take_over(
    cfg: MountConfig,
    transport: Transport,
    link: Link | None,
    takeover: list[int] | None,
    overlay_fd: int | None,
    saved: KernelState | TakeoverRefused | None = None,
) -> bool:
    """Start serving: take over the live connection ``takeover`` names (its /dev/fuse
    descriptor first), else mount; a fresh mount's descriptors go to the holder. True when
    the connection was taken over (no INIT will come). Raises :class:`MountError`."""
    if takeover is not None:
        assert isinstance(transport, KernelTransport) and link is not None
        t0 = time.monotonic()
        try:
            took = await transport.take_over(takeover[0], cfg.mountpoint, cfg.cache_dir, saved)
        except TakeoverRefused as exc:
            log.warning("cannot take over the mount: %s; clearing it and mounting again", exc)
            # the kernel's handles are lost, the journal is not
            transport.abandon(takeover[0], cfg.mountpoint)
        else:
            r = took.restored
            log.info(
                "took over the mount in %.3fs: %d node(s), %d file and %d directory "
                "handle(s), %d lost; %d backing id(s) released; resend %s",
                time.monotonic() - t0, r.nodes, r.files, r.dirs, len(r.lost),
                took.backing_closed, "asked" if took.resent else "refused",
            )  # fmt: skip
            return True
    try:
        transport.mount(cfg.mountpoint)
    except TransportError as exc:
        raise MountError(str(exc)) from None
    if link is not None:
        assert isinstance(transport, KernelTransport) and transport.fd is not None
        fds = [transport.fd] + ([overlay_fd] if overlay_fd is not None else [])
        link.send("FDS", fds)
    return False
