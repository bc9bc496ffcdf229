"""The namespace: directories (marker objects), renames (copy + delete)."""

from __future__ import annotations

import errno
import time

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
from ._core import S3Client
from ._errors import translate
from ._meta import Meta
from ._reads import Reads


class Tree:
    """Directories (marker objects), renames (copy + delete), and the special files S3
    cannot keep. No state of its own: it asks ``client`` and ``reads``."""

    def __init__(self, client: S3Client, reads: Reads) -> None:
        self.c = client
        self.reads = reads

    def parent_must_be_dir(self, path: str) -> None:
        parent = split(path)[0]
        if not parent or self.c.is_dir(parent):
            return
        if self.c.head(parent) is not None:
            raise NotADir(f"{self.c.where(parent)}: not a directory")
        raise NotFound(f"{self.c.where(parent)}: not found")

    def mkdir(
        self, path: str, mode: int = 0o755, *, uid: int | None = None, gid: int | None = None
    ) -> Entry:
        """Write the marker ``path/`` with the mode, owner and time in its metadata (kept
        where the server keeps markers' metadata; elsewhere the directory shows 0o755)."""
        where = self.c.where(path)
        if not path:
            raise Exists(f"{where}: exists")
        self.parent_must_be_dir(path)
        if self.c.head(path) is not None or self.c.is_dir(path):
            raise Exists(f"{where}: exists")
        attrs = Meta(mode & 0o7777, uid, gid, time.time_ns())
        self.c.put_marker(path, attrs)
        kept = self.c.marker_meta_kept()
        return self.c.dir_entry(split(path)[1], attrs if kept else None, attrs.mtime_ns or 0)

    def rmdir(self, path: str) -> None:
        where = self.c.where(path)
        if not path:
            raise OriginError(f"{where}: cannot remove the root", errno.EBUSY)
        marker, children = self.c.probe(path)
        if children:
            raise NotEmpty(f"{where}: directory not empty")
        if not marker:
            if self.c.head(path) is not None:
                raise NotADir(f"{where}: not a directory")
            raise NotFound(f"{where}: not found")
        self.c.delete_marker(path)
        self.c.keep_parent(path)

    def rename(self, src: str, dst: str, replace: bool = True) -> None:
        s = self.reads.stat(src)
        if src == dst:
            if not replace:
                raise Exists(f"{self.c.where(dst)}: exists")
            return
        if not src or not dst:
            raise OriginError(f"{self.c.where(src)}: cannot rename the root", errno.EBUSY)
        if s.kind is Kind.DIR and (dst + "/").startswith(src + "/"):
            raise OriginError(f"{self.c.where(dst)}: inside {self.c.where(src)}", errno.EINVAL)
        self.parent_must_be_dir(dst)
        try:
            d: Entry | None = self.reads.stat(dst)
        except NotFound:
            d = None
        check_rename_target(
            s.kind is Kind.DIR,
            d.kind if d is not None else None,
            replace=replace,
            dst_is_empty=lambda: not self.c.probe(dst)[1],
            where=self.c.where(dst),
        )
        if s.kind is Kind.DIR:
            self._rename_dir(src, dst)
        else:
            try:
                obstore.copy(self.c.bulk, src, dst)
                obstore.delete(self.c.store, src)
            except Exception as exc:
                raise translate(exc, self.c.where(src)) from None
            self.c.known.forget(src)
        self.c.keep_parent(src)

    def _rename_dir(self, src: str, dst: str) -> None:
        """Object by object: copy everything, write the destination marker, then delete the
        sources. Not atomic; a failure midway leaves both trees partly populated (nothing is
        lost: sources are deleted only after every copy succeeded)."""
        raw = self.c.need_raw("renaming a directory", src)
        full_src = self.c.key(src) + "/"
        keys = [k for k, *_ in raw.list_keys(full_src, self.c.where(src))]
        strip = len(self.c.prefix) + 1 if self.c.prefix else 0
        moved: list[str] = []
        markers: list[str] = []
        keep_meta = self.c.marker_meta_kept()
        try:
            for k in keys:
                rel = k[strip:]  # relative to the origin root
                new = dst + rel[len(src) :]
                if k.endswith("/"):
                    if k != full_src:
                        got = self.c.dir_meta(rel.rstrip("/")) if keep_meta else None
                        self.c.put_marker(new.rstrip("/"), got[0] if got else None)
                        markers.append(rel.rstrip("/"))
                    continue
                obstore.copy(self.c.bulk, rel, new)  # the metadata is copied
                moved.append(rel)
            top = self.c.dir_meta(src) if keep_meta else None
            self.c.put_marker(dst, top[0] if top else None)
            for i in range(0, len(moved), 1000):
                obstore.delete(self.c.store, moved[i : i + 1000])
        except Exception as exc:
            raise translate(exc, self.c.where(src)) from None
        for m in sorted(markers, key=len, reverse=True):
            self.c.delete_marker(m)
        if full_src in keys:
            self.c.delete_marker(src)

    def symlink(
        self, path: str, target: str, *, uid: int | None = None, gid: int | None = None
    ) -> Entry:
        raise NotSupported(f"{self.c.where(path)}: symbolic links are not supported on S3 origins")

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
            f"{self.c.where(path)}: special files (FIFOs, sockets, devices) are not supported "
            "on S3 origins"
        )
