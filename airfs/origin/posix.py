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

import errno
import fcntl
import os
import stat
from collections.abc import Iterable

from .base import (
    Capabilities,
    Entry,
    Exists,
    FsStats,
    IsADir,
    Kind,
    NotFound,
    OriginError,
    PutCancel,
    check_rename_target,
    from_oserror,
    split,
)
from .beneath import open_beneath, parent_of
from .posix_entry import (
    OWNERS_KEPT,
    TMP_PREFIX,
    TYPE_OF,
    chown_fd,
    entry_of,
    lchown_at,
    tmp_tag,
    version_of,
)
from .posix_pins import Pins
from .posix_put import Publisher

__all__ = ["TMP_PREFIX", "PosixOrigin", "tmp_tag", "version_of"]


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
        owners=OWNERS_KEPT,
        atimes=True,
        hard_links=True,
        special_files=True,
        into_reads=True,
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
        tmp = f"{TMP_PREFIX}{tag}-" if tag else TMP_PREFIX
        self._pins = Pins(dir_fd)
        self._publisher = Publisher(dir_fd, tmp, self.stat)
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
        return entry_of(split(path)[1], st)

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
                        out.append(entry_of(de.name, de.stat(follow_symlinks=False)))
                    except FileNotFoundError:
                        continue  # removed while we listed
            return out
        except OSError as exc:
            raise from_oserror(exc, path) from None
        finally:
            os.close(fd)

    def pin(self, path: str, version: str) -> None:
        """Keep ``version`` of ``path`` readable by :meth:`read_range` until :meth:`unpin`,
        even if the path is replaced or removed meanwhile (POSIX keeps an open file's data).
        Raises :class:`Conflict` if ``path`` is no longer that version."""
        self._pins.pin(path, version)

    def unpin(self, path: str, version: str) -> None:
        self._pins.unpin(path, version)

    def read_range(self, path: str, offset: int, size: int, version: str | None = None) -> bytes:
        return self._pins.read_range(path, offset, size, version)

    def read_range_into(
        self, path: str, offset: int, buf: memoryview, version: str | None = None
    ) -> int:
        """See ``Capabilities.into_reads``."""
        return self._pins.read_range_into(path, offset, buf, version)

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
        cancel: PutCancel | None = None,
    ) -> Entry:
        """See :meth:`Origin.put` and :meth:`.posix_put.Publisher.put` (``cancel`` is
        ignored: no ``cancel_puts``; a local copy is short)."""
        return self._publisher.put(
            path, source, if_match, mode=mode, mtime_ns=mtime_ns, uid=uid, gid=gid
        )

    def remove_temporaries(self, dirs: Iterable[str]) -> tuple[str, ...]:
        """See :meth:`.posix_put.Publisher.remove_temporaries`."""
        return self._publisher.remove_temporaries(dirs)

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
                    chown_fd(fd, uid, gid)
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
                lchown_at(d, name, uid, gid)
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
        bits = TYPE_OF.get(kind)
        if bits is None:
            raise OriginError(f"{path}: cannot mknod a {kind.value}", errno.EINVAL)
        try:
            with parent_of(self._fd, path) as (d, name):
                os.mknod(name, bits | 0o600, rdev, dir_fd=d)
                lchown_at(d, name, uid, gid)
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
                lchown_at(d, name, uid, gid)
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
        self._pins.close()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
