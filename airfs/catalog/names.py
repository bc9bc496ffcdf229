"""The catalog's vocabulary: reserved names, the error type, Unity Catalog's privileges and
the checks of names, principals and locations (shared by :mod:`.model` and :mod:`.table`)."""

from __future__ import annotations

import enum
import errno
import re

#: where the catalog lives at the origin root; invisible and unreachable through the mount
RESERVED = ".airfs-catalog"

_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_-]{0,254}$")
_PRINCIPAL = re.compile(r"^(group:)?[^\s:/][^\s/]{0,254}$")


class CatalogError(ValueError):
    """A request the model refuses (bad name, unknown object, not allowed); the message is the
    one line shown to the user; ``errno`` the error a daemon answers with."""

    def __init__(self, message: str, err: int = errno.EINVAL) -> None:
        super().__init__(message)
        self.errno = err


class Privilege(enum.Enum):
    USE_CATALOG = "USE CATALOG"
    USE_SCHEMA = "USE SCHEMA"
    READ_VOLUME = "READ VOLUME"
    WRITE_VOLUME = "WRITE VOLUME"
    CREATE_VOLUME = "CREATE VOLUME"
    CREATE_SCHEMA = "CREATE SCHEMA"
    SELECT = "SELECT"
    MODIFY = "MODIFY"
    CREATE_TABLE = "CREATE TABLE"
    MANAGE = "MANAGE"
    ALL_PRIVILEGES = "ALL PRIVILEGES"

    def __str__(self) -> str:
        return self.value


P = Privilege


def parse_privilege(text: str) -> Privilege:
    """``'READ VOLUME'``, ``READ_VOLUME``, ``read volume`` → :attr:`Privilege.READ_VOLUME`."""
    key = " ".join(text.replace("_", " ").split()).upper()
    for p in Privilege:
        if p.value == key:
            return p
    names = ", ".join(p.value for p in Privilege)
    raise CatalogError(f"unknown privilege {text!r} (one of {names})")


def check_name(name: str, what: str) -> str:
    if not _NAME.match(name):
        raise CatalogError(
            f"bad {what} name {name!r}: letters, digits, '_' and '-' only (not first), "
            "1 to 255 characters"
        )
    return name


def check_principal(text: str) -> str:
    """A user name or ``group:NAME`` (no spaces or slashes)."""
    if not _PRINCIPAL.match(text) or text == "group:":
        raise CatalogError(f"bad principal {text!r}: a user name or group:NAME")
    return text


def check_location(url: str) -> str:
    """An external volume's location: ``s3://BUCKET[/PREFIX]`` or an absolute directory."""
    if url.startswith("s3://"):
        bucket = url[5:].split("/", 1)[0]
        if not re.match(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$", bucket):
            raise CatalogError(f"bad location {url!r}: not an s3://BUCKET[/PREFIX] URL")
        return url.rstrip("/")
    path = url.removeprefix("file://")
    if not path.startswith("/") or "\0" in path or "/../" in path + "/":
        raise CatalogError(f"bad location {url!r}: an s3:// URL or an absolute directory")
    return path.rstrip("/") or "/"
