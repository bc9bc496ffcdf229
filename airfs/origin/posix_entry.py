"""What the POSIX origin reads off a stat result and how it gives files their owner: the
version tag, the entry of a stat result, the names of this node's temporary files."""

from __future__ import annotations

import hashlib
import os
import stat

from .base import Entry, Kind

TMP_PREFIX = ".airfs-tmp-"


def tmp_tag(cache_dir: str) -> str:
    """The tag of the temporary files of the node whose cache dir is ``cache_dir`` (one
    daemon at a time uses a cache dir): 12 hex digits."""
    return hashlib.sha256(os.path.realpath(cache_dir).encode()).hexdigest()[:12]


def version_of(st: os.stat_result) -> str:
    """The version tag of a stat result."""
    return f"{st.st_ino:x}-{st.st_size:x}-{st.st_mtime_ns:x}"


SPECIAL_KINDS = {
    stat.S_IFIFO: Kind.FIFO,
    stat.S_IFSOCK: Kind.SOCKET,
    stat.S_IFCHR: Kind.CHAR,
    stat.S_IFBLK: Kind.BLOCK,
}
TYPE_OF = {kind: bits for bits, kind in SPECIAL_KINDS.items()}

#: the daemon can give files away (it runs as root): the origin keeps owners
OWNERS_KEPT = os.geteuid() == 0


def entry_of(name: str, st: os.stat_result) -> Entry:
    """The entry of ``name`` from its (not followed) stat result."""
    if stat.S_ISDIR(st.st_mode):
        kind, version = Kind.DIR, ""
    elif stat.S_ISLNK(st.st_mode):
        kind, version = Kind.SYMLINK, version_of(st)
    elif stat.S_ISREG(st.st_mode):
        kind, version = Kind.FILE, version_of(st)
    else:
        kind, version = SPECIAL_KINDS.get(stat.S_IFMT(st.st_mode), Kind.FILE), version_of(st)
    special = kind not in (Kind.FILE, Kind.DIR, Kind.SYMLINK)
    return Entry(
        name=name,
        kind=kind,
        size=0 if special else st.st_size,
        mtime_ns=st.st_mtime_ns,
        mode=stat.S_IMODE(st.st_mode),
        version=version,
        uid=st.st_uid if OWNERS_KEPT else None,
        gid=st.st_gid if OWNERS_KEPT else None,
        nlink=st.st_nlink,
        atime_ns=st.st_atime_ns,
        ctime_ns=st.st_ctime_ns,
        rdev=st.st_rdev if kind in (Kind.CHAR, Kind.BLOCK) else 0,
        ino=st.st_ino,
        blocks=st.st_blocks,
    )


def chown_fd(fd: int, uid: int | None, gid: int | None) -> None:
    """Give ``fd`` to ``uid``/``gid`` (None: unchanged) when the daemon can."""
    if OWNERS_KEPT and (uid is not None or gid is not None):
        os.fchown(fd, -1 if uid is None else uid, -1 if gid is None else gid)


def lchown_at(d: int, name: str, uid: int | None, gid: int | None) -> None:
    """Give ``name`` in directory ``d`` itself (a symbolic link is not followed) to
    ``uid``/``gid`` (None: unchanged) when the daemon can."""
    if OWNERS_KEPT and (uid is not None or gid is not None):
        os.chown(
            name,
            -1 if uid is None else uid,
            -1 if gid is None else gid,
            dir_fd=d,
            follow_symlinks=False,
        )
