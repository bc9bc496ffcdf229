"""The Files API's large-file flows, as databricks-sdk drives them:

* multipart upload: ``POST /api/2.0/fs/files{path}?action=initiate-upload`` opens a session
  (``{"multipart_upload": {"session_token": ...}}``); ``POST /api/2.0/fs/create-upload-part-urls``
  gives one URL per part; each part is ``PUT`` to its URL (no credentials: the URL is the
  capability, as a presigned URL is) and answers its ``ETag``; ``POST ...?action=complete-upload``
  with the parts and their tags joins them and puts the file at the origin with one atomic
  replace; ``action=abort-upload`` drops the session;
* download URLs: ``POST /api/2.0/fs/create-download-url?path=...`` gives a URL that ``GET``s
  the file (with ``Range``) without credentials.

Sessions and download URLs live in this server's memory (a restart forgets them: the client
starts again) and expire (:data:`SESSION_TTL` after the last use, a download URL at the
``expire_time`` asked for, at most :data:`URL_TTL`). The privileges are checked when a session
is opened or a URL made, and again when the file is committed or served, for the principal
that opened it. Parts are staged in the server's staging directory; a session holds at most
``max_file`` bytes and ``max_parts`` parts; at most ``max_sessions`` are open at once.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import os
import secrets
import shutil
import threading
import time
import urllib.parse
from dataclasses import dataclass, field

from airfs.catalog.model import Who

from .context import Api, Reply, Request
from .errors import ApiError, bad_request
from .files import FILES, VolumePath, check, commit, parse_path, serve_file, stage_file

SESSION_TTL = 3600.0
URL_TTL = 3600.0
PART_URL = "/api/2.0/fs/upload-part/"
DOWNLOAD_URL = "/api/2.0/fs/download/"


@dataclass
class Session:
    token: str
    principal: str
    who: Who
    vp: VolumePath
    overwrite: bool
    directory: str
    used: float
    #: part number → (staged size, ETag; "" while the part is being received)
    parts: dict[int, tuple[int, str]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class DownloadUrl:
    who: Who
    vp: VolumePath
    expires: float


#: what S3 answers for an expired presigned URL (databricks-sdk recognises it and asks again)
EXPIRED = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n'
    b"<Error><Code>AccessDenied</Code><Message>Request has expired</Message></Error>"
)


class Uploads:
    """The open sessions and download URLs of one server; thread-safe."""

    def __init__(self, api: Api) -> None:
        self.api = api
        self._lock = threading.Lock()
        self._sessions: dict[str, Session] = {}
        self._downloads: dict[str, DownloadUrl] = {}

    def _expire(self, now: float) -> None:
        for s in [s for s in self._sessions.values() if now - s.used > SESSION_TTL]:
            self._drop(s)
        for k in [k for k, d in self._downloads.items() if d.expires < now]:
            del self._downloads[k]

    def _drop(self, s: Session) -> None:
        self._sessions.pop(s.token, None)
        shutil.rmtree(s.directory, ignore_errors=True)

    def close(self) -> None:
        with self._lock:
            for s in list(self._sessions.values()):
                self._drop(s)

    def _session(self, req: Request, token: str, vp: VolumePath | None) -> Session:
        with self._lock:
            s = self._sessions.get(token)
        if s is None or s.principal != req.principal or (vp is not None and vp != s.vp):
            raise ApiError(404, "NOT_FOUND", "no such upload session (expired, or not yours)")
        s.used = time.monotonic()
        return s

    # -- authenticated calls --------------------------------------------------------------

    def file_action(self, req: Request, raw: str) -> Reply:
        """``POST /api/2.0/fs/files{path}?action=...``."""
        vp = parse_path(raw, is_dir=False)
        if vp.depth < 4:
            raise bad_request(f"{vp.shown} is a volume, not a file in one")
        action = req.query.get("action", "")
        if action == "initiate-upload":
            return self._initiate(req, vp)
        token = req.query.get("session_token", "")
        if action == "complete-upload":
            return self._complete(req, self._session(req, token, vp))
        if action == "abort-upload":
            s = self._session(req, token, vp)
            with self._lock:
                self._drop(s)
            return Reply(body={})
        raise bad_request(f"action {action!r}: initiate-upload, complete-upload or abort-upload")

    def _initiate(self, req: Request, vp: VolumePath) -> Reply:
        overwrite = req.query.get("overwrite", "false").lower() == "true"
        check(self.api, req.who, "create", vp)
        if not overwrite:
            with contextlib.suppress(OSError):
                self.api.origin.stat(vp.origin)
                raise ApiError(409, "ALREADY_EXISTS", f"{vp.shown} exists (overwrite=false)")
        now = time.monotonic()
        with self._lock:
            self._expire(now)
            if len(self._sessions) >= self.api.limits.max_sessions:
                raise ApiError(429, "REQUEST_LIMIT_EXCEEDED", "too many open upload sessions")
            token = secrets.token_urlsafe(32)
            directory = os.path.join(self.api.stage_dir, "up-" + secrets.token_hex(8))
            os.mkdir(directory, 0o700)
            self._sessions[token] = Session(
                token, req.principal, req.who, vp, overwrite, directory, now
            )
        return Reply(body={"multipart_upload": {"session_token": token}})

    def part_urls(self, req: Request) -> Reply:
        """``POST /api/2.0/fs/create-upload-part-urls``."""
        body = req.body.json()
        vp = parse_path(urllib.parse.quote(str(body.get("path", ""))), is_dir=False)
        s = self._session(req, str(body.get("session_token", "")), vp)
        try:
            start = int(body.get("start_part_number", 1))
            count = int(body.get("count", 1))
        except (TypeError, ValueError):
            raise bad_request("start_part_number and count must be numbers") from None
        if start < 1 or count < 1 or start + count - 1 > self.api.limits.max_parts:
            raise bad_request(f"parts are numbered 1 to {self.api.limits.max_parts}")
        urls = [
            {"url": f"{req.base_url}{PART_URL}{s.token}/{n}", "part_number": n, "headers": []}
            for n in range(start, start + count)
        ]
        return Reply(body={"upload_part_urls": urls})

    def _complete(self, req: Request, s: Session) -> Reply:
        parts = req.body.json().get("parts")
        if not isinstance(parts, list) or not parts:
            raise bad_request("parts must list {part_number, etag}")
        wanted: list[tuple[int, str]] = []
        for p in parts:
            if not isinstance(p, dict):
                raise bad_request("parts must list {part_number, etag}")
            try:
                wanted.append((int(p["part_number"]), str(p.get("etag", "")).strip('"')))
            except (KeyError, TypeError, ValueError):
                raise bad_request("each part needs a part_number") from None
        wanted.sort()
        with self._lock:
            parts = dict(s.parts)
        for i, (n, etag) in enumerate(wanted, 1):
            have = parts.get(n)
            if n != i or have is None or not have[1] or (etag and etag != have[1]):
                raise bad_request(f"part {n}: not uploaded, out of order, or another ETag")
        check(self.api, s.who, "create", s.vp)
        staged = stage_file(self.api)
        try:
            with open(staged, "wb") as out:
                for n, _etag in wanted:
                    with open(os.path.join(s.directory, str(n)), "rb") as f:
                        shutil.copyfileobj(f, out, 1 << 20)
            commit(self.api, s.vp, staged, overwrite=s.overwrite)
        finally:
            os.unlink(staged)
        with self._lock:
            self._drop(s)
        return Reply(body={})

    def download_url(self, req: Request) -> Reply:
        """``POST /api/2.0/fs/create-download-url?path=...&expire_time=...``."""
        vp = parse_path(urllib.parse.quote(req.query.get("path", "")), is_dir=False)
        check(self.api, req.who, "open_read", vp)
        ttl = URL_TTL
        if req.query.get("expire_time"):
            try:
                when = datetime.datetime.fromisoformat(req.query["expire_time"])
            except ValueError:
                raise bad_request("expire_time must be an RFC 3339 time") from None
            ttl = min(max(when.timestamp() - time.time(), 0.0), URL_TTL)
        key = secrets.token_urlsafe(32)
        with self._lock:
            self._expire(time.monotonic())
            self._downloads[key] = DownloadUrl(req.who, vp, time.monotonic() + ttl)
        return Reply(body={"url": f"{req.base_url}{DOWNLOAD_URL}{key}", "headers": []})

    # -- the capability URLs (no credentials) -----------------------------------------------

    def put_part(self, req: Request, rest: str) -> Reply:
        token, _, number = rest.partition("/")
        with self._lock:
            s = self._sessions.get(token)
        if s is None:
            return Reply(403, EXPIRED, {"Content-Type": "application/xml"})
        try:
            n = int(number)
        except ValueError:
            raise bad_request(f"bad part number {number!r}") from None
        if not 1 <= n <= self.api.limits.max_parts:
            raise bad_request(f"parts are numbered 1 to {self.api.limits.max_parts}")
        limit = self.api.limits.max_file
        with self._lock:  # reserve the part's size: parallel parts stay within the limit
            held = sum(size for k, (size, _e) in s.parts.items() if k != n)
            if req.body.length > limit - held:
                raise ApiError(
                    413,
                    "INVALID_PARAMETER_VALUE",
                    f"part {n} of {req.body.length} bytes: the upload may write at "
                    f"most {limit} bytes",
                )
            s.parts[n] = (req.body.length, "")
        path = os.path.join(s.directory, str(n))
        md5 = hashlib.md5(usedforsecurity=False)
        try:
            size = req.body.to_file(path, limit)
            with open(path, "rb") as f:
                while chunk := f.read(1 << 20):
                    md5.update(chunk)
        except BaseException:
            with self._lock:
                s.parts.pop(n, None)
            raise
        etag = md5.hexdigest()
        with self._lock:
            s.parts[n] = (size, etag)
            s.used = time.monotonic()
        return Reply(200, b"", {"ETag": f'"{etag}"'})

    def get_download(self, req: Request, key: str) -> Reply:
        with self._lock:
            d = self._downloads.get(key)
        if d is None or d.expires < time.monotonic():
            return Reply(403, EXPIRED, {"Content-Type": "application/xml"})
        check(self.api, d.who, "open_read", d.vp)
        return serve_file(self.api, req, d.vp)


def is_file_action(req: Request) -> bool:
    return req.method == "POST" and req.raw_path.startswith(FILES + "/")
