"""The mount table and the bind mounts the node plugin makes: ``/proc/self/mountinfo`` parsed
into :class:`MountEntry` records, and ``mount(2)`` / ``umount2(2)`` through libc (errors are
``OSError`` with the kernel's errno).

A read-only bind is two calls, as the kernel wants it: ``MS_BIND`` makes the bind (it ignores
``MS_RDONLY`` there), then ``MS_REMOUNT | MS_BIND | MS_RDONLY`` makes that one mount read-only
(the node's mount stays writable). The remount keeps the source's ``nosuid``/``nodev``/
``noexec``: the kernel refuses to clear a flag it locked, and a bind must not be laxer than
what it shows.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import os
from dataclasses import dataclass

MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_BIND = 4096
MNT_DETACH = 2

_FLAG_OPTIONS = {"nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC}

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.mount.argtypes = [
    ctypes.c_char_p,
    ctypes.c_char_p,
    ctypes.c_char_p,
    ctypes.c_ulong,
    ctypes.c_void_p,
]
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]


@dataclass(frozen=True)
class MountEntry:
    """One line of ``/proc/self/mountinfo``: ``root`` is the path inside the filesystem that
    is mounted at ``mountpoint`` (``/main/default/images`` for a bind of that volume),
    ``device`` its ``major:minor``, ``options`` the per-mount options (``ro``/``rw``, ...),
    ``fstype`` the filesystem type (``fuse.airfs``)."""

    mount_id: int
    device: str
    root: str
    mountpoint: str
    options: frozenset[str]
    fstype: str
    source: str

    @property
    def readonly(self) -> bool:
        return "ro" in self.options


def _unescape(field: str) -> str:
    """mountinfo's octal escapes (``\\040`` for a space) undone."""
    return field.encode().decode("unicode_escape").encode("latin-1").decode(errors="replace")


def mount_table(path: str = "/proc/self/mountinfo") -> list[MountEntry]:
    """This process's mount table, in mount order (a later entry on a mountpoint is on top)."""
    out = []
    with open(path, encoding="utf-8", errors="surrogateescape") as f:
        for line in f:
            head, _, tail = line.partition(" - ")
            a, b = head.split(), tail.split()
            if len(a) < 6 or len(b) < 2:
                continue
            out.append(
                MountEntry(
                    mount_id=int(a[0]),
                    device=a[2],
                    root=_unescape(a[3]),
                    mountpoint=_unescape(a[4]),
                    options=frozenset(a[5].split(",")),
                    fstype=b[0],
                    source=_unescape(b[1]),
                )
            )
    return out


def mount_at(path: str) -> MountEntry | None:
    """The top mount whose mountpoint is ``path`` (made absolute, symlinks resolved), or None
    when ``path`` is not a mountpoint."""
    real = os.path.realpath(path)
    found = None
    for entry in mount_table():
        if entry.mountpoint == real:
            found = entry
    return found


def _check(rc: int, what: str, path: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}", path)


def open_beneath(root: str, names: list[str]) -> int:
    """An ``O_PATH`` descriptor of the directory ``root/names[0]/names[1]/...``, opened one
    name at a time with ``O_NOFOLLOW``: a symbolic link on the way is ``NotADirectoryError``
    (as is a file), a missing name ``FileNotFoundError``. The caller closes it."""
    flags = os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC
    fd = os.open(root, flags)
    try:
        for name in names:
            nfd = os.open(name, flags | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = nfd
    except BaseException:
        os.close(fd)
        raise
    return fd


def bind(source: str, target: str, *, readonly: bool) -> None:
    """Bind-mount the directory ``source`` on ``target``; with ``readonly`` the new mount
    is then made read-only. If that second step fails the bind is undone before raising."""
    _check(_libc.mount(source.encode(), target.encode(), None, MS_BIND, None), "bind", target)
    if not readonly:
        return
    flags = MS_REMOUNT | MS_BIND | MS_RDONLY
    entry = mount_at(target)
    for name, bit in _FLAG_OPTIONS.items():
        if entry is not None and name in entry.options:
            flags |= bit
    rc = _libc.mount(None, target.encode(), None, flags, None)
    if rc != 0:
        err = ctypes.get_errno()
        with contextlib.suppress(OSError):
            unmount(target)
        raise OSError(err, f"remount read-only: {os.strerror(err)}", target)


def unmount(target: str) -> None:
    """Unmount the top mount on ``target``; when it is busy (a process has a file open
    there) it is detached instead (gone from the tree now, freed when the last user goes)."""
    rc = _libc.umount2(target.encode(), 0)
    if rc != 0 and ctypes.get_errno() == errno.EBUSY:
        rc = _libc.umount2(target.encode(), MNT_DETACH)
    _check(rc, "unmount", target)
