"""Writes of objects: single and multipart PUTs, conditional writes (probed once), deletes,
and the clean-up of multipart uploads a killed daemon left behind."""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import threading
import time
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import obstore
import obstore.exceptions as oe

from airfs.util.crashpoint import crash_point

if TYPE_CHECKING:
    from obstore import PutMode, PutResult

from ..base import (
    Conflict,
    Entry,
    InvalidName,
    IsADir,
    NameTooLong,
    NotFound,
    OriginError,
    PutCancel,
    PutCancelled,
    from_oserror,
    split,
)
from ._config import (
    BULK_MIN,
    DEFAULT_PART_SIZE,
    DEFAULT_PUT_CONCURRENCY,
    DEFAULT_SINGLE_PUT_MAX,
    PROBE_PREFIX,
    MiB,
)
from ._core import S3Client
from ._errors import translate
from ._meta import Meta
from ._stoppable import stoppable_multipart

#: how far before a stopped put's start an upload of its key counts as its own (the server's
#: clock against ours)
OWN_UPLOAD_SKEW_S = 2.0


class Writes:
    """The object-writing side of the S3 origin: PUTs (single up to ``single_put_max``, else
    multipart in parts of ``part_size``, ``put_concurrency`` at a time), conditional writes,
    deletes. Its state: whether the server honours conditional writes
    (``conditional_writes``: None probes once, on the first conditional put)."""

    def __init__(
        self,
        client: S3Client,
        *,
        conditional_writes: bool | None = None,
        single_put_max: int = DEFAULT_SINGLE_PUT_MAX,
        part_size: int = DEFAULT_PART_SIZE,
        put_concurrency: int = DEFAULT_PUT_CONCURRENCY,
    ) -> None:
        self.c = client
        self.single_put_max = single_put_max
        self.part_size = part_size
        self.put_concurrency = put_concurrency
        self._conditional = conditional_writes
        self._probe_lock = threading.Lock()

    def conditional_writes(self) -> bool:
        """Whether the server honours ``If-Match``/``If-None-Match`` on PUT (probed once with a
        hidden object at the origin's root unless given at construction)."""
        if self._conditional is not None:
            return self._conditional
        with self._probe_lock:
            if self._conditional is None:
                self._conditional = self._probe_conditional()
        return self._conditional

    def _probe_conditional(self) -> bool:
        """Write a hidden object three times with preconditions that must fail or pass.
        Transient errors propagate (the probe is tried again on the next conditional put);
        anything else (refused headers, no permission at the root) means "emulate"."""
        key = f"{PROBE_PREFIX}{uuid.uuid4().hex}"

        def put(data: bytes, mode: PutMode) -> PutResult:
            return obstore.put(self.c.store, key, data, mode=mode, use_multipart=False)

        try:
            first = put(b"1", "create")
            try:
                put(b"2", "create")
                return False  # If-None-Match: * ignored
            except (oe.AlreadyExistsError, oe.PreconditionError):
                pass
            try:
                put(b"3", {"e_tag": '"airfs-no-such-etag"'})
                return False  # If-Match ignored
            except oe.PreconditionError:
                pass
            put(b"4", {"e_tag": first["e_tag"]})
            return True
        except Exception as exc:
            err = translate(exc, self.c.where(key))
            if err.transient:
                raise err from None
            return False
        finally:
            with contextlib.suppress(Exception):
                obstore.delete(self.c.store, key)

    def _check_precondition(self, path: str, if_match: str) -> None:
        """The HEAD-based emulation of a conditional put (racy; see the module docstring)."""
        meta = self.c.head(path)
        current = "" if meta is None else (meta.get("e_tag") or "")
        if current != if_match:
            what = "exists" if if_match == "" else "changed at the origin since it was opened"
            raise Conflict(f"{self.c.where(path)}: {what}")

    def check_name(self, path: str) -> None:
        """Names S3 (or the server) cannot keep as given: keys over 1,024 bytes, names that
        are not UTF-8, control characters, and ``\\`` (SeaweedFS stores it as ``/``)."""
        try:
            key = self.c.key(path).encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidName(f"{self.c.where(path)!r}: S3 keys must be UTF-8") from None
        if len(key) + 1 > 1024:  # +1: a directory's marker key ends in "/"
            raise NameTooLong(f"{self.c.where(path)[:80]}...: S3 keys are at most 1,024 bytes")
        if "\\" in path or any(ord(c) < 0x20 or c == "\x7f" for c in path):
            raise InvalidName(
                f"{self.c.where(path)!r}: S3 origins cannot keep backslashes or control "
                "characters in names"
            )

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
        """See :meth:`Origin.put`: mode, owner and mtime travel in the object's metadata
        (:mod:`._meta`), so the object never exists without them. ``mode``/``uid``/``gid``
        None keep the replaced object's (the default mode and no owner for a new one);
        ``mtime_ns`` None stores the time of the put. ``cancel`` (``Capabilities.cancel_puts``)
        is checked before the PUT is sent, and between the parts of a multipart upload."""
        where = self.c.where(path)
        if not path:
            raise IsADir(f"{where}: is a directory")
        try:
            size = os.stat(source).st_size
        except OSError as exc:
            raise from_oserror(exc, source) from None
        if self.c.is_dir(path):
            raise IsADir(f"{where}: is a directory")
        if (mode is None or uid is None or gid is None) and if_match != "":
            cur = self.c.head(path)  # (a create-only put replaces nothing: no HEAD)
            old: Meta = cur["attrs"] if cur is not None else Meta()
            uid = old.uid if uid is None else uid
            gid = old.gid if gid is None else gid
            mode = old.mode if mode is None else mode
        if mode is None:
            mode = self.c.default_mode
        attrs = Meta(mode & 0o7777, uid, gid, time.time_ns() if mtime_ns is None else mtime_ns)
        single = size <= self.single_put_max
        cond: PutMode | None = None
        if if_match is not None:
            if single and self.conditional_writes():
                cond = "create" if if_match == "" else {"e_tag": if_match}
            else:
                self._check_precondition(path, if_match)
        try:
            crash_point("put-before-publish")
            etag = self.put_object(path, Path(source), size, attrs, cond, cancel)
            crash_point("put-after-publish")
        except PutCancelled:
            raise
        except Exception as exc:
            err = translate(exc, where)
            if isinstance(err, Conflict) or (isinstance(err, NotFound) and if_match):
                what = "exists" if if_match == "" else "changed at the origin since it was opened"
                raise Conflict(f"{where}: {what}") from None
            raise err from None
        return self._written(path, etag, size, attrs)

    def put_object(
        self,
        path: str,
        body: Path | bytes,
        size: int,
        attrs: Meta,
        cond: PutMode | None,
        cancel: PutCancel | None = None,
    ) -> str:
        """One PUT (up to ``single_put_max``, conditional with ``cond``) or a multipart
        upload (never conditional) of ``body`` with ``attrs``; returns the new ETag. Raises
        obstore's exceptions, and :class:`PutCancelled` when ``cancel`` stopped it (checked
        before a single PUT is sent; a multipart upload of a file is stopped as
        :mod:`._stoppable` says)."""
        if cancel is not None:
            cancel.check(self.c.where(path))
        if size <= self.single_put_max:
            res = obstore.put(
                self.c.store if size <= BULK_MIN else self.c.bulk,
                path,
                body,
                mode=cond,
                use_multipart=False,
                attributes=attrs.attributes(),
            )
        else:
            # S3 allows 10,000 parts: grow the parts of very large files (in whole MiB)
            part = max(self.part_size, -(-size // (9_000 * MiB)) * MiB)
            kw: dict[str, Any] = {
                "chunk_size": part,
                "max_concurrency": self.put_concurrency,
                "attributes": attrs.attributes(),
            }
            if cancel is not None and isinstance(body, Path):
                since = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=OWN_UPLOAD_SKEW_S)
                out = stoppable_multipart(
                    self.c.bulk,
                    path,
                    body,
                    cancel,
                    None if self.c.raw is None else lambda: self._abort_own(path, since),
                    **kw,
                )
                if out is None:
                    raise PutCancelled(f"{self.c.where(path)}: put cancelled")
                res = out  # type: ignore[assignment]
            else:
                res = obstore.put(self.c.bulk, path, body, use_multipart=True, **kw)
        return res.get("e_tag") or ""

    def _written(self, path: str, etag: str, size: int, attrs: Meta) -> Entry:
        """The entry of what this origin just wrote at ``path`` (a HEAD; if the object has
        already changed again, the entry of what was written)."""
        meta = self.c.head(path)
        if meta is not None and (meta.get("e_tag") or "") == etag:
            return self.c.file_entry(split(path)[1], meta, meta["attrs"])
        return self.c.file_entry(
            split(path)[1], {"size": size, "e_tag": etag, "last_modified": None}, attrs
        )

    def delete(self, path: str) -> None:
        where = self.c.where(path)
        if not path:
            raise IsADir(f"{where}: is a directory")
        if self.c.head(path) is None:
            if self.c.is_dir(path):
                raise IsADir(f"{where}: is a directory")
            raise NotFound(f"{where}: not found")
        try:
            obstore.delete(self.c.store, path)
        except Exception as exc:
            raise translate(exc, where) from None
        self.c.known.forget(path)
        self.c.keep_parent(path)

    def abort_stale_uploads(self, older_than_s: float = 3600.0) -> int:
        """Abort the multipart uploads under this origin's prefix started more than
        ``older_than_s`` seconds ago (left behind by a daemon that was killed mid-upload;
        S3 keeps, and bills, their parts forever). Returns how many were aborted. Needs the
        signing client (else 0)."""
        prefix = f"{self.c.prefix}/" if self.c.prefix else ""
        cutoff = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=older_than_s)
        return self._abort(prefix, lambda key, started: started <= cutoff)

    def _abort_own(self, path: str, since: dt.datetime) -> int:
        """Abort the uploads of ``path``'s key started since ``since`` (a stopped put's:
        :mod:`._stoppable`). Another node's upload of the same key started in that window
        (two nodes writing one file at once) is aborted too: its completion then fails and
        that node's commit is retried."""
        key = f"{self.c.prefix}/{path}" if self.c.prefix else path
        return self._abort(key, lambda k, started: k == key and started >= since)

    def _abort(self, prefix: str, which: Callable[[str, dt.datetime], bool]) -> int:
        """Abort the multipart uploads of keys under ``prefix`` that ``which(key, started)``
        chooses; how many. Needs the signing client (else 0)."""
        if self.c.raw is None:
            return 0
        root = ET.fromstring(
            self.c.raw.request("GET", None, self.c.url, {"uploads": "", "prefix": prefix})
        )
        aborted = 0
        for el in root:
            if el.tag.rpartition("}")[2] != "Upload":
                continue
            fields = {f.tag.rpartition("}")[2]: (f.text or "") for f in el}
            key, upload_id = fields.get("Key"), fields.get("UploadId")
            when = fields.get("Initiated", "").replace("Z", "+00:00")
            try:
                started = dt.datetime.fromisoformat(when)
            except ValueError:
                continue
            if not key or not upload_id or not which(key, started):
                continue
            with contextlib.suppress(OriginError):
                self.c.raw.request("DELETE", key, self.c.url, {"uploadId": upload_id})
                aborted += 1
        return aborted
