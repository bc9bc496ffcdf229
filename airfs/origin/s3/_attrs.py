"""Attribute changes on S3: mode, owner and mtime live in an object's user metadata
(:mod:`._meta`), changed by a metadata-replacing copy of the object onto itself; a
directory's in its marker where the server keeps a marker's metadata."""

from __future__ import annotations

from ..base import Conflict, Entry, NotSupported, split
from ._config import BULK_MIN
from ._core import S3Client
from ._meta import Meta
from ._reads import Reads


class Attributes:
    """``set_attrs`` of the S3 origin. No state of its own: it asks ``client`` and
    ``reads``."""

    def __init__(self, client: S3Client, reads: Reads) -> None:
        self.c = client
        self.reads = reads

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
            return self.reads.stat(path)
        meta = self.c.head(path)
        if meta is None:
            entry = self.reads.stat(path)  # NotFound, or a directory
            return self._set_dir_attrs(path, entry, mode, mtime_ns, uid, gid)
        old: Meta = meta["attrs"]
        entry = self.c.file_entry(split(path)[1], meta, old)
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
                f"{self.c.where(path)}: changing the attributes of an object over 5 GiB is not "
                "supported on S3 (it is a copy)"
            )
        raw = self.c.need_raw("changing attributes", path)
        key = self.c.key(path)
        headers = {
            "x-amz-copy-source": self.c.copy_source(path),
            "x-amz-metadata-directive": "REPLACE",
            "x-amz-copy-source-if-match": entry.version,
            **new.headers(),
        }
        try:
            raw.request("PUT", key, self.c.where(path), headers=headers, slow=entry.size > BULK_MIN)
        except Conflict:
            raise Conflict(
                f"{self.c.where(path)}: changed at the origin (version {entry.version} is gone)"
            ) from None
        return self.reads.stat(path)

    def _set_dir_attrs(
        self,
        path: str,
        entry: Entry,
        mode: int | None,
        mtime_ns: int | None,
        uid: int | None,
        gid: int | None,
    ) -> Entry:
        if not self.c.marker_meta_kept() or (mode, mtime_ns, uid, gid) == (None,) * 4:
            return entry
        new = Meta(
            entry.mode if mode is None else mode & 0o7777,
            entry.uid if uid is None else uid,
            entry.gid if gid is None else gid,
            entry.mtime_ns if mtime_ns is None else mtime_ns,
        )
        self.c.put_marker(path, new)
        return self.reads.stat(path)
