"""FUSE passthrough (Linux 6.9+, ``FUSE_PASSTHROUGH`` at INIT, CAP_SYS_ADMIN): register a
local file with the kernel and get a *backing id* to put in an open reply
(``FOPEN_PASSTHROUGH``); reads, writes and mmap of that open then go to the local file inside
the kernel and never reach the daemon.

The opener looks the id up after the daemon's reply (in its own context), so an id must stay
registered until that open is done with: the session closes it at the handle's RELEASE.
(``ioctl`` is called with a mutable buffer so that it returns the system call's result, the
id.) Which file backs which open is the core's decision (one backing file per inode across
concurrent opens, never mixed with a daemon-served open of the same inode); this module only
speaks the ioctls.
"""

from __future__ import annotations

import fcntl

from . import proto


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
