"""The namespace: directories (marker objects), renames (copy + delete), attributes."""

from __future__ import annotations

import errno

import obstore

from ..base import (
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
from ._errors import translate
from ._meta import MODE_ATTR
from ._raw import quote
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

    def mkdir(self, path: str, mode: int = 0o755) -> Entry:
        where = self._where(path)
        if not path:
            raise Exists(f"{where}: exists")
        self._parent_must_be_dir(path)
        if self._head(path) is not None or self._is_dir(path):
            raise Exists(f"{where}: exists")
        self._put_marker(path)
        return self._dir_entry(split(path)[1])

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
                obstore.copy(self._store, src, dst)
                obstore.delete(self._store, src)
            except Exception as exc:
                raise translate(exc, self._where(src)) from None
        self._keep_parent(src)

    def _rename_dir(self, src: str, dst: str) -> None:
        """Object by object: copy everything, write the destination marker, then delete the
        sources. Not atomic; a failure midway leaves both trees partly populated (nothing is
        lost: sources are deleted only after every copy succeeded)."""
        raw = self._need_raw("renaming a directory", src)
        full_src = self._key(src) + "/"
        keys = [k for k, _ in raw.list_keys(full_src, self._where(src))]
        strip = len(self.prefix) + 1 if self.prefix else 0
        moved: list[str] = []
        markers: list[str] = []
        try:
            for k in keys:
                rel = k[strip:]  # relative to the origin root
                new = dst + rel[len(src) :]
                if k.endswith("/"):
                    if k != full_src:
                        raw.request("PUT", self._key(new.rstrip("/")) + "/", self._where(new))
                        markers.append(rel.rstrip("/"))
                    continue
                obstore.copy(self._store, rel, new)
                moved.append(rel)
            self._put_marker(dst)
            for i in range(0, len(moved), 1000):
                obstore.delete(self._store, moved[i : i + 1000])
        except Exception as exc:
            raise translate(exc, self._where(src)) from None
        for m in sorted(markers, key=len, reverse=True):
            self._delete_marker(m)
        if full_src in keys:
            self._delete_marker(src)

    def symlink(self, path: str, target: str) -> Entry:
        raise NotSupported(f"{self._where(path)}: symbolic links are not supported on S3 origins")

    def set_attrs(self, path: str, mode: int | None = None, mtime_ns: int | None = None) -> Entry:
        """Store ``mode`` (a copy of the object onto itself with new metadata; the ETag may
        change); ``mtime_ns`` is kept for the resulting version while the process runs (see
        :meth:`_remember_attrs`); directories keep 0o755."""
        entry = self.stat(path)
        if entry.kind is not Kind.FILE:
            return entry
        if mode is not None and entry.mode != mode & 0o7777:
            mode &= 0o7777
            if entry.size > 5 << 30:
                raise NotSupported(
                    f"{self._where(path)}: changing the mode of an object over 5 GiB is not "
                    "supported on S3 (it is a copy)"
                )
            raw = self._need_raw("changing a mode", path)
            key = self._key(path)
            headers = {
                "x-amz-copy-source": "/"
                + quote(self.bucket, safe="")
                + "/"
                + quote(key, safe="/~"),
                "x-amz-metadata-directive": "REPLACE",
                f"x-amz-meta-{MODE_ATTR}": f"{mode:o}",
                # a version the caller did not see is not overwritten
                "x-amz-copy-source-if-match": entry.version,
            }
            raw.request("PUT", key, self._where(path), headers=headers)
            before = self._put_attrs.get(entry.version)
            entry = self.stat(path)
            if before is not None and mtime_ns is None:  # the copy keeps the mtime shown
                self._remember_attrs(entry.version, entry.mode, before[0])
                entry = self.stat(path)
        if mtime_ns is not None:
            self._remember_attrs(entry.version, entry.mode, mtime_ns)
            entry = self.stat(path)
        return entry
