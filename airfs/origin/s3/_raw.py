"""A minimal SigV4-signed S3 client for what obstore cannot express.

obstore cannot address a key that ends in ``/`` (its paths drop empty segments), so directory
markers, recursive key listings, cheap one-key probes, metadata-replacing copies and
multipart-upload listings go through :class:`RawS3`, with the credentials obstore uses.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import http.client
import threading
import urllib.parse
import weakref
import xml.etree.ElementTree as ET
from collections.abc import Iterator, Mapping

from ..base import NotFound
from ._credentials import Credentials
from ._errors import CODE_RE, classify, first_line
from ._meta import iso_ns


def _close_all(conns: dict[int, http.client.HTTPConnection], lock: threading.Lock) -> None:
    with lock:
        items = list(conns.values())
        conns.clear()
    for conn in items:
        conn.close()


def quote(s: str, safe: str = "-_.~") -> str:
    return urllib.parse.quote(s, safe=safe)


class RawS3:
    """Signed S3 requests on exact keys (markers end in ``/``, which obstore cannot address)."""

    def __init__(
        self,
        endpoint: str,
        bucket: str,
        *,
        path_style: bool,
        region: str,
        creds: Credentials | None,
        timeout: float = 10.0,
        slow_timeout: float = 300.0,
    ) -> None:
        u = urllib.parse.urlsplit(endpoint)
        self.scheme, self.netloc = u.scheme, u.netloc
        base = u.path.rstrip("/")
        self.base = f"{base}/{quote(bucket, safe='')}" if path_style else base
        self.region = region
        self.creds = creds
        #: the socket deadline (connect, and every send and receive: a stalled server) of
        #: ordinary requests, and of those that may take long to answer (``slow=True``:
        #: server-side copies of large objects)
        self.timeout = timeout
        self.slow_timeout = slow_timeout
        self._local = threading.local()  # one kept-alive connection per worker thread
        #: every connection made, by the thread that uses it: closed by :meth:`close`, when
        #: this object is collected, and (for threads that have ended) when a new one is made,
        #: so that no socket outlives its user unclosed
        self._conns: dict[int, http.client.HTTPConnection] = {}
        self._conns_lock = threading.Lock()
        weakref.finalize(self, _close_all, self._conns, self._conns_lock)

    def _conn(self) -> http.client.HTTPConnection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            cls = (
                http.client.HTTPSConnection
                if self.scheme == "https"
                else http.client.HTTPConnection
            )
            conn = self._local.conn = cls(self.netloc, timeout=self.timeout)
            me = threading.current_thread().ident  # (a thread not made by threading is listed)
            with self._conns_lock:
                # under the lock: a thread whose connection is registered had started before
                # this list is made (it registers under the same lock), so a live thread's
                # connection is never taken for a dead one's
                alive = {t.ident for t in threading.enumerate()}
                for ident in [i for i in self._conns if i not in alive]:
                    self._conns.pop(ident).close()
                assert me is not None
                old = self._conns.get(me)
                self._conns[me] = conn
            if old is not None and old is not conn:
                old.close()
        return conn

    def _drop(self) -> None:
        conn = getattr(self._local, "conn", None)
        self._local.conn = None
        if conn is not None:
            with self._conns_lock:
                if self._conns.get(threading.get_ident()) is conn:
                    del self._conns[threading.get_ident()]
            conn.close()

    def close(self) -> None:
        """Close every kept-alive connection (a later request opens a new one)."""
        _close_all(self._conns, self._conns_lock)

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
        *,
        slow: bool = False,
    ) -> bytes:
        """Send one request (``key=None``: the bucket itself) with extra signed ``headers``;
        raise the typed error for a non-2xx reply; return the body. ``slow``: the request
        may take long before its answer (a copy), it gets ``slow_timeout``."""
        return self.send(method, key, where, query, body, headers, slow=slow)[1]

    def head(self, key: str, where: str) -> dict[str, str] | None:
        """The reply headers of a HEAD of ``key`` (names in lower case), or None if there is
        no such object. Other failures raise the typed error."""
        try:
            return self.send("HEAD", key, where)[0]
        except NotFound:
            return None

    def send(
        self,
        method: str,
        key: str | None,
        where: str,
        query: Mapping[str, str] | None = None,
        body: bytes = b"",
        headers: Mapping[str, str] | None = None,
        *,
        slow: bool = False,
    ) -> tuple[dict[str, str], bytes]:
        """:meth:`request`, returning the reply headers (lower-case names) with the body.
        A request with no answer within the socket deadline raises :class:`Stalled`."""
        path = self.base + ("/" + quote(key, safe="/~") if key is not None else "") or "/"
        qs = "&".join(f"{quote(k)}={quote(v)}" for k, v in sorted((query or {}).items()))
        target = f"{path}?{qs}" if qs else path
        for attempt in (1, 2):  # a kept-alive connection may have been closed by the server
            fresh = getattr(self._local, "conn", None) is None
            conn = self._conn()
            conn.timeout = self.slow_timeout if slow else self.timeout
            if conn.sock is not None:
                conn.sock.settimeout(conn.timeout)
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
                stalled = isinstance(exc, TimeoutError)
                if attempt == 1 and not fresh and not stalled:
                    continue  # a request that never reached the server: send it again
                raise classify(
                    where,
                    status=None,
                    code=None,
                    detail=first_line(exc) or repr(exc),
                    network=True,
                    stalled=stalled,
                ) from None
        if resp.status >= 300:
            c = CODE_RE.search(data.decode("utf-8", "replace"))
            raise classify(
                where,
                status=resp.status,
                code=c.group(1) if c else None,
                detail=f"HTTP {resp.status} {resp.reason}",
            )
        return {k.lower(): v for k, v in resp.getheaders()}, data

    def list_keys(
        self, prefix: str, where: str, max_keys: int | None = None
    ) -> Iterator[tuple[str, int, int]]:
        """(key, size, Last-Modified ns) of every object whose key starts with ``prefix``
        (all pages, or only the first ``max_keys``; the time is 0 where unreadable)."""
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
                    t = 0
                    for f in el:
                        ftag = f.tag.rpartition("}")[2]
                        if ftag == "Key":
                            k = f.text or ""
                        elif ftag == "Size":
                            s = int(f.text or 0)
                        elif ftag == "LastModified":
                            t = iso_ns(f.text)
                    if k is not None:
                        yield k, s or 0, t
                elif tag == "IsTruncated":
                    truncated = (el.text or "").strip() == "true"
                elif tag == "NextContinuationToken":
                    token = el.text
            if max_keys is not None or not truncated or not token:
                return
