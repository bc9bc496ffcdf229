"""The S3 origin: an object that holds its parts, each with its own state and contract, and
exposes the :class:`~airfs.origin.base.Origin` protocol over them; construction from an
``s3://`` URL, the connectivity check, capabilities.

The parts (made once, complete, in :meth:`S3Origin.__init__`):

* ``client`` (:class:`~._core.S3Client`): the stores, the signing client, keys, HEADs,
  probes, directory markers, and what is known of objects' stored attributes;
* ``reads`` (:class:`~._reads.Reads`): stat, listings, ranged GETs;
* ``writes`` (:class:`~._writes.Writes`): PUTs, conditional writes (probed once), deletes,
  the clean-up of multipart uploads;
* ``tree`` (:class:`~._tree.Tree`): directories, renames;
* ``attributes`` (:class:`~._attrs.Attributes`): ``set_attrs`` (metadata copies);
* ``links`` (:class:`~._link.Links`): ``link`` (create-if-absent copies; probed once).
"""

from __future__ import annotations

import datetime as dt
import errno
import os
import urllib.parse
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import obstore
from obstore.store import S3Store

from ..base import Capabilities, NotFound, OriginError, PermissionDenied, Transient
from ._attrs import Attributes
from ._config import (
    CONNECT_TIMEOUT,
    DEFAULT_PART_SIZE,
    DEFAULT_PUT_CONCURRENCY,
    DEFAULT_SINGLE_PUT_MAX,
    DEFAULT_STALL_TIMEOUT,
    DEFAULT_TIMEOUT,
)
from ._core import S3Client
from ._credentials import Credentials, resolve_credentials, resolve_region, truthy
from ._errors import first_line, s3_code, status_of, translate
from ._link import Links
from ._meta import DEFAULT_MODE
from ._raw import RawS3
from ._reads import Reads
from ._tree import Tree
from ._writes import Writes

if TYPE_CHECKING:
    import builtins

    from ..base import Entry, FsStats, Kind, PutCancel


class S3Origin:
    """An origin on an S3-compatible bucket (see the package docstring for the semantics
    and the module docstring for its parts). ``store`` (and ``bulk``, for large uploads and
    copies) are obstore stores on the bucket with the prefix; ``raw`` the signing client."""

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
        bulk: S3Store | None = None,
    ) -> None:
        self.client = c = S3Client(
            store,
            bucket=bucket,
            prefix=prefix,
            raw=raw,
            default_mode=default_mode,
            list_heads=list_heads,
            bulk=bulk,
        )
        self.reads = Reads(c)
        self.writes = Writes(
            c,
            conditional_writes=conditional_writes,
            single_put_max=single_put_max,
            part_size=part_size,
            put_concurrency=put_concurrency,
        )
        self.tree = Tree(c, self.reads)
        self.attributes = Attributes(c, self.reads)
        self.links = Links(c, self.reads, self.writes, self.tree)
        self.bucket = c.bucket
        self.prefix = c.prefix
        self.url = c.url

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        endpoint: str | None = None,
        region: str | None = None,
        path_style: bool | None = None,
        check: bool = True,
        env: Mapping[str, str] | None = None,
        conditional_writes: bool | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        stall_timeout: float = DEFAULT_STALL_TIMEOUT,
        single_put_max: int = DEFAULT_SINGLE_PUT_MAX,
        part_size: int = DEFAULT_PART_SIZE,
        put_concurrency: int = DEFAULT_PUT_CONCURRENCY,
        default_mode: int = DEFAULT_MODE,
        list_heads: bool = True,
    ) -> S3Origin:
        """Open ``s3://BUCKET[/PREFIX]``.

        ``endpoint`` defaults to ``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL`` /
        ``AWS_ENDPOINT`` (none: AWS S3 in ``region``); plain HTTP is allowed only when the
        endpoint is ``http://``. ``region`` defaults to ``AWS_REGION`` /
        ``AWS_DEFAULT_REGION`` / the profile's region / ``us-east-1``. Credentials come from
        the ``AWS_*`` variables, the shared credentials file (``AWS_PROFILE``), boto3 if
        installed, or obstore's own chain (instance metadata, web identity);
        ``AWS_SKIP_SIGNATURE=true`` makes anonymous requests. ``env`` replaces ``os.environ``
        for these lookups. ``path_style`` defaults to True with an explicit endpoint (the
        usual for SeaweedFS/MinIO/Ceph) and to virtual-hosted requests on AWS.

        ``conditional_writes``: None probes the server on the first conditional put;
        True/False asserts it. ``timeout`` is the limit per HTTP request, in seconds;
        ``stall_timeout`` the stall deadline: for the server's first byte and for each next
        read of an answer (a request with no byte for that long raises :class:`Stalled`;
        a slow transfer that keeps moving is not cut); connecting takes at most
        ``min(5, stall_timeout)`` s. Uploads and copies of more than 1 MiB wait for their
        answer up to ``timeout`` (it comes after the body or the copy).
        ``default_mode``: the mode of objects that carry none (written by other tools).
        ``list_heads=False``: listings give objects this origin has not seen yet
        ``default_mode`` instead of asking each one's mode (faster first listings of large
        directories; a private object written by another node then shows the default mode
        until it is stat'ed).

        With ``check``, one cheap listing is made and failures raise a one-line typed error:
        :class:`PermissionDenied` (credentials), :class:`NotFound` (bucket),
        :class:`Transient` (endpoint unreachable).
        """
        env = os.environ if env is None else env
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme not in ("s3", "s3a") or not parsed.netloc:
            raise OriginError(f"{url}: not an s3://BUCKET[/PREFIX] URL", errno.EINVAL)
        bucket, prefix = parsed.netloc, parsed.path.strip("/")
        region = region or resolve_region(env)
        endpoint = (
            endpoint
            or env.get("AWS_ENDPOINT_URL_S3")
            or env.get("AWS_ENDPOINT_URL")
            or env.get("AWS_ENDPOINT")
        )
        if path_style is None:
            path_style = bool(endpoint) or "." in bucket
        if not endpoint:
            endpoint = (
                f"https://s3.{region}.amazonaws.com"
                if path_style
                else f"https://{bucket}.s3.{region}.amazonaws.com"
            )
        endpoint = endpoint.rstrip("/")
        scheme = urllib.parse.urlsplit(endpoint).scheme
        if scheme not in ("http", "https"):
            raise OriginError(f"{endpoint}: the S3 endpoint must be http:// or https://", 22)

        anonymous = truthy(env.get("AWS_SKIP_SIGNATURE"))
        creds = None if anonymous else resolve_credentials(env)
        raw = None
        if creds is not None or anonymous:
            raw = RawS3(
                endpoint,
                bucket,
                path_style=path_style,
                region=region,
                creds=creds,
                timeout=stall_timeout,
                slow_timeout=timeout,
            )

        def make_store(retry: dict[str, Any], client: dict[str, Any]) -> S3Store:
            kwargs: dict[str, Any] = {
                "prefix": prefix or None,
                "config": {
                    "endpoint": endpoint,
                    "region": region,
                    "virtual_hosted_style_request": not path_style,
                    "skip_signature": anonymous,
                },
                "client_options": {"allow_http": scheme == "http", **client},
                "retry_config": retry,
            }
            if creds is not None:
                kwargs["credential_provider"] = creds
            try:
                return S3Store(bucket, **kwargs)
            except Exception as exc:
                raise OriginError(
                    f"s3://{bucket}: bad S3 configuration: {first_line(exc)}"
                ) from None

        # obstore's own retries are off: the one retry policy is AsyncOrigin's (async, outside
        # the origin's concurrency limit)
        no_retries = {
            "max_retries": 0,
            "retry_timeout": dt.timedelta(seconds=min(timeout, 120.0)),
            "backoff": {
                "init_backoff": dt.timedelta(milliseconds=100),
                "max_backoff": dt.timedelta(seconds=5),
            },
        }
        limits: dict[str, Any] = {
            "timeout": dt.timedelta(seconds=timeout),
            "connect_timeout": dt.timedelta(seconds=min(CONNECT_TIMEOUT, stall_timeout)),
        }
        # reqwest's read timeout runs from the request's start (the upload of its body
        # included: measured, writes do not reset it) to the answer's headers, then between
        # reads of the answer: the stall deadline for everything but large uploads and copies
        store = make_store(
            no_retries, {**limits, "read_timeout": dt.timedelta(seconds=stall_timeout)}
        )
        bulk = make_store(no_retries, limits)
        origin = cls(
            store,
            bucket=bucket,
            prefix=prefix,
            raw=raw,
            conditional_writes=conditional_writes,
            single_put_max=single_put_max,
            part_size=part_size,
            put_concurrency=put_concurrency,
            default_mode=default_mode,
            list_heads=list_heads,
            bulk=bulk,
        )
        if check:
            quick = make_store(
                {"max_retries": 1, "retry_timeout": dt.timedelta(seconds=10)},
                {"timeout": "20s", "connect_timeout": "3s", "read_timeout": "10s"},
            )
            origin._check(quick, endpoint, creds)
        return origin

    def _check(self, store: S3Store, endpoint: str, creds: Credentials | None) -> None:
        bucket = f"s3://{self.bucket}"
        try:
            for _ in obstore.list(store, None, chunk_size=1):
                break
        except Exception as exc:
            err = translate(exc, bucket)
            if isinstance(err, PermissionDenied):
                src = f" from {creds.source}" if creds is not None else ""
                why = s3_code(exc) or f"HTTP {status_of(exc) or 403}"
                raise PermissionDenied(
                    f"{bucket}: access denied at {endpoint} with the credentials{src} ({why}; "
                    "check AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY/AWS_PROFILE)"
                ) from None
            if isinstance(err, NotFound):
                raise NotFound(f"{bucket}: no such bucket at {endpoint}") from None
            if err.transient and status_of(exc) is None:
                raise Transient(
                    f"{bucket}: cannot reach the S3 endpoint {endpoint} ({first_line(exc)})"
                ) from None
            raise err from None

    def __repr__(self) -> str:
        return f"S3Origin({self.url!r})"

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(
            pin=False,
            conditional_put=self.conditional_writes(),
            symlinks=False,
            modes=True,
            mtimes=True,
            md5_etag=True,
            owners=True,
            link_copies=True,
            buffer_reads=True,
            into_reads=True,
            whole_reads=True,
            bare_lists=True,
            cancel_puts=True,
        )

    def save_known(self, file: str) -> int:
        """Save what this origin remembers of objects' stored attributes (mode, owner) to
        ``file``, so that the next daemon on the same cache dir lists a directory without a
        HEAD per object it already saw (see :meth:`~._core.KnownAttrs.dump`). Blocking."""
        return self.client.known.dump(file, self.url)

    def load_known(self, file: str) -> int:
        """Remember what :meth:`save_known` saved for this origin
        (:meth:`~._core.KnownAttrs.load`)."""
        return self.client.known.load(file, self.url)

    def close(self) -> None:
        """Close the signing client's kept-alive connections (obstore's pool closes with the
        store when it is collected)."""
        if self.client.raw is not None:
            self.client.raw.close()

    # -- the Origin protocol, answered by the parts ------------------------------------------

    def check_name(self, path: str) -> None:
        self.writes.check_name(path)

    def stat(self, path: str) -> Entry:
        return self.reads.stat(path)

    def counters(self) -> dict[str, int]:
        """Requests counted by kind: ``head``, the HEADs of objects (a listing's too)."""
        return {"head": self.client.heads}

    def list(
        self, path: str, *, attrs: bool = True, heads_max: int | None = None
    ) -> builtins.list[Entry]:
        """See ``Capabilities.bare_lists`` for ``attrs`` and ``heads_max``."""
        return self.reads.list(path, attrs=attrs, heads_max=heads_max)

    def read_range(self, path: str, offset: int, size: int, version: str | None = None) -> bytes:
        return self.reads.read_range(path, offset, size, version)

    def read_range_buffer(
        self, path: str, offset: int, size: int, version: str | None = None
    ) -> memoryview:
        """See ``Capabilities.buffer_reads``."""
        return self.reads.read_range_buffer(path, offset, size, version)

    def read_range_into(
        self, path: str, offset: int, buf: memoryview, version: str | None = None
    ) -> int:
        """See ``Capabilities.into_reads``."""
        return self.reads.read_range_into(path, offset, buf, version)

    def read_small(self, path: str, most: int) -> tuple[Entry, memoryview | None]:
        """See ``Capabilities.whole_reads``."""
        return self.reads.read_small(path, most)

    def readlink(self, path: str) -> str:
        return self.reads.readlink(path)

    def statfs(self) -> FsStats:
        return self.reads.statfs()

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
        return self.writes.put(
            path, source, if_match, mode=mode, mtime_ns=mtime_ns, uid=uid, gid=gid, cancel=cancel
        )

    def delete(self, path: str) -> None:
        self.writes.delete(path)

    def conditional_writes(self) -> bool:
        """See :meth:`.Writes.conditional_writes`."""
        return self.writes.conditional_writes()

    def abort_stale_uploads(self, older_than_s: float = 3600.0) -> int:
        """See :meth:`.Writes.abort_stale_uploads`."""
        return self.writes.abort_stale_uploads(older_than_s)

    def mkdir(
        self, path: str, mode: int = 0o755, *, uid: int | None = None, gid: int | None = None
    ) -> Entry:
        return self.tree.mkdir(path, mode, uid=uid, gid=gid)

    def rmdir(self, path: str) -> None:
        self.tree.rmdir(path)

    def rename(self, src: str, dst: str, replace: bool = True) -> None:
        self.tree.rename(src, dst, replace)

    def symlink(
        self, path: str, target: str, *, uid: int | None = None, gid: int | None = None
    ) -> Entry:
        return self.tree.symlink(path, target, uid=uid, gid=gid)

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
        return self.tree.mknod(path, kind, mode, rdev, uid=uid, gid=gid)

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
        return self.attributes.set_attrs(
            path, mode, mtime_ns, uid=uid, gid=gid, atime_ns=atime_ns, follow=follow
        )

    def link(self, src: str, dst: str) -> Entry:
        return self.links.link(src, dst)

    def conditional_copies(self) -> bool:
        """See :meth:`.Links.conditional_copies`."""
        return self.links.conditional_copies()
