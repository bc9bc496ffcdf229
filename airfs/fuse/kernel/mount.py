"""Mounting and unmounting a FUSE file system without libfuse.

As root: open ``/dev/fuse`` and call ``mount(2)`` (through ctypes) with
``fd=N,rootmode=...,user_id=,group_id=,default_permissions[,allow_other]``. Otherwise: run
``fusermount3`` with ``_FUSE_COMMFD`` naming one end of a socket pair; it mounts and sends the
``/dev/fuse`` descriptor back over that socket (``SCM_RIGHTS``). Unmount with ``umount2`` as
root, ``fusermount3 -u`` otherwise. Errors are :class:`MountFailed` with a one-line message.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import os
import socket
import stat
import subprocess

MS_NOSUID = 2
MS_NODEV = 4
MS_NOATIME = 1024
MNT_DETACH = 2

_libc: ctypes.CDLL | None = None


class MountFailed(Exception):
    """The file system could not be mounted or unmounted (one-line reason)."""


def _c() -> ctypes.CDLL:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    return _libc


def _options(allow_other: bool, extra: list[str]) -> list[str]:
    opts = ["default_permissions", *extra]
    if allow_other:
        opts.append("allow_other")
    return opts


def can_mount_directly() -> bool:
    """Whether mount(2) is ours to call (root, or CAP_SYS_ADMIN)."""
    return has_cap_sys_admin()


def has_cap_sys_admin() -> bool:
    """CAP_SYS_ADMIN in the effective set (needed for mount(2) and for passthrough)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) & (1 << 21))
    except (OSError, ValueError):
        pass
    return os.geteuid() == 0


def mount(
    mountpoint: str,
    *,
    fsname: str,
    subtype: str = "airfs",
    allow_other: bool = False,
    extra: list[str] | None = None,
    via: str | None = None,
) -> int:
    """Mount a FUSE file system on ``mountpoint``; returns the /dev/fuse fd to serve.
    The kernel's INIT waits on that fd: nothing may touch the mountpoint until it is served.
    ``via`` is ``"mount2"`` or ``"fusermount3"``; None: mount(2) when we may, else fusermount3."""
    fsname = fsname.replace(",", "_").replace(" ", "_") or subtype
    opts = _options(allow_other, list(extra or []))
    if via is None:
        via = "mount2" if can_mount_directly() else "fusermount3"
    if via == "mount2":
        return _mount_root(mountpoint, fsname, subtype, opts)
    return _mount_fusermount(mountpoint, fsname, subtype, opts)


def _mount_root(mountpoint: str, fsname: str, subtype: str, opts: list[str]) -> int:
    st = os.stat(mountpoint)
    fd = os.open("/dev/fuse", os.O_RDWR | os.O_CLOEXEC)
    data = ",".join(
        [
            f"fd={fd}",
            f"rootmode={stat.S_IFMT(st.st_mode):o}",
            f"user_id={os.getuid()}",
            f"group_id={os.getgid()}",
            *opts,
        ]
    )
    res = _c().mount(
        fsname.encode(),
        os.fsencode(mountpoint),
        f"fuse.{subtype}".encode(),
        ctypes.c_ulong(MS_NOSUID | MS_NODEV | MS_NOATIME),
        data.encode(),
    )
    if res != 0:
        code = ctypes.get_errno()
        os.close(fd)
        raise MountFailed(f"mount({mountpoint}): {os.strerror(code)}")
    return fd


def _mount_fusermount(mountpoint: str, fsname: str, subtype: str, opts: list[str]) -> int:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        env = {**os.environ, "_FUSE_COMMFD": str(theirs.fileno())}
        cmd = [
            "fusermount3",
            "-o",
            ",".join([f"fsname={fsname}", f"subtype={subtype}", *opts]),
            "--",
            mountpoint,
        ]
        try:
            p = subprocess.Popen(
                cmd,
                env=env,
                pass_fds=(theirs.fileno(),),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )
        except OSError as exc:
            raise MountFailed(f"cannot run fusermount3: {exc.strerror}") from None
        theirs.close()
        try:
            _, fds, _, _ = socket.recv_fds(ours, 16, 1)
        except OSError:
            fds = []
        _, err = p.communicate(timeout=60)
        if not fds:
            msg = err.decode(errors="replace").strip().splitlines()
            raise MountFailed(msg[-1] if msg else f"fusermount3 exited with {p.returncode}")
        fd = fds[0]
        os.set_inheritable(fd, False)
        return fd
    finally:
        ours.close()
        with contextlib.suppress(OSError):
            theirs.close()


def unmount(mountpoint: str, *, lazy: bool = True, via: str | None = None) -> None:
    """Unmount (detached when ``lazy``: busy files keep working until closed). A mountpoint
    that is no longer mounted is not an error. ``via`` as for :func:`mount`."""
    if via is None:
        via = "mount2" if can_mount_directly() else "fusermount3"
    if via == "mount2":
        res = _c().umount2(os.fsencode(mountpoint), MNT_DETACH if lazy else 0)
        if res != 0:
            code = ctypes.get_errno()
            if code in (errno.EINVAL, errno.ENOENT):  # not mounted (any more)
                return
            raise MountFailed(f"umount({mountpoint}): {os.strerror(code)}")
        return
    cmd = ["fusermount3", "-u", *(["-z"] if lazy else []), "--", mountpoint]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0 and "not mounted" not in p.stderr and "not found" not in p.stderr:
        raise MountFailed(p.stderr.strip().splitlines()[-1] if p.stderr.strip() else "unmount")
