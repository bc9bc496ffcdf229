"""The namespace: directories (marker objects), renames (copy + delete), attributes."""

from __future__ import annotations

import errno
import time

import obstore

from ..base import (
    Conflict,
    Entry,
    Exists,
    Kind,
    NotADir,
    NotEmpty,
    NotFound,
    NotSupported,
    OriginError,
    check_rename_target,
    split,
)
from ._config import BULK_MIN
from ._errors import translate
from ._meta import Meta
from ._reads import Reads


class Tree(Reads):
    """Directories, renames and attribute changes of the S3 origin."""

    def _parent_must_be_dir(self, path: str) -> None:
        parent = split(path)[0]
        if not parent or self._is_dir(parent):
            return
        if self._head(parent) is not None:
            raise NotADir(f"{self._where(parent)}: not a directory")
        raise NotFound(f"{self._where(parent)}: not found")

    def mkdir(
        self, path: str, mode: int = 0o755, *, uid: int | None = None, gid: int | None = None
    ) -> Entry:
        """Write the marker ``path/`` with the mode, owner and time in its metadata (kept
        where the server keeps markers' metadata; elsewhere the directory shows 0o755)."""
        where = self._where(path)
        if not path:
            raise Exists(f"{where}: exists")
        self._parent_must_be_dir(path)
        if self._head(path) is not None or self._is_dir(path):
            raise Exists(f"{where}: exists")
        attrs = Meta(mode & 0o7777, uid, gid, time.time_ns())
        self._put_marker(path, attrs)
        kept = self._marker_meta_kept()
        return self._dir_entry(split(path)[1], attrs if kept else None, attrs.mtime_ns or 0)

    def rmdir(self, path: str) -> None:
        where = self._where(path)
        if not path:
            raise OriginError(f"{where}: cannot remove the root", errno.EBUSY)
        marker, children = self._probe(path)
        if children:
            raise NotEmpty(f"{where}: directory not empty")
        if not marker:
            if self._head(path) is not None:
                raise NotADir(f"{where}: not a directory")
            raise NotFound(f"{where}: not found")
        self._delete_marker(path)
        self._keep_parent(path)

    def rename(self, src: str, dst: str, replace: bool = True) -> None:
        s = self.stat(src)
        if src == dst:
            if not replace:
                raise Exists(f"{self._where(dst)}: exists")
            return
        if not src or not dst:
            raise OriginError(f"{self._where(src)}: cannot rename the root", errno.EBUSY)
        if s.kind is Kind.DIR and (dst + "/").startswith(src + "/"):
            raise OriginError(f"{self._where(dst)}: inside {self._where(src)}", errno.EINVAL)
        self._parent_must_be_dir(dst)
        try:
            d: Entry | None = self.stat(dst)
        except NotFound:
            d = None
        check_rename_target(
            s.kind is Kind.DIR,
            d.kind if d is not None else None,
            replace=replace,
            dst_is_empty=lambda: not self._probe(dst)[1],
            where=self._where(dst),
        )
        if s.kind is Kind.DIR:
            self._rename_dir(src, dst)
        else:
            try:
                obstore.copy(self._bulk, src, dst)
                obstore.delete(self._store, src)
            except Exception as exc:
                raise translate(exc, self._where(src)) from None
            self._forget(src)
        self._keep_parent(src)

    def _rename_dir(self, src: str, dst: str) -> None:
        """Object by object: copy everything, write the destination marker, then delete the
        sources. Not atomic; a failure midway leaves both trees partly populated (nothing is
        lost: sources are deleted only after every copy succeeded)."""
        raw = self._need_raw("renaming a directory", src)
        full_src = self._key(src) + "/"
        keys = [k for k, *_ in raw.list_keys(full_src, self._where(src))]
        strip = len(self.prefix) + 1 if self.prefix else 0
        moved: list[str] = []
        markers: list[str] = []
        keep_meta = self._marker_meta_kept()
        try:
            for k in keys:
                rel = k[strip:]  # relative to the origin root
                new = dst + rel[len(src) :]
                if k.endswith("/"):
                    if k != full_src:
                        got = self._dir_meta(rel.rstrip("/")) if keep_meta else None
                        self._put_marker(new.rstrip("/"), got[0] if got else None)
                        markers.append(rel.rstrip("/"))
                    continue
                obstore.copy(self._bulk, rel, new)  # the metadata is copied
                moved.append(rel)
            top = self._dir_meta(src) if keep_meta else None
            self._put_marker(dst, top[0] if top else None)
            for i in range(0, len(moved), 1000):
                obstore.delete(self._store, moved[i : i + 1000])
        except Exception as exc:
            raise translate(exc, self._where(src)) from None
        for m in sorted(markers, key=len, reverse=True):
            self._delete_marker(m)
        if full_src in keys:
            self._delete_marker(src)

    def symlink(
        self, path: str, target: str, *, uid: int | None = None, gid: int | None = None
    ) -> Entry:
        raise NotSupported(f"{self._where(path)}: symbolic links are not supported on S3 origins")

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
        raise NotSupported(
            f"{self._where(path)}: special files (FIFOs, sockets, devices) are not supported "
            "on S3 origins"
        )

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
        """Store mode, owner and mtime in the object's metadata: a metadata-replacing copy
        of the object onto itself, conditional on the ETag it had (a version the caller did
        not see is never overwritten: :class:`Conflict`; the ETag stays, Last-Modified
        changes). Objects over 5 GiB cannot be copied (:class:`NotSupported`). A directory's
        marker is rewritten with the new metadata where the server keeps it (else nothing
        changes). ``atime_ns`` is not kept (no ``atimes``); ``follow`` does not matter (no
        symlinks)."""
        if not path:
            return self.stat(path)
        meta = self._head(path)
        if meta is None:
            entry = self.stat(path)  # NotFound, or a directory
            return self._set_dir_attrs(path, entry, mode, mtime_ns, uid, gid)
        old: Meta = meta["attrs"]
        entry = self._file_entry(split(path)[1], meta, old)
        new = Meta(
            entry.mode if mode is None else mode & 0o7777,
            old.uid if uid is None else uid,
            old.gid if gid is None else gid,
            entry.mtime_ns if mtime_ns is None else mtime_ns,  # the copy keeps the mtime shown
        )
        if new == Meta(entry.mode, entry.uid, entry.gid, entry.mtime_ns):
            return entry  # nothing changes
        if entry.size > 5 << 30:
            raise NotSupported(
                f"{self._where(path)}: changing the attributes of an object over 5 GiB is not "
                "supported on S3 (it is a copy)"
            )
        raw = self._need_raw("changing attributes", path)
        key = self._key(path)
        headers = {
            "x-amz-copy-source": self._copy_source(path),
            "x-amz-metadata-directive": "REPLACE",
            "x-amz-copy-source-if-match": entry.version,
            **new.headers(),
        }
        try:
            raw.request("PUT", key, self._where(path), headers=headers, slow=entry.size > BULK_MIN)
        except Conflict:
            raise Conflict(
                f"{self._where(path)}: changed at the origin (version {entry.version} is gone)"
            ) from None
        return self.stat(path)

    def _set_dir_attrs(
        self,
        path: str,
        entry: Entry,
        mode: int | None,
        mtime_ns: int | None,
        uid: int | None,
        gid: int | None,
    ) -> Entry:
        if not self._marker_meta_kept() or (mode, mtime_ns, uid, gid) == (None,) * 4:
            return entry
        new = Meta(
            entry.mode if mode is None else mode & 0o7777,
            entry.uid if uid is None else uid,
            entry.gid if gid is None else gid,
            entry.mtime_ns if mtime_ns is None else mtime_ns,
        )
        self._put_marker(path, new)
        return self.stat(path)
