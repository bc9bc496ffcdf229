"""The requests part of the S3 origin: the stores, the signing client, the keys, HEADs,
probes and markers every other part asks for, and what this process remembers of objects'
stored attributes.

:class:`S3Client` answers the questions every operation asks: the full key of a path, an
object's metadata (one HEAD, remembered in :class:`KnownAttrs`), whether a path is a
directory (one small listing), a directory's marker and its metadata. It holds no state of
the other parts (the conditional-write probe is :class:`~._writes.Writes`', the
conditional-copy probe :class:`~._link.Links`').
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from typing import Any

import obstore
from obstore.store import S3Store

from ..base import Entry, Kind, NotFound, NotSupported, OriginError, split
from ._config import KNOWN_SAVED_MAX, MODE_CACHE_MAX, PROBE_PREFIX
from ._errors import s3_code, translate
from ._meta import DEFAULT_MODE, Meta, from_headers, http_date_ns, ns_of, parse
from ._raw import RawS3, quote

#: Last-Modified's granularity (1 s) plus a margin for the server's clock
SAME_SECOND_NS = 2_000_000_000


class KnownAttrs:
    """What this origin knows of objects' stored attributes (listings carry none): path ->
    ((ETag, Last-Modified ns), metadata, when read ns), the ``limit`` most recent.
    Last-Modified is part of the token because a metadata-replacing copy keeps the ETag.
    Thread-safe (origin calls run in worker threads)."""

    def __init__(self, limit: int = MODE_CACHE_MAX) -> None:
        self.limit = limit
        self._known: OrderedDict[str, tuple[tuple[str, int], Meta, int]] = OrderedDict()
        self._lock = threading.Lock()
        #: changes so far (what was remembered or forgotten): a saver saves when it moved
        self.changes = 0

    def __len__(self) -> int:
        return len(self._known)

    def __iter__(self) -> Iterator[str]:
        """The paths known (a copy: safe while others change it)."""
        with self._lock:
            return iter(list(self._known))

    def remember(self, path: str, token: tuple[str, int], attrs: Meta) -> None:
        with self._lock:
            self.changes += 1
            self._known[path] = (token, attrs, time.time_ns())
            self._known.move_to_end(path)
            while len(self._known) > self.limit:
                self._known.popitem(last=False)

    def forget(self, path: str) -> None:
        """``path`` is gone (deleted, renamed away): its remembered attributes go too."""
        with self._lock:
            self.changes += 1
            self._known.pop(path, None)

    def dump(self, file: str, origin: str, most: int = KNOWN_SAVED_MAX) -> int:
        """Write the ``most`` most recently seen attributes to ``file`` (JSON, 0600, replaced
        atomically) for :meth:`load` by the next daemon on the same cache dir; returns how
        many. Blocking: call from a worker thread."""
        with self._lock:
            recent = list(self._known.items())[-most:]
        rows = [
            [p, tok[0], tok[1], m.mode, m.uid, m.gid, m.mtime_ns, seen]
            for p, (tok, m, seen) in recent
        ]
        tmp = f"{file}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump({"version": 1, "origin": origin, "known": rows}, f, separators=(",", ":"))
        os.replace(tmp, file)
        return len(rows)

    def load(self, file: str, origin: str) -> int:
        """Add what :meth:`dump` wrote to ``file`` for the same ``origin`` (a missing or
        damaged file, another origin's, or another version's adds nothing); what is known
        already stays. Each entry is trusted only for the exact object state (ETag and
        Last-Modified) it was read in, as when it was first read. Returns how many."""
        try:
            with open(file, encoding="utf-8") as f:
                data = json.load(f)
        except (OSError, ValueError):
            return 0
        if not isinstance(data, dict) or data.get("version") != 1 or data.get("origin") != origin:
            return 0
        rows = data.get("known")
        added = 0
        with self._lock:
            for row in rows if isinstance(rows, list) else ():
                try:
                    p, etag, lm, mode, uid, gid, mtime, seen = row
                    if not (isinstance(p, str) and isinstance(etag, str)):
                        continue
                    ints = (mode, uid, gid, mtime)
                    if not all(v is None or isinstance(v, int) for v in ints):
                        continue
                    token, meta = (etag, int(lm)), Meta(mode, uid, gid, mtime)
                    entry = (token, meta, int(seen))
                except (TypeError, ValueError):
                    continue
                if p not in self._known:
                    self._known[p] = entry
                    self._known.move_to_end(p, last=False)  # older than what was seen here
                    added += 1
            while len(self._known) > self.limit:
                self._known.popitem(last=False)
        return added

    def get(self, path: str, token: tuple[str, int], *, recent: bool = False) -> Meta | None:
        """The stored attributes of ``path`` in the state ``token``, if this origin saw it
        and the token tells every later change apart. Last-Modified has whole seconds and a
        metadata copy keeps the ETag, so what was read within :data:`SAME_SECOND_NS` of the
        Last-Modified it was read with may have changed since under the same token: not
        trusted (a listing HEADs it again, and trusts what it reads later) unless ``recent``
        (the best known, where the alternative is the default)."""
        with self._lock:
            got = self._known.get(path)
        if got is None or got[0] != token:
            return None
        if not recent and got[2] - token[1] < SAME_SECOND_NS:
            return None
        return got[1]


class S3Client:
    """The requests every part of :class:`~airfs.origin.s3.S3Origin` makes (see the package
    docstring for the layout in the bucket). ``store`` serves ordinary requests (the stall
    deadline applies), ``bulk`` uploads and copies of more than ``BULK_MIN`` bytes (their
    answer comes after the body or the copy: they wait up to the overall request limit);
    ``raw`` is the signing client (None without credentials airfs can sign with: what needs
    it raises :class:`NotSupported`). ``default_mode``: the mode of objects that carry none;
    ``list_heads``: listings HEAD the objects not seen yet. Its own state: the known
    attributes, and whether the server keeps a marker's metadata (probed once)."""

    def __init__(
        self,
        store: S3Store,
        *,
        bucket: str,
        prefix: str = "",
        raw: RawS3 | None = None,
        default_mode: int = DEFAULT_MODE,
        list_heads: bool = True,
        bulk: S3Store | None = None,
    ) -> None:
        self.store = store
        self.bulk = store if bulk is None else bulk
        self.default_mode = default_mode & 0o7777
        self.list_heads = list_heads
        self.known = KnownAttrs()
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.url = f"s3://{bucket}/{self.prefix}" if self.prefix else f"s3://{bucket}"
        self.raw = raw
        self._marker_meta: bool | None = None
        self._probe_lock = threading.Lock()
        #: HEADs of objects made so far (``counters()``)
        self.heads = 0
        self._count_lock = threading.Lock()
        self._dir_mtime_ns = time.time_ns()

    # -- helpers -------------------------------------------------------------------------

    def where(self, path: str) -> str:
        return f"{self.url}/{path}" if path else self.url

    def key(self, path: str) -> str:
        """The full object key of ``path`` (prefix included)."""
        return f"{self.prefix}/{path}" if self.prefix else path

    @staticmethod
    def token(meta: Mapping[str, Any]) -> tuple[str, int]:
        """What identifies one stored state of an object (content and metadata)."""
        return meta.get("e_tag") or "", ns_of(meta.get("last_modified"))

    def file_entry(self, name: str, meta: Mapping[str, Any], attrs: Meta) -> Entry:
        """The entry of an object from its listing or HEAD (``meta``) and stored ``attrs``."""
        mtime_ns = attrs.mtime_ns
        if mtime_ns is None:
            mtime_ns = ns_of(meta.get("last_modified")) or time.time_ns()
        return Entry(
            name=name,
            kind=Kind.FILE,
            size=int(meta["size"]),
            mtime_ns=mtime_ns,
            mode=self.default_mode if attrs.mode is None else attrs.mode,
            version=meta.get("e_tag") or "",
            uid=attrs.uid,
            gid=attrs.gid,
        )

    def dir_entry(self, name: str, attrs: Meta | None = None, mtime_ns: int = 0) -> Entry:
        """A directory: its marker's attributes where the server keeps them, else 0o755, no
        owner; its time the one kept in the marker's metadata, else ``mtime_ns`` (the stable
        time of :meth:`probe_time` or the marker's Last-Modified), else (nothing under it,
        or a listing made without HEADs) the time the origin was opened."""
        a = attrs or Meta()
        return Entry(
            name,
            Kind.DIR,
            0,
            a.mtime_ns or mtime_ns or self._dir_mtime_ns,
            0o755 if a.mode is None else a.mode,
            "",
            uid=a.uid,
            gid=a.gid,
            nlink=2,
        )

    def head(self, path: str) -> Mapping[str, Any] | None:
        """The object's metadata (obstore's, with ``attrs``: the stored :class:`Meta`), or
        None if there is no object ``path``. Remembered for listings."""
        with self._count_lock:
            self.heads += 1
        try:
            res = obstore.get(self.store, path, options={"head": True})
        except Exception as exc:
            err = translate(exc, self.where(path))
            if isinstance(err, NotFound) and s3_code(exc) != "NoSuchBucket":
                return None
            raise err from None
        attrs = parse(res.attributes)
        self.known.remember(path, self.token(res.meta), attrs)
        return {**res.meta, "attrs": attrs}

    def copy_source(self, path: str) -> str:
        """The ``x-amz-copy-source`` header naming the object ``path``."""
        return f"/{quote(self.bucket, safe='')}/{quote(self.key(path), safe='/~')}"

    def need_raw(self, what: str, path: str) -> RawS3:
        if self.raw is None:
            raise NotSupported(
                f"{self.where(path)}: {what} needs credentials airfs can sign with "
                "(AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, a profile, or boto3 installed)"
            )
        return self.raw

    def probe(self, path: str) -> tuple[bool, bool]:
        """(marker exists, something else is under ``path/``) with one small listing."""
        marker, children, _ = self.probe_time(path)
        return marker, children

    def probe_time(self, path: str) -> tuple[bool, bool, int]:
        """:meth:`probe` with the directory's stable time: the Last-Modified of the first
        key under ``path/`` (its marker where it has one: ``path/`` sorts first), 0 if none.
        The root's skips the hidden probe markers."""
        where = self.where(path)
        key = self.key(path)
        if self.raw is not None:
            marker = key + "/" if key else ""
            hidden = marker + PROBE_PREFIX
            keys = [
                (k, t)
                for k, _, t in self.raw.list_keys(marker, where, max_keys=2)
                if path or not k.startswith(hidden)
            ]
            first_t = keys[0][1] if keys else 0
            return any(k == marker for k, _ in keys), any(k != marker for k, _ in keys), first_t
        try:
            first: list[Mapping[str, Any]] = []
            for chunk in obstore.list(self.store, path or None, chunk_size=2):
                first = [m for m in chunk if path or not m["path"].startswith(PROBE_PREFIX)]
                break
        except Exception as exc:
            raise translate(exc, where) from None
        paths = [m["path"] for m in first]
        first_t = ns_of(first[0].get("last_modified")) if first else 0
        return path in paths, any(p != path for p in paths), first_t

    def is_dir(self, path: str) -> bool:
        if not path:
            return True
        marker, children = self.probe(path)
        return marker or children

    def put_marker(self, path: str, attrs: Meta | None = None) -> None:
        """Write the marker ``path/`` (with ``attrs`` in its metadata, where given)."""
        raw = self.need_raw("creating a directory", path)
        headers = attrs.headers() if attrs is not None else None
        raw.request("PUT", self.key(path) + "/", self.where(path), headers=headers)

    def marker_meta_kept(self) -> bool:
        """Whether the server keeps user metadata on directory markers (AWS S3 and MinIO do;
        SeaweedFS 4.48 stores a marker as a filer directory and drops it). Probed once with a
        hidden marker at the origin's root; False without the signing client."""
        if self._marker_meta is not None:
            return self._marker_meta
        if self.raw is None:
            return False
        with self._probe_lock:
            if self._marker_meta is None:
                path = f"{PROBE_PREFIX}{uuid.uuid4().hex}"
                key, where = self.key(path) + "/", self.where(path)
                try:
                    self.raw.request("PUT", key, where, headers=Meta(mode=0o700).headers())
                    got = self.raw.head(key, where)
                    self._marker_meta = got is not None and from_headers(got).mode == 0o700
                finally:
                    with contextlib.suppress(OriginError):
                        self.raw.request("DELETE", key, where)
        return self._marker_meta

    def dir_meta(self, path: str) -> tuple[Meta, int] | None:
        """(stored attributes, Last-Modified ns) of the marker of directory ``path``, where
        the server keeps markers' metadata and the marker exists; else None."""
        if not path or self.raw is None or not self.marker_meta_kept():
            return None
        got = self.raw.head(self.key(path) + "/", self.where(path))
        if got is None:
            return None
        return from_headers(got), http_date_ns(got.get("last-modified"))

    def delete_marker(self, path: str) -> None:
        raw = self.need_raw("removing a directory", path)
        raw.request("DELETE", self.key(path) + "/", self.where(path))

    def keep_parent(self, path: str) -> None:
        """After ``path`` was removed: if that emptied its parent, write the parent's marker
        so the directory stays (POSIX semantics; implied directories would vanish)."""
        parent = split(path)[0]
        if not parent or self.raw is None:
            return
        marker, children = self.probe(parent)
        if not marker and not children:
            self.put_marker(parent)
