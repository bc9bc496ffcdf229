"""The S3-compatible origin (AWS S3, SeaweedFS, MinIO, Ceph RGW, ...), over obstore's *sync* API.

obstore's calls release the GIL, so the core's worker threads run them in parallel. Layout in
the bucket (``s3://BUCKET/PREFIX``; the prefix is prepended to every key):

* a file ``a/b.bin`` is the object ``PREFIX/a/b.bin``; its version tag is the ETag (quotes
  included, as S3 sends it); mtime from ``Last-Modified`` (whole seconds on most servers);
  its mode is kept in the object's user metadata ``x-amz-meta-airfs-mode`` (octal), written
  with the object itself by :meth:`S3Origin.put` (so it is never visible with another mode)
  and changed by ``set_attrs`` (a copy of the object onto itself); objects written by other
  tools have ``default_mode`` (0o644 unless configured). Listings do not carry user
  metadata: the mode of a listed object is known from this origin's own puts and heads
  (remembered per key and ETag) or asked for with a HEAD (in parallel), so a listing never
  shows a private object with the default mode;
* directories are key prefixes. ``mkdir`` writes a zero-byte *marker* object ``PREFIX/a/`` (the
  convention of the S3 console, Hadoop S3A, rclone, gcsfuse); a path is a directory if its
  marker exists or any key starts with ``path/``, so objects written by other tools
  (``a/b/c.parquet`` with no markers) appear as files in implied directories. Directories have
  mode 0o755 and, having no timestamp of their own, the time the origin was opened as mtime.
  When a delete, rename or rmdir empties a directory, its marker is written so that the
  directory does not vanish under the user (``rm -r`` works). A directory and a file of the
  same name can coexist on S3; the directory shadows the file in listings.
* obstore cannot address a key that ends in ``/`` (its paths drop empty segments), so marker
  objects, recursive key listings and cheap one-key probes go through :class:`_RawS3`, a small
  SigV4-signed HTTP client using the same credentials. It needs credentials it can read: the
  ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``/``AWS_SESSION_TOKEN`` variables, a profile of
  the shared credentials file, or boto3 (instance roles, SSO, ...) when installed. Without
  them (obstore then finds credentials on its own) reads and file writes work, and ``mkdir``,
  ``rmdir`` of a marker and directory renames raise :class:`NotSupported`.

Writes: :meth:`S3Origin.put` sends files up to ``single_put_max`` (64 MiB) in one PUT and
larger ones as a multipart upload; both are atomic for readers (the object appears only when
the PUT or the CompleteMultipartUpload finishes). Conditional puts (``if_match``) use
``If-Match``/``If-None-Match: *`` where the server supports them (probed once, on the first
conditional put; SeaweedFS 4.48 does, as tested; AWS S3 and MinIO document it). For multipart
uploads, which obstore cannot make conditional, and on servers without conditional writes the
condition is checked with a HEAD just before the upload: a writer that sneaks in between the
HEAD and the end of the upload is overwritten (a documented race, as for any last-writer-wins
store).

Not atomic: renames are copy + delete (a file; a copy is limited to 5 GiB by AWS; the copy
keeps the mode), a directory rename moves object by object. ``rename(replace=False)`` checks
the destination first (race documented). Symbolic links are not supported
(:class:`NotSupported`); ``set_attrs`` stores a mode and ignores mtimes (S3 has no settable
mtime). Names that are not valid keys for
obstore (control characters) fail with EINVAL. SeaweedFS turns ``\\`` in a key into ``/``.
"""

from __future__ import annotations

import configparser
import contextlib
import datetime as dt
import errno
import hashlib
import hmac
import http.client
import os
import re
import threading
import time
import urllib.parse
import uuid
import xml.etree.ElementTree as ET
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import obstore
import obstore.exceptions as oe
from obstore.store import S3Store

from .base import (
    Capabilities,
    Conflict,
    Entry,
    Exists,
    FsStats,
    InvalidName,
    IsADir,
    Kind,
    NameTooLong,
    NoSpace,
    NotADir,
    NotEmpty,
    NotFound,
    NotSupported,
    OriginError,
    PermissionDenied,
    Transient,
    check_rename_target,
    from_oserror,
    split,
)

MiB = 1 << 20
#: Files up to this size go in one PUT (conditional where the server allows); larger ones are
#: multipart uploads (the PUT body is held in memory, so this also bounds memory per upload).
DEFAULT_SINGLE_PUT_MAX = 64 * MiB
DEFAULT_PART_SIZE = 16 * MiB
DEFAULT_PUT_CONCURRENCY = 8
#: Overall limit for one HTTP request (a single PUT, one part, one ranged GET).
DEFAULT_TIMEOUT = 300.0
#: Objects named like this (at the root of the origin) are hidden: the conditional-put probe.
PROBE_PREFIX = ".airfs-probe-"
#: User metadata holding a file's mode (``x-amz-meta-airfs-mode``: octal digits).
MODE_ATTR = "airfs-mode"
#: Mode of objects without :data:`MODE_ATTR` (written by other tools), unless configured.
DEFAULT_MODE = 0o644
#: Modes remembered per key (with the ETag they belong to), and HEADs in flight per listing.
MODE_CACHE_MAX = 1 << 20
LIST_HEADS = 32


def _parse_mode(value: str | None) -> int | None:
    if not value:
        return None
    try:
        mode = int(value, 8)
    except ValueError:
        return None
    return mode if 0 <= mode <= 0o7777 else None


_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_STATUS_RE = re.compile(r"status code: (\d{3})")
_CODE_RE = re.compile(r"<Code>([^<]+)</Code>")
_NETWORK_HINTS = (
    "error sending request",
    "connection",
    "timed out",
    "timeout",
    "dns error",
    "broken pipe",
    "reset by peer",
    "incomplete",
)


def _ns(when: dt.datetime | None) -> int:
    if when is None:
        return 0
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return (when - _EPOCH) // dt.timedelta(microseconds=1) * 1000


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    line = text.splitlines()[0] if text else type(exc).__name__
    return line if len(line) <= 300 else line[:297] + "..."


# -- credentials ---------------------------------------------------------------------------


class _Credentials:
    """Credentials both obstore (as its ``credential_provider``) and :class:`_RawS3` use."""

    def __init__(
        self,
        static: tuple[str, str, str | None] | None = None,
        refreshable: Any = None,
        source: str = "",
    ) -> None:
        self._static = static
        self._refreshable = refreshable  # botocore Credentials
        self.source = source

    def get(self) -> tuple[str, str, str | None]:
        if self._static is not None:
            return self._static
        frozen = self._refreshable.get_frozen_credentials()
        return frozen.access_key, frozen.secret_key, frozen.token

    def __call__(self) -> dict[str, Any]:
        ak, sk, token = self.get()
        expires = None
        if self._static is None:  # let obstore ask again; botocore refreshes before expiry
            expires = dt.datetime.now(dt.UTC) + dt.timedelta(minutes=5)
        return {"access_key_id": ak, "secret_access_key": sk, "token": token, "expires_at": expires}


def _profile(env: Mapping[str, str]) -> str:
    return env.get("AWS_PROFILE") or env.get("AWS_DEFAULT_PROFILE") or "default"


def _read_ini(path: str) -> configparser.RawConfigParser:
    cp = configparser.RawConfigParser()
    with contextlib.suppress(OSError, configparser.Error):
        cp.read(os.path.expanduser(path))
    return cp


def _resolve_credentials(env: Mapping[str, str]) -> _Credentials | None:
    ak, sk = env.get("AWS_ACCESS_KEY_ID"), env.get("AWS_SECRET_ACCESS_KEY")
    if ak and sk:
        return _Credentials((ak, sk, env.get("AWS_SESSION_TOKEN") or None), source="environment")
    profile = _profile(env)
    cp = _read_ini(env.get("AWS_SHARED_CREDENTIALS_FILE", "~/.aws/credentials"))
    if cp.has_section(profile):
        ak = cp.get(profile, "aws_access_key_id", fallback=None)
        sk = cp.get(profile, "aws_secret_access_key", fallback=None)
        if ak and sk:
            token = cp.get(profile, "aws_session_token", fallback=None)
            return _Credentials((ak, sk, token), source=f"profile {profile}")
    try:
        import boto3  # optional: instance roles, SSO, assume-role profiles
    except ImportError:
        return None
    try:
        creds = boto3.Session(profile_name=env.get("AWS_PROFILE")).get_credentials()
    except Exception:
        return None
    return _Credentials(refreshable=creds, source="boto3") if creds is not None else None


def _resolve_region(env: Mapping[str, str]) -> str:
    region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
    if region:
        return region
    profile = _profile(env)
    cp = _read_ini(env.get("AWS_CONFIG_FILE", "~/.aws/config"))
    for section in (f"profile {profile}", profile):
        if cp.has_section(section) and cp.get(section, "region", fallback=None):
            return cp.get(section, "region")
    return "us-east-1"


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


# -- error translation ---------------------------------------------------------------------


def _classify(
    where: str, *, status: int | None, code: str | None, detail: str, network: bool = False
) -> OriginError:
    """The typed error for an S3 failure; ``where`` starts the one-line message."""
    tag = code or (f"HTTP {status}" if status else "")
    if network:
        return Transient(f"{where}: cannot reach the S3 endpoint ({detail})", errno.EIO)
    if status == 404 or code in ("NoSuchKey", "NoSuchBucket"):
        if code == "NoSuchBucket":
            return NotFound(f"{where}: the bucket does not exist")
        return NotFound(f"{where}: not found")
    if status == 412 or code == "PreconditionFailed":
        return Conflict(f"{where}: changed at the origin (precondition failed)")
    if status in (401, 403) or code in ("AccessDenied", "SignatureDoesNotMatch"):
        return PermissionDenied(f"{where}: access denied ({tag})")
    if status == 501 or code == "NotImplemented":
        return NotSupported(f"{where}: not supported by this S3 server ({tag})")
    if status == 507 or code == "EntityTooLarge":
        return NoSpace(f"{where}: the S3 server refused the size ({tag})")
    retry_codes = ("SlowDown", "RequestTimeout", "InternalError", "ServiceUnavailable")
    if (status is not None and (status >= 500 or status in (408, 429))) or code in retry_codes:
        return Transient(f"{where}: S3 server error ({tag}), retry later")
    return OriginError(f"{where}: {detail}")


def _status(exc: BaseException) -> int | None:
    m = _STATUS_RE.search(str(exc))
    return int(m.group(1)) if m else None


def _s3_code(exc: BaseException) -> str | None:
    c = _CODE_RE.search(str(exc))
    return c.group(1) if c else None


def _translate(exc: BaseException, where: str) -> OriginError:
    """Map an obstore (or socket/OS) exception to the typed origin error."""
    if isinstance(exc, OriginError):
        return exc
    msg = str(exc)
    status, code = _status(exc), _s3_code(exc)
    detail = _first_line(exc)
    if isinstance(exc, ValueError | oe.InvalidPathError) or "Could not parse path" in msg:
        return OriginError(f"{where}: not a valid S3 key ({detail})", errno.EINVAL)
    if isinstance(exc, FileNotFoundError | oe.NotFoundError):
        status = status or 404
    elif isinstance(exc, oe.PreconditionError | oe.AlreadyExistsError | oe.NotModifiedError):
        status = 412
    elif isinstance(exc, PermissionError | oe.PermissionDeniedError | oe.UnauthenticatedError):
        status = status if status in (401, 403) else 403
    elif isinstance(exc, oe.NotSupportedError):
        return NotSupported(f"{where}: {detail}")
    elif status is None and (
        isinstance(exc, TimeoutError | ConnectionError | http.client.HTTPException)
        or any(h in msg.lower() for h in _NETWORK_HINTS)
    ):
        return _classify(where, status=None, code=None, detail=detail, network=True)
    elif status is None and isinstance(exc, OSError) and exc.errno:
        return from_oserror(exc, where)
    return _classify(where, status=status, code=code, detail=detail)


# -- a minimal SigV4 client for what obstore cannot express --------------------------------


def _q(s: str, safe: str = "-_.~") -> str:
    return urllib.parse.quote(s, safe=safe)


class _RawS3:
    """Signed S3 requests on exact keys (markers end in ``/``, which obstore cannot address)."""

    def __init__(
        self,
        endpoint: str,
        bucket: str,
        *,
        path_style: bool,
        region: str,
        creds: _Credentials | None,
        timeout: float = 60.0,
    ) -> None:
        u = urllib.parse.urlsplit(endpoint)
        self.scheme, self.netloc = u.scheme, u.netloc
        base = u.path.rstrip("/")
        self.base = f"{base}/{_q(bucket, safe='')}" if path_style else base
        self.region = region
        self.creds = creds
        self.timeout = timeout
        self._local = threading.local()  # one kept-alive connection per worker thread

    def _conn(self) -> http.client.HTTPConnection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            cls = (
                http.client.HTTPSConnection
                if self.scheme == "https"
                else http.client.HTTPConnection
            )
            conn = self._local.conn = cls(self.netloc, timeout=self.timeout)
        return conn

    def _drop(self) -> None:
        conn = getattr(self._local, "conn", None)
        self._local.conn = None
        if conn is not None:
            conn.close()

    def _headers(
        self,
        method: str,
        path: str,
        query: str,
        body: bytes,
        extra: Mapping[str, str] | None = None,
    ) -> dict[str, str]:
        now = dt.datetime.now(dt.UTC)
        amz_date = now.strftime("%Y%m%dT%H%M%SZ")
        payload = hashlib.sha256(body).hexdigest()
        headers = {"host": self.netloc, "x-amz-date": amz_date, "x-amz-content-sha256": payload}
        headers.update({k.lower(): v for k, v in (extra or {}).items()})
        if self.creds is None:  # anonymous (AWS_SKIP_SIGNATURE)
            return headers
        ak, sk, token = self.creds.get()
        if token:
            headers["x-amz-security-token"] = token
        names = sorted(headers)
        canonical = "\n".join(
            [
                method,
                path,
                query,
                "".join(f"{n}:{headers[n].strip()}\n" for n in names),
                ";".join(names),
                payload,
            ]
        )
        scope = f"{amz_date[:8]}/{self.region}/s3/aws4_request"
        to_sign = "\n".join(
            ["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(canonical.encode()).hexdigest()]
        )
        key = f"AWS4{sk}".encode()
        for part in (amz_date[:8], self.region, "s3", "aws4_request"):
            key = hmac.new(key, part.encode(), hashlib.sha256).digest()
        sig = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
        headers["authorization"] = (
            f"AWS4-HMAC-SHA256 Credential={ak}/{scope}, "
            f"SignedHeaders={';'.join(names)}, Signature={sig}"
        )
        return headers

    def request(
        self,
        method: str,
        key: str | None,
        where: str,
        query: Mapping[str, str] | None = None,
        body: bytes = b"",
        headers: Mapping[str, str] | None = None,
    ) -> bytes:
        """Send one request (``key=None``: the bucket itself) with extra signed ``headers``;
        raise the typed error for a non-2xx reply; return the body."""
        path = self.base + ("/" + _q(key, safe="/~") if key is not None else "") or "/"
        qs = "&".join(f"{_q(k)}={_q(v)}" for k, v in sorted((query or {}).items()))
        target = f"{path}?{qs}" if qs else path
        for attempt in (1, 2):  # a kept-alive connection may have been closed by the server
            fresh = getattr(self._local, "conn", None) is None
            conn = self._conn()
            try:
                conn.request(
                    method,
                    target,
                    body=body,
                    headers=self._headers(method, path, qs, body, headers),
                )
                resp = conn.getresponse()
                data = resp.read()
                if resp.will_close:
                    self._drop()
                break
            except (OSError, http.client.HTTPException) as exc:
                self._drop()
                if attempt == 1 and not fresh:
                    continue  # every request made here is idempotent: retry on a new one
                raise _classify(
                    where,
                    status=None,
                    code=None,
                    detail=_first_line(exc) or repr(exc),
                    network=True,
                ) from None
        if resp.status >= 300:
            c = _CODE_RE.search(data.decode("utf-8", "replace"))
            raise _classify(
                where,
                status=resp.status,
                code=c.group(1) if c else None,
                detail=f"HTTP {resp.status} {resp.reason}",
            )
        return data

    def list_keys(
        self, prefix: str, where: str, max_keys: int | None = None
    ) -> Iterator[tuple[str, int]]:
        """(key, size) of every object whose key starts with ``prefix`` (all pages, or only
        the first ``max_keys``)."""
        token: str | None = None
        while True:
            query = {"list-type": "2", "prefix": prefix}
            if max_keys is not None:
                query["max-keys"] = str(max_keys)
            if token:
                query["continuation-token"] = token
            root = ET.fromstring(self.request("GET", None, where, query))
            truncated, token = False, None
            for el in root:
                tag = el.tag.rpartition("}")[2]
                if tag == "Contents":
                    k = s = None
                    for f in el:
                        ftag = f.tag.rpartition("}")[2]
                        if ftag == "Key":
                            k = f.text or ""
                        elif ftag == "Size":
                            s = int(f.text or 0)
                    if k is not None:
                        yield k, s or 0
                elif tag == "IsTruncated":
                    truncated = (el.text or "").strip() == "true"
                elif tag == "NextContinuationToken":
                    token = el.text
            if max_keys is not None or not truncated or not token:
                return


# -- the origin ----------------------------------------------------------------------------


class S3Origin:
    """An origin on an S3-compatible bucket (see the module docstring for the semantics)."""

    def __init__(
        self,
        store: S3Store,
        *,
        bucket: str,
        prefix: str = "",
        raw: _RawS3 | None = None,
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

    # -- construction --------------------------------------------------------------------

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
        True/False asserts it. ``timeout`` is the limit per HTTP request, in seconds.
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
        region = region or _resolve_region(env)
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

        anonymous = _truthy(env.get("AWS_SKIP_SIGNATURE"))
        creds = None if anonymous else _resolve_credentials(env)
        raw = None
        if creds is not None or anonymous:
            raw = _RawS3(
                endpoint,
                bucket,
                path_style=path_style,
                region=region,
                creds=creds,
                timeout=min(timeout, 60.0),
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
                    f"s3://{bucket}: bad S3 configuration: {_first_line(exc)}"
                ) from None

        # obstore's own retries are off: the one retry policy is AsyncOrigin's (async, outside
        # the origin's concurrency limit)
        store = make_store(
            {
                "max_retries": 0,
                "retry_timeout": dt.timedelta(seconds=min(timeout, 120.0)),
                "backoff": {
                    "init_backoff": dt.timedelta(milliseconds=100),
                    "max_backoff": dt.timedelta(seconds=5),
                },
            },
            {"timeout": f"{int(timeout)}s", "connect_timeout": "5s", "read_timeout": "60s"},
        )
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
        )
        if check:
            quick = make_store(
                {"max_retries": 1, "retry_timeout": dt.timedelta(seconds=10)},
                {"timeout": "20s", "connect_timeout": "3s"},
            )
            origin._check(quick, endpoint, creds)
        return origin

    def _check(self, store: S3Store, endpoint: str, creds: _Credentials | None) -> None:
        bucket = f"s3://{self.bucket}"
        try:
            for _ in obstore.list(store, None, chunk_size=1):
                break
        except Exception as exc:
            err = _translate(exc, bucket)
            if isinstance(err, PermissionDenied):
                src = f" from {creds.source}" if creds is not None else ""
                why = _s3_code(exc) or f"HTTP {_status(exc) or 403}"
                raise PermissionDenied(
                    f"{bucket}: access denied at {endpoint} with the credentials{src} ({why}; "
                    "check AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY/AWS_PROFILE)"
                ) from None
            if isinstance(err, NotFound):
                raise NotFound(f"{bucket}: no such bucket at {endpoint}") from None
            if err.transient and _status(exc) is None:
                raise Transient(
                    f"{bucket}: cannot reach the S3 endpoint {endpoint} ({_first_line(exc)})"
                ) from None
            raise err from None

    def __repr__(self) -> str:
        return f"S3Origin({self.url!r})"

    # -- helpers -------------------------------------------------------------------------

    def _where(self, path: str) -> str:
        return f"{self.url}/{path}" if path else self.url

    def _key(self, path: str) -> str:
        """The full object key of ``path`` (prefix included)."""
        return f"{self.prefix}/{path}" if self.prefix else path

    def _file_entry(self, name: str, meta: Mapping[str, Any], mode: int) -> Entry:
        etag = meta.get("e_tag") or ""
        seen = self._put_attrs.get(etag)
        mtime_ns = seen[0] if seen else (_ns(meta.get("last_modified")) or time.time_ns())
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
            return {**res.meta, "mode": _parse_mode(res.attributes.get(MODE_ATTR))}
        except Exception as exc:
            err = _translate(exc, self._where(path))
            if isinstance(err, NotFound) and _s3_code(exc) != "NoSuchBucket":
                return None
            raise err from None

    def _need_raw(self, what: str, path: str) -> _RawS3:
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
            raise _translate(exc, self._where(path)) from None
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

    # -- reads ---------------------------------------------------------------------------

    def stat(self, path: str) -> Entry:
        if not path:
            return self._dir_entry("")
        meta = self._head(path)
        if meta is not None:
            return self._file_entry(split(path)[1], meta, self._mode_of(path, meta))
        if self._is_dir(path):
            return self._dir_entry(split(path)[1])
        raise NotFound(f"{self._where(path)}: not found")

    def list(self, path: str) -> list[Entry]:
        try:
            res = obstore.list_with_delimiter(self._store, path or None)
        except Exception as exc:
            raise _translate(exc, self._where(path)) from None
        cut = len(path) + 1 if path else 0
        out: dict[str, Entry] = {}
        for p in res["common_prefixes"]:
            name = p[cut:]
            if name:
                out[name] = self._dir_entry(name)
        has_marker = False
        unknown: list[tuple[str, Mapping[str, Any]]] = []
        for meta in res["objects"]:
            p = meta["path"]
            if p == path:  # the marker "path/" of the listed directory itself
                has_marker = True
                continue
            name = p[cut:]
            if not name or name in out or (not path and name.startswith(PROBE_PREFIX)):
                continue
            mode = self._known_mode(p, meta.get("e_tag") or "")
            if mode is None and not self.list_heads:
                mode = self.default_mode
            if mode is None:
                unknown.append((name, meta))
            else:
                out[name] = self._file_entry(name, meta, mode)
        for name, meta, mode in self._modes_of(unknown):
            out[name] = self._file_entry(name, meta, mode)
        if not out and not has_marker and path:
            if self._head(path) is not None:
                raise NotADir(f"{self._where(path)}: not a directory")
            raise NotFound(f"{self._where(path)}: not found")
        return list(out.values())

    def _modes_of(
        self, listed: list[tuple[str, Mapping[str, Any]]]
    ) -> list[tuple[str, Mapping[str, Any], int]]:
        """The modes of listed objects this origin has not seen yet: one HEAD each, in
        parallel (an object gone meanwhile is left out; one that changed keeps the listed
        size and version, with the mode of what the HEAD saw: never wider than stored)."""
        if not listed:
            return []

        def one(item: tuple[str, Mapping[str, Any]]) -> tuple[str, Mapping[str, Any], int] | None:
            name, meta = item
            head = self._head(meta["path"])
            if head is None:
                return None
            return name, meta, self._mode_of(meta["path"], head)

        if len(listed) == 1:
            found = [one(listed[0])]
        else:
            with ThreadPoolExecutor(min(LIST_HEADS, len(listed))) as pool:
                found = list(pool.map(one, listed))
        return [f for f in found if f is not None]

    def read_range(self, path: str, offset: int, size: int, version: str | None = None) -> bytes:
        where = self._where(path)
        if size <= 0:
            self._check_version(path, version)
            return b""
        options: dict[str, Any] = {"range": (offset, offset + size)}
        if version is not None:
            options["if_match"] = version
        try:
            res = obstore.get(self._store, path, options=options)
            if version is not None and res.meta.get("e_tag") != version:
                raise Conflict(f"{where}: changed at the origin (version {version} is gone)")
            return bytes(res.bytes())
        except Exception as exc:
            if _status(exc) == 416:  # offset at or past the end of the object
                past_end = True
            else:
                past_end = False
                err = _translate(exc, where)
        if past_end:
            self._check_version(path, version)
            return b""
        if isinstance(err, Conflict):
            raise Conflict(f"{where}: changed at the origin (version {version} is gone)")
        if isinstance(err, NotFound) and self._is_dir(path):
            raise IsADir(f"{where}: is a directory")
        raise err

    def _check_version(self, path: str, version: str | None) -> None:
        meta = self._head(path)
        if meta is None:
            if self._is_dir(path):
                raise IsADir(f"{self._where(path)}: is a directory")
            raise NotFound(f"{self._where(path)}: not found")
        if version is not None and meta.get("e_tag") != version:
            raise Conflict(
                f"{self._where(path)}: changed at the origin (version {version} is gone)"
            )

    def readlink(self, path: str) -> str:
        raise NotSupported(f"{self._where(path)}: symbolic links are not supported on S3 origins")

    def statfs(self) -> FsStats:
        return FsStats(
            block_size=4096,
            total_blocks=1 << 40,
            free_blocks=1 << 40,
            total_files=1 << 40,
            free_files=1 << 40,
        )

    # -- writes --------------------------------------------------------------------------

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

        def put(data: bytes, mode: Any) -> dict[str, Any]:
            return obstore.put(self._store, key, data, mode=mode, use_multipart=False)

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
            err = _translate(exc, self._where(key))
            if err.transient:
                raise err from None
            return False
        finally:
            with contextlib.suppress(Exception):
                obstore.delete(self._store, key)

    def _check_precondition(self, path: str, if_match: str) -> None:
        """The HEAD-based emulation of a conditional put (racy; see the module docstring)."""
        meta = self._head(path)
        current = "" if meta is None else (meta.get("e_tag") or "")
        if current != if_match:
            what = "exists" if if_match == "" else "changed at the origin since it was opened"
            raise Conflict(f"{self._where(path)}: {what}")

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(
            pin=False,
            conditional_put=self.conditional_writes(),
            symlinks=False,
            modes=True,
            mtimes=False,
            md5_etag=True,
        )

    def check_name(self, path: str) -> None:
        """Names S3 (or the server) cannot keep as given: keys over 1,024 bytes, names that
        are not UTF-8, control characters, and ``\\`` (SeaweedFS stores it as ``/``)."""
        try:
            key = self._key(path).encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidName(f"{self._where(path)!r}: S3 keys must be UTF-8") from None
        if len(key) + 1 > 1024:  # +1: a directory's marker key ends in "/"
            raise NameTooLong(f"{self._where(path)[:80]}...: S3 keys are at most 1,024 bytes")
        if "\\" in path or any(ord(c) < 0x20 or c == "\x7f" for c in path):
            raise InvalidName(
                f"{self._where(path)!r}: S3 origins cannot keep backslashes or control "
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
    ) -> Entry:
        """See :meth:`Origin.put`: the mode travels in the object's metadata, so the object
        never exists without it (``mode`` None keeps the replaced object's mode); ``mtime_ns``
        is not kept (S3 sets Last-Modified)."""
        where = self._where(path)
        if not path:
            raise IsADir(f"{where}: is a directory")
        try:
            size = os.stat(source).st_size
        except OSError as exc:
            raise from_oserror(exc, source) from None
        if self._is_dir(path):
            raise IsADir(f"{where}: is a directory")
        if mode is None:
            cur = self._head(path)
            mode = self._mode_of(path, cur) if cur is not None else self.default_mode
        mode &= 0o7777
        attributes = {MODE_ATTR: f"{mode:o}"}
        single = size <= self.single_put_max
        cond: Any = None
        if if_match is not None:
            if single and self.conditional_writes():
                cond = "create" if if_match == "" else {"e_tag": if_match}
            else:
                self._check_precondition(path, if_match)
        try:
            if single:
                res = obstore.put(
                    self._store,
                    path,
                    Path(source),
                    mode=cond,
                    use_multipart=False,
                    attributes=attributes,
                )
            else:
                # S3 allows 10,000 parts: grow the parts of very large files (in whole MiB)
                part = max(self.part_size, -(-size // (9_000 * MiB)) * MiB)
                res = obstore.put(
                    self._store,
                    path,
                    Path(source),
                    use_multipart=True,
                    chunk_size=part,
                    max_concurrency=self.put_concurrency,
                    attributes=attributes,
                )
        except Exception as exc:
            err = _translate(exc, where)
            if isinstance(err, Conflict) or (isinstance(err, NotFound) and if_match):
                what = "exists" if if_match == "" else "changed at the origin since it was opened"
                raise Conflict(f"{where}: {what}") from None
            raise err from None
        etag = res.get("e_tag") or ""
        self._remember(path, etag, mode)
        self._remember_attrs(etag, mode, mtime_ns)
        meta = self._head(path)
        if meta is not None and (meta.get("e_tag") or "") == etag:
            return self._file_entry(split(path)[1], meta, self._mode_of(path, meta))
        return self._file_entry(
            split(path)[1], {"size": size, "e_tag": etag, "last_modified": None}, mode
        )

    def delete(self, path: str) -> None:
        where = self._where(path)
        if not path:
            raise IsADir(f"{where}: is a directory")
        if self._head(path) is None:
            if self._is_dir(path):
                raise IsADir(f"{where}: is a directory")
            raise NotFound(f"{where}: not found")
        try:
            obstore.delete(self._store, path)
        except Exception as exc:
            raise _translate(exc, where) from None
        self._keep_parent(path)

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
                raise _translate(exc, self._where(src)) from None
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
            raise _translate(exc, self._where(src)) from None
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
                "x-amz-copy-source": "/" + _q(self.bucket, safe="") + "/" + _q(key, safe="/~"),
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

    def abort_stale_uploads(self, older_than_s: float = 3600.0) -> int:
        """Abort the multipart uploads under this origin's prefix started more than
        ``older_than_s`` seconds ago (left behind by a daemon that was killed mid-upload;
        S3 keeps, and bills, their parts forever). Returns how many were aborted. Needs the
        signing client (else 0)."""
        if self._raw is None:
            return 0
        prefix = f"{self.prefix}/" if self.prefix else ""
        root = ET.fromstring(
            self._raw.request("GET", None, self.url, {"uploads": "", "prefix": prefix})
        )
        cutoff = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=older_than_s)
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
            if not key or not upload_id or started > cutoff:
                continue
            with contextlib.suppress(OriginError):
                self._raw.request("DELETE", key, self.url, {"uploadId": upload_id})
                aborted += 1
        return aborted

    def close(self) -> None:
        pass
