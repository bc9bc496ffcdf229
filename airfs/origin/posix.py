"""The POSIX-directory origin.

Every call works relative to a directory file descriptor opened once, at construction. That is
what lets airfs overlay a directory *in place*: the daemon opens ``/Volumes`` first, then mounts
on top of it, and keeps serving what was underneath through the descriptor. Paths are resolved
under it without following any symbolic link (:mod:`airfs.origin.beneath`): a link in the
middle of a path is "not a directory", a link is never opened, written or chmod'ed through.

Version tag: ``"<inode>-<size>-<mtime_ns>"`` (hex). :meth:`PosixOrigin.put` writes a temporary
file beside the target (named ``.airfs-tmp-<tag>-<random>``, hidden from listings), fsyncs it
and renames it over the target, so readers of the directory see the old file or the whole new
one. ``<tag>`` names the node (the daemon's cache dir, :func:`tmp_tag`): a temporary left by a
crashed commit is recognised as this node's own and removed by the next mount
(:meth:`PosixOrigin.remove_temporaries`), never another node's, whose commit may be running.
"""

from __future__ import annotations

import builtins
import contextlib
import errno
import fcntl
import hashlib
import os
import stat
import threading
import uuid
from collections.abc import Iterable, Iterator

from airfs.util.crashpoint import crash_point
from airfs.util.fileutil import copy_sparse

from .base import (
    Capabilities,
    Conflict,
    Entry,
    Exists,
    FsStats,
    IsADir,
    Kind,
    NotFound,
    OriginError,
    check_rename_target,
    from_oserror,
    split,
)
from .beneath import open_beneath, parent_of

TMP_PREFIX = ".airfs-tmp-"


def tmp_tag(cache_dir: str) -> str:
    """The tag of the temporary files of the node whose cache dir is ``cache_dir`` (one
    daemon at a time uses a cache dir): 12 hex digits."""
    return hashlib.sha256(os.path.realpath(cache_dir).encode()).hexdigest()[:12]


def version_of(st: os.stat_result) -> str:
    """The version tag of a stat result."""
    return f"{st.st_ino:x}-{st.st_size:x}-{st.st_mtime_ns:x}"


_SPECIAL = {
    stat.S_IFIFO: Kind.FIFO,
    stat.S_IFSOCK: Kind.SOCKET,
    stat.S_IFCHR: Kind.CHAR,
    stat.S_IFBLK: Kind.BLOCK,
}
_TYPE_OF = {kind: bits for bits, kind in _SPECIAL.items()}

#: the daemon can give files away (it runs as root): the origin keeps owners
_ROOT = os.geteuid() == 0


def _entry(name: str, st: os.stat_result) -> Entry:
    if stat.S_ISDIR(st.st_mode):
        kind, version = Kind.DIR, ""
    elif stat.S_ISLNK(st.st_mode):
        kind, version = Kind.SYMLINK, version_of(st)
    elif stat.S_ISREG(st.st_mode):
        kind, version = Kind.FILE, version_of(st)
    else:
        kind, version = _SPECIAL.get(stat.S_IFMT(st.st_mode), Kind.FILE), version_of(st)
    special = kind not in (Kind.FILE, Kind.DIR, Kind.SYMLINK)
    return Entry(
        name=name,
        kind=kind,
        size=0 if special else st.st_size,
        mtime_ns=st.st_mtime_ns,
        mode=stat.S_IMODE(st.st_mode),
        version=version,
        uid=st.st_uid if _ROOT else None,
        gid=st.st_gid if _ROOT else None,
        nlink=st.st_nlink,
        atime_ns=st.st_atime_ns,
        ctime_ns=st.st_ctime_ns,
        rdev=st.st_rdev if kind in (Kind.CHAR, Kind.BLOCK) else 0,
        ino=st.st_ino,
        blocks=st.st_blocks,
    )


def _chown(fd: int, uid: int | None, gid: int | None) -> None:
    """Give ``fd`` to ``uid``/``gid`` (None: unchanged) when the daemon can."""
    if _ROOT and (uid is not None or gid is not None):
        os.fchown(fd, -1 if uid is None else uid, -1 if gid is None else gid)


def _lchown(d: int, name: str, uid: int | None, gid: int | None) -> None:
    """Give ``name`` in directory ``d`` itself (a symbolic link is not followed) to
    ``uid``/``gid`` (None: unchanged) when the daemon can."""
    if _ROOT and (uid is not None or gid is not None):
        os.chown(
            name,
            -1 if uid is None else uid,
            -1 if gid is None else gid,
            dir_fd=d,
            follow_symlinks=False,
        )


class PosixOrigin:
    """An origin backed by a local (or NFS, or any POSIX) directory.

    Conditional puts are checked and renamed into place under an exclusive ``flock`` of the
    target's directory, so two nodes (mounts) sharing the directory never overwrite each
    other's commit silently (on NFS this relies on the server's lock support)."""

    #: owners are kept only when the daemon runs as root (it cannot give files away else)
    capabilities = Capabilities(
        pin=True,
        conditional_put=True,
        symlinks=True,
        modes=True,
        mtimes=True,
        owners=_ROOT,
        atimes=True,
        hard_links=True,
        special_files=True,
    )

    def check_name(self, path: str) -> None:
        return None

    def __init__(self, root: str, *, dir_fd: int | None = None, tag: str = "") -> None:
        """Open ``root`` (or adopt ``dir_fd``, already open on it; the origin then owns it).
        ``tag`` (:func:`tmp_tag`) goes into the names of this node's temporary files; without
        one they are named as before tags (no later mount can tell they were its own).

        Raises :class:`NotFound`, :class:`NotADir` or :class:`PermissionDenied` with a message
        naming ``root`` when it cannot be used.
        """
        self.url = os.path.abspath(root)
        if dir_fd is None:
            try:
                dir_fd = os.open(self.url, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            except OSError as exc:
                raise from_oserror(exc, self.url) from None
        self._fd = dir_fd
        self._tmp = f"{TMP_PREFIX}{tag}-" if tag else TMP_PREFIX
        # (path, version) -> [fd, refs]: files kept open while a reader has them open, so a
        # reader keeps its version even when the path is replaced or removed meanwhile.
        self._pins: dict[tuple[str, str], list[int]] = {}
        self._pin_lock = threading.Lock()
        if not os.access(self._fd_path(), os.R_OK | os.X_OK):
            os.close(self._fd)
            raise from_oserror(OSError(errno.EACCES, "not readable"), self.url)

    def _fd_path(self) -> str:
        return f"/proc/self/fd/{self._fd}"

    @staticmethod
    def _rel(path: str) -> str:
        return path or "."

    # -- reads ---------------------------------------------------------------------------

    def _lstat(self, path: str) -> os.stat_result:
        with parent_of(self._fd, path) as (d, name):
            return os.stat(name, dir_fd=d, follow_symlinks=False)

    def stat(self, path: str) -> Entry:
        try:
            st = self._lstat(path)
        except OSError as exc:
            raise from_oserror(exc, path) from None
        return _entry(split(path)[1], st)

    def list(self, path: str) -> list[Entry]:
        try:
            fd = open_beneath(self._fd, self._rel(path), os.O_RDONLY | os.O_DIRECTORY)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                exc = OSError(errno.ENOTDIR, "not a directory (a symbolic link)")
            raise from_oserror(exc, path) from None
        try:
            out: list[Entry] = []
            with os.scandir(fd) as it:
                for de in it:
                    if de.name.startswith(TMP_PREFIX):
                        continue
                    try:
                        out.append(_entry(de.name, de.stat(follow_symlinks=False)))
                    except FileNotFoundError:
                        continue  # removed while we listed
            return out
        except OSError as exc:
            raise from_oserror(exc, path) from None
        finally:
            os.close(fd)

    @contextlib.contextmanager
    def _open_file(self, path: str, version: str | None) -> Iterator[int]:
        try:
            fd = open_beneath(self._fd, self._rel(path), os.O_RDONLY)
        except OSError as exc:
            raise from_oserror(exc, path) from None
        try:
            st = os.fstat(fd)
            if stat.S_ISDIR(st.st_mode):
                raise IsADir(f"{path}: is a directory")
            if version is not None and version_of(st) != version:
                raise Conflict(f"{path}: changed at the origin (version {version} is gone)")
            yield fd
        finally:
            os.close(fd)

    def pin(self, path: str, version: str) -> None:
        """Keep ``version`` of ``path`` readable by :meth:`read_range` until :meth:`unpin`,
        even if the path is replaced or removed meanwhile (POSIX keeps an open file's data).
        Raises :class:`Conflict` if ``path`` is no longer that version."""
        key = (path, version)
        with self._pin_lock:
            ent = self._pins.get(key)
            if ent is not None:
                ent[1] += 1
                return
        with self._open_file(path, version) as fd:
            dup = os.dup(fd)
        with self._pin_lock:
            ent = self._pins.get(key)
            if ent is not None:
                ent[1] += 1
                os.close(dup)
            else:
                self._pins[key] = [dup, 1]

    def unpin(self, path: str, version: str) -> None:
        self._unref((path, version))

    def _unref(self, key: tuple[str, str]) -> None:
        with self._pin_lock:
            ent = self._pins.get(key)
            if ent is None:
                return
            ent[1] -= 1
            if ent[1] == 0:
                del self._pins[key]
                os.close(ent[0])

    def read_range(self, path: str, offset: int, size: int, version: str | None = None) -> bytes:
        if version is not None:
            key = (path, version)
            with self._pin_lock:
                ent = self._pins.get(key)
                if ent is not None:
                    ent[1] += 1
            if ent is not None:
                try:
                    return os.pread(ent[0], size, offset)
                except OSError as exc:
                    raise from_oserror(exc, path) from None
                finally:
                    self._unref(key)
        with self._open_file(path, version) as fd:
            try:
                return os.pread(fd, size, offset)
            except OSError as exc:
                raise from_oserror(exc, path) from None

    def readlink(self, path: str) -> str:
        try:
            with parent_of(self._fd, path) as (d, name):
                return os.readlink(name, dir_fd=d)
        except OSError as exc:
            raise from_oserror(exc, path) from None

    def statfs(self) -> FsStats:
        sv = os.fstatvfs(self._fd)
        return FsStats(
            block_size=sv.f_frsize or sv.f_bsize,
            total_blocks=sv.f_blocks,
            free_blocks=sv.f_bavail,
            total_files=sv.f_files,
            free_files=sv.f_favail,
        )

    # -- writes --------------------------------------------------------------------------

    def _check_match(self, path: str, if_match: str | None) -> Entry | None:
        """Check a put's precondition; return the current entry if something is there."""
        try:
            cur = self.stat(path)
        except NotFound:
            if if_match:
                raise Conflict(f"{path}: deleted at the origin since it was opened") from None
            return None
        if cur.kind is Kind.DIR:
            raise IsADir(f"{path}: is a directory")
        if if_match is not None and cur.version != if_match:
            what = "exists" if if_match == "" else "changed at the origin since it was opened"
            raise Conflict(f"{path}: {what}")
        return cur

    def put(
        self,
        path: str,
        source: str,
        if_match: str | None = None,
        *,
        mode: int | None = None,
        mtime_ns: int | None = None,
        uid: int | None = None,
        gid: int | None = None,
    ) -> Entry:
        """See :meth:`Origin.put`. The temporary file is created 0600 beside the target (the
        directory resolved without following links), filled and fsynced; then, under an
        exclusive ``flock`` of the directory, the precondition is checked, the file gets its
        final owner and mode and is renamed over ``path``: the name never shows it with
        another mode (``mode`` None keeps a plain file's mode, never a symbolic link's 0o777;
        ``uid``/``gid`` None keep a replaced file's owner).

        The directory's mtime is put back to what it was before the put (or to what was set
        meanwhile): the core reported the directory changed when the file was created, its
        commit is not a second change (nor is the replacement of a file by a new version).
        Its ctime cannot be set, and moves."""
        parent, _, name = path.rpartition("/")
        tmp = f"{self._tmp}{uuid.uuid4().hex}"
        try:
            d = open_beneath(self._fd, parent or ".", os.O_RDONLY | os.O_DIRECTORY)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                exc = OSError(errno.ENOTDIR, "not a directory (a symbolic link)")
            raise from_oserror(exc, path) from None
        try:
            try:
                flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
                # the directory's times before our temporary appeared, and after: under its
                # lock, which a set_attrs of the directory takes too (never in between)
                fcntl.flock(d, fcntl.LOCK_EX)
                try:
                    before = os.fstat(d)
                    dst = os.open(tmp, flags, 0o600, dir_fd=d)
                    made = os.fstat(d).st_mtime_ns
                finally:
                    fcntl.flock(d, fcntl.LOCK_UN)
                try:
                    with open(source, "rb") as src:
                        copy_sparse(src.fileno(), dst)
                    if mtime_ns is not None:
                        os.utime(dst, ns=(mtime_ns, mtime_ns))
                    os.fsync(dst)
                    fcntl.flock(d, fcntl.LOCK_EX)  # released when d is closed
                    cur = self._check_match(path, if_match)
                    keep = cur is not None and cur.kind is Kind.FILE
                    if mode is None:
                        mode = cur.mode if keep and cur is not None else 0o644
                    if keep and cur is not None:
                        uid = cur.uid if uid is None else uid
                        gid = cur.gid if gid is None else gid
                    _chown(dst, uid, gid)
                    os.fchmod(dst, mode & 0o7777)
                    # the directory's times as they were before our temporary appeared, or as
                    # set since (a tool setting them, e.g. cp -a): put back after the rename
                    now = os.fstat(d)
                    times = before if now.st_mtime_ns == made else now
                    crash_point("put-before-publish")
                    os.rename(tmp, name, src_dir_fd=d, dst_dir_fd=d)
                    crash_point("put-after-publish")
                    with contextlib.suppress(OSError):
                        os.utime(d, ns=(times.st_atime_ns, times.st_mtime_ns))
                    st = os.fstat(dst)
                finally:
                    os.close(dst)
            except BaseException as exc:
                with contextlib.suppress(OSError):
                    os.unlink(tmp, dir_fd=d)
                if isinstance(exc, OSError) and not isinstance(exc, OriginError):
                    raise from_oserror(exc, path) from None
                raise
        finally:
            os.close(d)
        return _entry(name, st)

    def remove_temporaries(self, dirs: Iterable[str]) -> tuple[str, ...]:
        """Remove this node's temporary files (its tag, see :func:`tmp_tag`) from the
        directories ``dirs``: left by commits a crash cut short (a running put removes its
        own on failure). Only call it before this node's first put. Other tools' files and
        other nodes' temporaries (another tag, or none) are never touched; a directory that
        is gone or unreadable is skipped. Returns the paths removed."""
        if self._tmp == TMP_PREFIX:
            return ()
        removed: builtins.list[str] = []
        for dir_path in dict.fromkeys(dirs):
            try:
                d = open_beneath(self._fd, dir_path or ".", os.O_RDONLY | os.O_DIRECTORY)
            except OSError:
                continue
            try:
                with os.scandir(d) as it:
                    names = [de.name for de in it if de.name.startswith(self._tmp)]
                for name in names:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(name, dir_fd=d)
                        removed.append(f"{dir_path}/{name}" if dir_path else name)
            except OSError:
                continue
            finally:
                os.close(d)
        return tuple(removed)

    def delete(self, path: str) -> None:
        try:
            with parent_of(self._fd, path) as (d, name):
                os.unlink(name, dir_fd=d)
        except IsADirectoryError:
            raise IsADir(f"{path}: is a directory") from None
        except OSError as exc:
            if exc.errno == errno.EPERM and self._is_dir(path):
                raise IsADir(f"{path}: is a directory") from None
            raise from_oserror(exc, path) from None

    def _is_dir(self, path: str) -> bool:
        try:
            return self.stat(path).kind is Kind.DIR
        except OriginError:
            return False

    def mkdir(
        self, path: str, mode: int = 0o755, *, uid: int | None = None, gid: int | None = None
    ) -> Entry:
        """Create a directory with exactly ``mode`` (not narrowed by the process umask: the
        caller's umask was applied by the kernel already). It is created 0700, given to its
        owner and then widened through its own descriptor (never through a name that could
        be swapped)."""
        try:
            with parent_of(self._fd, path) as (d, name):
                os.mkdir(name, 0o700, dir_fd=d)
                fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=d)
                try:
                    _chown(fd, uid, gid)
                    os.fchmod(fd, mode & 0o7777)
                finally:
                    os.close(fd)
        except OSError as exc:
            raise from_oserror(exc, path) from None
        return self.stat(path)

    def rmdir(self, path: str) -> None:
        try:
            with parent_of(self._fd, path) as (d, name):
                os.rmdir(name, dir_fd=d)
        except OSError as exc:
            if exc.errno == errno.EEXIST:
                exc = OSError(errno.ENOTEMPTY, "directory not empty")
            raise from_oserror(exc, path) from None

    def rename(self, src: str, dst: str, replace: bool = True) -> None:
        try:
            if not replace:
                # link-free check: renameat2(RENAME_NOREPLACE) is not in the os module, so check
                # first; the window is documented (the core serialises its own renames).
                try:
                    self._lstat(dst)
                except FileNotFoundError:
                    pass
                else:
                    raise Exists(f"{dst}: exists")
            s = self._lstat(src)
            try:
                d = self.stat(dst)
            except NotFound:
                d = None
            # a non-empty target directory is refused by rename(2) itself (mapped below)
            check_rename_target(
                stat.S_ISDIR(s.st_mode),
                d.kind if d is not None else None,
                replace=True,
                dst_is_empty=lambda: True,
                where=dst,
            )
            with parent_of(self._fd, src) as (sd, sname), parent_of(self._fd, dst) as (dd, dname):
                os.rename(sname, dname, src_dir_fd=sd, dst_dir_fd=dd)
        except OriginError:
            raise
        except OSError as exc:
            if exc.errno == errno.EEXIST:
                exc = OSError(errno.ENOTEMPTY, "directory not empty")
            raise from_oserror(exc, src) from None

    def symlink(
        self, path: str, target: str, *, uid: int | None = None, gid: int | None = None
    ) -> Entry:
        try:
            with parent_of(self._fd, path) as (d, name):
                os.symlink(target, name, dir_fd=d)
                _lchown(d, name, uid, gid)
        except OSError as exc:
            raise from_oserror(exc, path) from None
        return self.stat(path)

    def link(self, src: str, dst: str) -> Entry:
        """A real hard link (see :meth:`Origin.link`); a symbolic link is linked itself."""
        try:
            with parent_of(self._fd, src) as (sd, sname), parent_of(self._fd, dst) as (dd, dname):
                os.link(sname, dname, src_dir_fd=sd, dst_dir_fd=dd, follow_symlinks=False)
        except OSError as exc:
            raise from_oserror(exc, dst) from None
        return self.stat(dst)

    def mknod(
        self,
        path: str,
        kind: Kind,
        mode: int,
        rdev: int = 0,
        *,
        uid: int | None = None,
        gid: int | None = None,
    ) -> Entry:
        """A real FIFO, socket or device node at the origin, with exactly ``mode``."""
        bits = _TYPE_OF.get(kind)
        if bits is None:
            raise OriginError(f"{path}: cannot mknod a {kind.value}", errno.EINVAL)
        try:
            with parent_of(self._fd, path) as (d, name):
                os.mknod(name, bits | 0o600, rdev, dir_fd=d)
                _lchown(d, name, uid, gid)
                fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=d)
                try:
                    os.chmod(f"/proc/self/fd/{fd}", mode & 0o7777)
                finally:
                    os.close(fd)
        except OSError as exc:
            raise from_oserror(exc, path) from None
        return self.stat(path)

    def set_attrs(
        self,
        path: str,
        mode: int | None = None,
        mtime_ns: int | None = None,
        *,
        uid: int | None = None,
        gid: int | None = None,
        atime_ns: int | None = None,
        follow: bool = True,
    ) -> Entry:
        """Set the owner, mode and/or times of the object at ``path`` itself (a symbolic link
        is never followed: its owner and times are its own; it has no mode of its own). The
        owner is changed before the mode (a chown clears setuid/setgid; the mode asked for
        is then exactly what stays)."""
        try:
            with parent_of(self._fd, path) as (d, name):
                st = os.stat(name, dir_fd=d, follow_symlinks=False)
                link = stat.S_ISLNK(st.st_mode)
                _lchown(d, name, uid, gid)
                if mode is not None and not link:
                    fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=d)
                    try:  # chmod through the very inode looked at (O_PATH: no read needed)
                        os.chmod(f"/proc/self/fd/{fd}", mode & 0o7777)
                    finally:
                        os.close(fd)
                if mtime_ns is not None or atime_ns is not None:
                    times = (
                        st.st_atime_ns if atime_ns is None else atime_ns,
                        st.st_mtime_ns if mtime_ns is None else mtime_ns,
                    )
                    if stat.S_ISDIR(st.st_mode):
                        # under the directory's lock: a put in it puts the directory's times
                        # back after its rename, and must see these
                        fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=d)
                        try:
                            fcntl.flock(fd, fcntl.LOCK_EX)
                            os.utime(fd, ns=times)
                        finally:
                            os.close(fd)
                    else:
                        os.utime(name, ns=times, dir_fd=d, follow_symlinks=False)
        except OSError as exc:
            raise from_oserror(exc, path) from None
        return self.stat(path)

    def close(self) -> None:
        with self._pin_lock:
            for fd, _refs in self._pins.values():
                os.close(fd)
            self._pins.clear()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
