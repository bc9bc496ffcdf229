"""Publishing files at the POSIX origin: a put writes a temporary file beside the target
(``.airfs-tmp-<tag>-<random>``, hidden from listings), fsyncs it and renames it over the
target under an exclusive ``flock`` of the directory; a later mount removes the temporaries a
crash left behind (only its own tag's)."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import uuid
from collections.abc import Callable, Iterable

from airfs.util.crashpoint import crash_point
from airfs.util.fileutil import copy_sparse

from .base import Conflict, Entry, IsADir, Kind, NotFound, OriginError, from_oserror
from .beneath import open_beneath
from .posix_entry import TMP_PREFIX, chown_fd, entry_of


class Publisher:
    """Puts and their temporaries under the directory ``dir_fd``. ``tmp`` starts the names
    of this node's temporary files (:data:`TMP_PREFIX` plus the node's tag, or bare
    :data:`TMP_PREFIX` without a tag); ``stat`` is the origin's (the current entry of a
    path, :class:`NotFound` if none)."""

    def __init__(self, dir_fd: int, tmp: str, stat: Callable[[str], Entry]) -> None:
        self.dir_fd = dir_fd
        self.tmp = tmp
        self.stat = stat

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
        tmp = f"{self.tmp}{uuid.uuid4().hex}"
        try:
            d = open_beneath(self.dir_fd, parent or ".", os.O_RDONLY | os.O_DIRECTORY)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                exc = OSError(errno.ENOTDIR, "not a directory (a symbolic link)")
            raise from_oserror(exc, path) from None
        if if_match == "" and os.stat(source).st_size == 0:
            try:
                return self._claim(d, tmp, name, path, mode, mtime_ns, uid, gid)
            finally:
                os.close(d)
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
                    chown_fd(dst, uid, gid)
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
        return entry_of(name, st)

    def _claim(
        self,
        d: int,
        tmp: str,
        name: str,
        path: str,
        mode: int | None,
        mtime_ns: int | None,
        uid: int | None,
        gid: int | None,
    ) -> Entry:
        """An empty file created where nothing is (an ``O_EXCL`` create's claim of its name):
        the temporary gets its final owner, mode and times and is linked to ``name``, which
        fails if anything is there (under the directory's lock, so no put of this node checks
        and renames in between). Nothing to fill, so nothing is ``fsync``ed: a power loss may
        take the empty name back; the file's commit over it then finds it gone and sets the
        file aside as a conflict (never lost). A crash (kill -9) loses nothing: the name is
        in the origin's file system at once."""
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            dst = os.open(tmp, flags, 0o600, dir_fd=d)
            try:
                try:
                    if mtime_ns is not None:
                        os.utime(dst, ns=(mtime_ns, mtime_ns))
                    chown_fd(dst, uid, gid)
                    os.fchmod(dst, (0o644 if mode is None else mode) & 0o7777)
                    fcntl.flock(d, fcntl.LOCK_EX)  # released when d is closed
                    try:
                        os.link(tmp, name, src_dir_fd=d, dst_dir_fd=d, follow_symlinks=False)
                    except FileExistsError:
                        raise Conflict(f"{path}: exists") from None
                finally:
                    with contextlib.suppress(OSError):
                        os.unlink(tmp, dir_fd=d)
                st = os.fstat(dst)  # one name again: its link count and ctime as stat says
            finally:
                os.close(dst)
        except OSError as exc:
            if isinstance(exc, OriginError):
                raise
            raise from_oserror(exc, path) from None
        return entry_of(name, st)

    def remove_temporaries(self, dirs: Iterable[str]) -> tuple[str, ...]:
        """Remove this node's temporary files (its tag, see :func:`tmp_tag`) from the
        directories ``dirs``: left by commits a crash cut short (a running put removes its
        own on failure). Only call it before this node's first put. Other tools' files and
        other nodes' temporaries (another tag, or none) are never touched; a directory that
        is gone or unreadable is skipped. Returns the paths removed."""
        if self.tmp == TMP_PREFIX:
            return ()
        removed: list[str] = []
        for dir_path in dict.fromkeys(dirs):
            try:
                d = open_beneath(self.dir_fd, dir_path or ".", os.O_RDONLY | os.O_DIRECTORY)
            except OSError:
                continue
            try:
                with os.scandir(d) as it:
                    names = [de.name for de in it if de.name.startswith(self.tmp)]
                for name in names:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(name, dir_fd=d)
                        removed.append(f"{dir_path}/{name}" if dir_path else name)
            except OSError:
                continue
            finally:
                os.close(d)
        return tuple(removed)
