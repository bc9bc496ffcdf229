"""Resolving a relative path under a directory descriptor without ever following a symbolic
link and without leaving the directory (``openat2`` with ``RESOLVE_BENEATH |
RESOLVE_NO_SYMLINKS``, Linux 5.6+; elsewhere one ``O_NOFOLLOW`` open per component).

The POSIX origin resolves every path this way, so that a link placed in the middle of a path
(by another tool at the origin, or swapped in between a check and a use) never takes the
daemon, which may run as root, outside the tree or to another file.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
from collections.abc import Iterator

_SYS_OPENAT2 = 437  # the same number on every Linux architecture (generic syscall table)
_RESOLVE_NO_MAGICLINKS = 0x02
_RESOLVE_NO_SYMLINKS = 0x04
_RESOLVE_BENEATH = 0x08
_O_PATH = getattr(os, "O_PATH", 0o10000000)


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


_libc = ctypes.CDLL(None, use_errno=True)
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long
_have_openat2: bool | None = None


def _openat2(dir_fd: int, path: str, flags: int) -> int:
    how = _OpenHow(
        flags | os.O_CLOEXEC, 0, _RESOLVE_BENEATH | _RESOLVE_NO_SYMLINKS | _RESOLVE_NO_MAGICLINKS
    )
    fd = _syscall(
        ctypes.c_long(_SYS_OPENAT2),
        ctypes.c_int(dir_fd),
        ctypes.c_char_p(os.fsencode(path)),
        ctypes.byref(how),
        ctypes.c_size_t(ctypes.sizeof(how)),
    )
    if fd < 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), path)
    return int(fd)


def _walk(dir_fd: int, path: str, flags: int) -> int:
    parts = path.split("/")
    cur = dir_fd
    try:
        for part in parts[:-1]:
            if part in ("", ".", ".."):
                raise OSError(errno.EXDEV, "path leaves the directory", path)
            nxt = os.open(part, _O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=cur)
            if cur != dir_fd:
                os.close(cur)
            cur = nxt
        if parts[-1] == "..":
            raise OSError(errno.EXDEV, "path leaves the directory", path)
        return os.open(parts[-1], flags | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=cur)
    finally:
        if cur != dir_fd:
            os.close(cur)


#: longest path given to one open: origin paths may be longer than PATH_MAX (the user's path
#: is relative to its working directory inside the mount, ours to the origin's root)
_CHUNK = 2048


def open_beneath(dir_fd: int, path: str, flags: int) -> int:
    """Open ``path`` (relative, ``/``-separated) under ``dir_fd`` with ``flags``; no
    component, the last included, may be a symbolic link (ELOOP) and the path may not leave
    ``dir_fd`` (EXDEV). Returns a new descriptor (close-on-exec). A path longer than one
    system call takes is opened a directory run at a time (never ENAMETOOLONG for it)."""
    if len(path) > _CHUNK:
        cut = path.rfind("/", 0, _CHUNK)
        if cut > 0:
            head = open_beneath(dir_fd, path[:cut], _O_PATH | os.O_DIRECTORY)
            try:
                return open_beneath(head, path[cut + 1 :], flags)
            finally:
                os.close(head)
    return _open_one(dir_fd, path, flags)


def _open_one(dir_fd: int, path: str, flags: int) -> int:
    global _have_openat2
    if _have_openat2 is not False:
        try:
            fd = _openat2(dir_fd, path, flags)
            _have_openat2 = True
            return fd
        except OSError as exc:
            if exc.errno not in (errno.ENOSYS, errno.EPERM) or _have_openat2:
                raise
            _have_openat2 = False  # not in this kernel (or refused by a seccomp filter)
    return _walk(dir_fd, path, flags)


@contextlib.contextmanager
def parent_of(dir_fd: int, path: str) -> Iterator[tuple[int, str]]:
    """``(fd of the parent directory, last name)`` of ``path`` under ``dir_fd``, the parent
    resolved by :func:`open_beneath` (``dir_fd`` itself for a top-level name; ``"."`` names
    the root). A symbolic link on the way raises ENOTDIR, as a file there would."""
    parent, _, name = path.rpartition("/")
    if not parent:
        yield dir_fd, name or "."
        return
    try:
        fd = open_beneath(dir_fd, parent, _O_PATH | os.O_DIRECTORY)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise OSError(errno.ENOTDIR, "a symbolic link on the way", path) from None
        raise
    try:
        yield fd, name
    finally:
        os.close(fd)
