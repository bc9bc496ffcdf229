"""Bearer tokens for the REST API, stored hashed next to the catalog at the origin.

A token is ``airfs-<id>-<secret>`` (``secret``: 32 random bytes, hex); only its SHA-256 is kept,
in :data:`TOKENS_PATH` (inside the reserved directory, which no mount shows), with the
principal it acts as and that principal's groups. The groups are stored with the token (given
at ``token create``), not looked up anywhere: the API server has no local users to ask, and a
token names exactly who it acts as. Changes are conditional writes on the document's version
(re-applied when another admin changed it meanwhile), as for the catalog. A revoked token
stops working at the server's next request (every request checks the document's version).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Any

from airfs.catalog.model import RESERVED, CatalogError, Who, check_principal
from airfs.origin.base import Conflict, Exists, NotFound, Origin

TOKENS_PATH = f"{RESERVED}/api-tokens.json"
FORMAT = 1
PREFIX = "airfs-"


@dataclass(frozen=True, slots=True)
class Token:
    """One stored token (its secret is not kept)."""

    id: str
    sha256: str
    principal: str
    groups: tuple[str, ...]
    created_at_ms: int
    comment: str = ""

    def who(self) -> Who:
        """The caller this token acts as: its principal and ``group:NAME`` for each group;
        never root (an API caller is an admin only if the catalog names it one)."""
        return Who(frozenset({self.principal, *(f"group:{g}" for g in self.groups)}))

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "sha256": self.sha256,
            "principal": self.principal,
            "groups": list(self.groups),
            "created_at": self.created_at_ms,
            "comment": self.comment,
        }

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Token:
        return cls(
            id=str(obj["id"]),
            sha256=str(obj["sha256"]),
            principal=check_principal(str(obj["principal"])),
            groups=tuple(str(g) for g in obj.get("groups", [])),
            created_at_ms=int(obj.get("created_at", 0)),
            comment=str(obj.get("comment", "")),
        )

    def public(self) -> dict[str, Any]:
        """What ``token list`` shows (no hash)."""
        out = self.to_json()
        del out["sha256"]
        return out


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


class TokenStore:
    """The token document at ``origin``; thread-safe. :meth:`verify` re-reads the document
    only when its version changed (one ``stat`` per call)."""

    def __init__(self, origin: Origin, *, attempts: int = 20) -> None:
        self.origin = origin
        self.attempts = attempts
        self._lock = threading.Lock()
        self._version: str | None = None
        self._by_hash: dict[str, Token] = {}

    def _load(self) -> tuple[list[Token], str]:
        for _ in range(3):
            try:
                entry = self.origin.stat(TOKENS_PATH)
                raw = self.origin.read_range(TOKENS_PATH, 0, entry.size + 1, entry.version)
            except NotFound:
                return [], ""
            except Conflict:
                continue
            try:
                doc = json.loads(raw)
                if doc.get("format") != FORMAT:
                    raise ValueError(f"not format {FORMAT}")
                return [Token.from_json(t) for t in doc["tokens"]], entry.version
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                raise CatalogError(f"{TOKENS_PATH} at the origin is damaged: {exc}") from None
        raise CatalogError(f"{TOKENS_PATH} keeps changing while it is read; try again")

    def _put(self, tokens: list[Token], if_match: str) -> None:
        with contextlib.suppress(Exists):
            self.origin.mkdir(RESERVED, 0o700)
        fd, tmp = tempfile.mkstemp(prefix="airfs-tokens-")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump({"format": FORMAT, "tokens": [t.to_json() for t in tokens]}, f, indent=1)
                f.write("\n")
            self.origin.put(TOKENS_PATH, tmp, if_match, mode=0o600)
        finally:
            os.unlink(tmp)

    def _update(self, change: Any) -> Any:
        for _ in range(self.attempts):
            tokens, version = self._load()
            new, out = change(tokens)
            try:
                self._put(new, version)
            except Conflict:
                time.sleep(0.01)
                continue
            return out
        raise CatalogError("the token list keeps changing (other admins are busy); try again")

    def create(self, principal: str, groups: list[str], comment: str = "") -> tuple[str, Token]:
        """A new token for ``principal`` in ``groups``: (the token text, shown once; its
        record)."""
        check_principal(principal)
        for g in groups:
            check_principal(f"group:{g}")
        tid = secrets.token_hex(6)
        text = f"{PREFIX}{tid}-{secrets.token_hex(32)}"
        tok = Token(tid, digest(text), principal, tuple(groups), int(time.time() * 1000), comment)
        self._update(lambda tokens: ([*tokens, tok], None))
        return text, tok

    def list(self) -> list[Token]:
        return self._load()[0]

    def revoke(self, token_id: str) -> Token:
        """Remove the token ``token_id`` (its id, as ``list`` shows); CatalogError if none."""

        def change(tokens: list[Token]) -> tuple[list[Token], Token]:
            for t in tokens:
                if t.id == token_id:
                    return [x for x in tokens if x.id != token_id], t
            raise CatalogError(f"no token {token_id!r} (see airfs catalog token list)")

        out: Token = self._update(change)
        return out

    def verify(self, text: str) -> Token | None:
        """The token whose text is ``text``, or None (unknown, revoked, malformed)."""
        if not text.startswith(PREFIX) or len(text) > 200:
            return None
        try:
            entry = self.origin.stat(TOKENS_PATH)
            version = entry.version
        except NotFound:
            version = ""
        with self._lock:
            if version != self._version:
                tokens, version = self._load()
                self._by_hash = {t.sha256: t for t in tokens}
                self._version = version
            return self._by_hash.get(digest(text))
