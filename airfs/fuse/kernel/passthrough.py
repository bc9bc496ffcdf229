"""FUSE passthrough (Linux 6.9+, ``FUSE_PASSTHROUGH`` at INIT, CAP_SYS_ADMIN): register a
local file with the kernel and get a *backing id* to put in an open reply
(``FOPEN_PASSTHROUGH``); reads, writes and mmap of that open then go to the local file inside
the kernel and never reach the daemon.

The opener looks the id up after the daemon's reply (in its own context), so an id must stay
registered until that open is done with. (``ioctl`` is called with a mutable buffer so that
it returns the system call's result, the id.) Which file backs which open is the core's
decision (:mod:`airfs.core.passthrough`: one backing file per inode across concurrent opens,
never mixed with a daemon-served open of the same inode), and so is the count of the opens
that use a file; this module speaks the ioctls and holds the one thing only the transport can:
the id the kernel gave each registered file (:class:`BackingIds`).
"""

from __future__ import annotations

import fcntl
import logging

from . import proto

log = logging.getLogger(__name__)


def open_backing(dev_fd: int, fd: int) -> int:
    """``FUSE_DEV_IOC_BACKING_OPEN``: the backing id for ``fd`` (raises ``OSError``: EPERM
    without CAP_SYS_ADMIN, EOPNOTSUPP when passthrough was not negotiated, ELOOP when the file
    is itself on a stacked file system too deep)."""
    arg = bytearray(proto.BACKING_MAP.pack(fd, 0, 0))
    return int(fcntl.ioctl(dev_fd, proto.FUSE_DEV_IOC_BACKING_OPEN, arg, True))


def close_backing(dev_fd: int, backing_id: int) -> None:
    """``FUSE_DEV_IOC_BACKING_CLOSE``: forget the id (opens already using it keep working)."""
    arg = bytearray(backing_id.to_bytes(4, "little"))
    fcntl.ioctl(dev_fd, proto.FUSE_DEV_IOC_BACKING_CLOSE, arg, True)


class BackingIds:
    """The kernel-side registry of backing files: the id the kernel gave each file the core
    names by its *key* (:meth:`airfs.core.passthrough.Passthrough.source`). A cache keyed by
    what the core hands out, with no count of its own: a key is registered at the first open
    the core passes through it, reused by the opens that join it, and dropped once the core
    says no open holds it any more (:meth:`~airfs.core.passthrough.Passthrough.holds`).
    Trio loop only."""

    def __init__(self, dev_fd: int) -> None:
        self.dev_fd = dev_fd
        self._ids: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._ids)

    def id_for(self, key: str, fd: int) -> int:
        """The backing id of the file ``key`` (open as ``fd``), registered now if it is not
        yet (raises ``OSError`` when the kernel refuses it)."""
        got = self._ids.get(key)
        if got is None:
            got = self._ids[key] = open_backing(self.dev_fd, fd)
        return got

    def drop(self, key: str) -> None:
        """Forget the id of ``key`` (no open passes through it any more); never raises."""
        got = self._ids.pop(key, None)
        if got is None:
            return
        try:
            close_backing(self.dev_fd, got)
        except OSError as exc:
            log.warning("closing backing id %d: %s", got, exc)
