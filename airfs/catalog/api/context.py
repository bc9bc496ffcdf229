"""What every handler gets (:class:`Request`, :class:`Api`) and returns (:class:`Reply`); the
HTTP details stay in :mod:`.server`."""

from __future__ import annotations

import base64
import binascii
import json
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, BinaryIO

from airfs.catalog.model import Metastore, Who
from airfs.catalog.store import CatalogStore
from airfs.origin.base import Origin

from .errors import ApiError, bad_request

#: the largest JSON request body taken (a catalog request is a few hundred bytes)
MAX_JSON_BODY = 1 << 20


def page_token(after: str) -> str:
    """The opaque ``next_page_token`` of a page whose last name is ``after``."""
    return base64.urlsafe_b64encode(after.encode()).decode().rstrip("=")


def page_after(token: str) -> str:
    """The name a ``page_token`` continues after (400 for a token not made here)."""
    try:
        raw = base64.b64decode(token + "=" * (-len(token) % 4), altchars=b"-_", validate=True)
        return raw.decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise bad_request(f"bad page_token {token!r}") from None


@dataclass(frozen=True, slots=True)
class Limits:
    """``max_file``: the largest file a single PUT or a multipart upload may write;
    ``max_parts``: the parts of one multipart upload; ``max_sessions``: open upload sessions."""

    max_file: int = 5 << 30
    max_parts: int = 10000
    max_sessions: int = 64


class Body:
    """A request body of ``length`` bytes; ``left`` counts what is not read yet."""

    def __init__(self, stream: BinaryIO, length: int) -> None:
        self.stream = stream
        self.length = length
        self.left = length

    def _read(self, n: int) -> bytes:
        chunk = self.stream.read(min(n, self.left))
        self.left -= len(chunk)
        if not chunk and n:
            self.left = 0
            raise bad_request("request body shorter than its Content-Length")
        return chunk

    def json(self) -> dict[str, Any]:
        """The body as a JSON object (``{}`` when empty); 400 for anything else."""
        if self.length > MAX_JSON_BODY:
            raise ApiError(
                413,
                "INVALID_PARAMETER_VALUE",
                f"request body of {self.length} bytes: at most {MAX_JSON_BODY}",
            )
        raw = self._read(self.left) if self.left else b""
        if not raw.strip():
            return {}
        try:
            out = json.loads(raw)
        except ValueError as exc:
            raise ApiError(400, "MALFORMED_REQUEST", f"request body is not JSON: {exc}") from None
        if not isinstance(out, dict):
            raise bad_request("request body must be a JSON object")
        return out

    def to_file(self, path: str, limit: int) -> int:
        """Copy the body to local file ``path`` (at most ``limit`` bytes: 413 above, nothing
        read)."""
        if self.length > limit:
            raise ApiError(
                413,
                "INVALID_PARAMETER_VALUE",
                f"body of {self.length} bytes: at most {limit} taken",
            )
        with open(path, "wb") as f:
            while self.left:
                f.write(self._read(1 << 20))
        return self.length

    def drain(self) -> None:
        """Read what nobody read (keeps the connection usable)."""
        while self.left:
            self._read(1 << 20)


@dataclass
class Request:
    """One authenticated call: ``path`` is the part after the API prefix, percent-decoded
    by the handler that needs it (``raw_path`` keeps the escapes)."""

    method: str
    raw_path: str
    query: Mapping[str, str]
    headers: Mapping[str, str]
    who: Who
    principal: str
    body: Body
    #: ``http://host:port`` as the client reached this server (for URLs given back)
    base_url: str = ""
    #: whether to write privileges with underscores (databricks-sdk) or spaces (UC OSS)
    underscores: bool = False


@dataclass
class Reply:
    status: int = 200
    body: Any = None  # a JSON-able object, or bytes
    headers: dict[str, str] = field(default_factory=dict)
    #: streamed after the headers (Content-Length must be set)
    stream: Iterator[bytes] | None = None


class Api:
    """The server's state: the origin, its catalog store and the staging directory."""

    def __init__(self, origin: Origin, *, stage_dir: str, limits: Limits | None = None) -> None:
        self.origin = origin
        self.store = CatalogStore(origin, tmp_dir=stage_dir)
        self.stage_dir = stage_dir
        self.limits = limits or Limits()
        os.makedirs(stage_dir, exist_ok=True)

    def meta(self) -> Metastore:
        """The catalog as it is at the origin now (503 when there is none)."""
        meta, _version = self.store.load()
        if meta is None:
            raise ApiError(
                503, "TEMPORARILY_UNAVAILABLE", "this origin has no catalog (airfs catalog init)"
            )
        return meta


Handler = Callable[[Api, Request], Reply]
