"""The state every part of the S3 origin shares, and the helpers on keys, HEADs and markers.

:class:`S3Base` holds the obstore store, the signing client, what this process remembers of
objects' modes and mtimes, and answers the questions every operation asks: the full key of a
path, an object's metadata (one HEAD), whether a path is a directory (one small listing).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import obstore
from obstore.store import S3Store

from ..base import Entry, Kind, NotFound, NotSupported, split
from ._config import (
    DEFAULT_PART_SIZE,
    DEFAULT_PUT_CONCURRENCY,
    DEFAULT_SINGLE_PUT_MAX,
    MODE_CACHE_MAX,
)
from ._errors import s3_code, translate
from ._meta import DEFAULT_MODE, MODE_ATTR, ns_of, parse_mode
from ._raw import RawS3


class S3Base:
    """Shared state and helpers of :class:`~airfs.origin.s3.S3Origin` (see the package
    docstring for the layout in the bucket)."""

    def __init__(
        self,
        store: S3Store,
        *,
        bucket: str,
        prefix: str = "",
        raw: RawS3 | None = None,
        conditional_writes: bool | None = None,
        single_put_max: int = DEFAULT_SINGLE_PUT_MAX,
        part_size: int = DEFAULT_PART_SIZE,
        put_concurrency: int = DEFAULT_PUT_CONCURRENCY,
        default_mode: int = DEFAULT_MODE,
        list_heads: bool = True,
    ) -> None:
        self._store = store
        self.default_mode = default_mode & 0o7777
        self.list_heads = list_heads
        #: path -> (ETag, mode): what this origin knows of objects' modes
        self._modes: OrderedDict[str, tuple[str, int]] = OrderedDict()
        self._modes_lock = threading.Lock()
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.url = f"s3://{bucket}/{self.prefix}" if self.prefix else f"s3://{bucket}"
        self._raw = raw
        self._put_attrs: dict[str, tuple[int, int]] = {}
        self._attrs_lock = threading.Lock()
        self._conditional = conditional_writes
        self._probe_lock = threading.Lock()
        self.single_put_max = single_put_max
        self.part_size = part_size
        self.put_concurrency = put_concurrency
        self._dir_mtime_ns = time.time_ns()

    # -- helpers -------------------------------------------------------------------------

    def _where(self, path: str) -> str:
        return f"{self.url}/{path}" if path else self.url

    def _key(self, path: str) -> str:
        """The full object key of ``path`` (prefix included)."""
        return f"{self.prefix}/{path}" if self.prefix else path

    def _file_entry(self, name: str, meta: Mapping[str, Any], mode: int) -> Entry:
        etag = meta.get("e_tag") or ""
        seen = self._put_attrs.get(etag)
        mtime_ns = seen[0] if seen else (ns_of(meta.get("last_modified")) or time.time_ns())
        return Entry(
            name=name,
            kind=Kind.FILE,
            size=int(meta["size"]),
            mtime_ns=mtime_ns,
            mode=mode,
            version=etag,
        )

    def _remember(self, path: str, etag: str, mode: int) -> None:
        with self._modes_lock:
            self._modes[path] = (etag, mode)
            self._modes.move_to_end(path)
            while len(self._modes) > MODE_CACHE_MAX:
                self._modes.popitem(last=False)

    def _known_mode(self, path: str, etag: str) -> int | None:
        with self._modes_lock:
            got = self._modes.get(path)
        return got[1] if got is not None and got[0] == etag else None

    def _mode_of(self, path: str, meta: Mapping[str, Any]) -> int:
        """The mode of a HEAD's result (see :meth:`_head`), remembered for listings."""
        mode = meta.get("mode")
        if mode is None:
            mode = self.default_mode
        self._remember(path, meta.get("e_tag") or "", mode)
        return mode

    def _remember_attrs(self, etag: str, mode: int | None, mtime_ns: int | None) -> None:
        """The mtime of an object this process put or touched (S3 keeps none): served for
        that exact version while the process runs, so a file's mtime does not change by
        itself when it is committed. Bounded. (Modes are in the objects' metadata.)"""
        if not etag or (mode is None and mtime_ns is None):
            return
        with self._attrs_lock:
            self._put_attrs[etag] = (
                mtime_ns if mtime_ns is not None else time.time_ns(),
                0o644 if mode is None else mode & 0o7777,
            )
            while len(self._put_attrs) > 100_000:
                self._put_attrs.pop(next(iter(self._put_attrs)))

    def _dir_entry(self, name: str) -> Entry:
        return Entry(name, Kind.DIR, 0, self._dir_mtime_ns, 0o755, "")

    def _head(self, path: str) -> Mapping[str, Any] | None:
        """The object's metadata (with ``mode``: the stored mode, or None if it has none), or
        None if there is no object ``path``."""
        try:
            res = obstore.get(self._store, path, options={"head": True})
            return {**res.meta, "mode": parse_mode(res.attributes.get(MODE_ATTR))}
        except Exception as exc:
            err = translate(exc, self._where(path))
            if isinstance(err, NotFound) and s3_code(exc) != "NoSuchBucket":
                return None
            raise err from None

    def _need_raw(self, what: str, path: str) -> RawS3:
        if self._raw is None:
            raise NotSupported(
                f"{self._where(path)}: {what} needs credentials airfs can sign with "
                "(AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, a profile, or boto3 installed)"
            )
        return self._raw

    def _probe(self, path: str) -> tuple[bool, bool]:
        """(marker exists, something else is under ``path/``) with one small listing."""
        if self._raw is not None:
            marker = self._key(path) + "/"
            keys = [k for k, _ in self._raw.list_keys(marker, self._where(path), max_keys=2)]
            return marker in keys, any(k != marker for k in keys)
        try:
            first: list[Mapping[str, Any]] = []
            for chunk in obstore.list(self._store, path, chunk_size=2):
                first = list(chunk)
                break
        except Exception as exc:
            raise translate(exc, self._where(path)) from None
        paths = [m["path"] for m in first]
        return path in paths, any(p != path for p in paths)

    def _is_dir(self, path: str) -> bool:
        if not path:
            return True
        marker, children = self._probe(path)
        return marker or children

    def _put_marker(self, path: str) -> None:
        raw = self._need_raw("creating a directory", path)
        raw.request("PUT", self._key(path) + "/", self._where(path))

    def _delete_marker(self, path: str) -> None:
        raw = self._need_raw("removing a directory", path)
        raw.request("DELETE", self._key(path) + "/", self._where(path))

    def _keep_parent(self, path: str) -> None:
        """After ``path`` was removed: if that emptied its parent, write the parent's marker
        so the directory stays (POSIX semantics; implied directories would vanish)."""
        parent = split(path)[0]
        if not parent or self._raw is None:
            return
        marker, children = self._probe(parent)
        if not marker and not children:
            self._put_marker(parent)
