"""Tables by name: ``catalog.schema.table`` resolved through the catalog of an airfs mount.

A name is looked up by the daemon of the mount at ``root`` (default: the environment variable
``AIRFS_VOLUMES``, else ``/Volumes``), over its control socket, with this process's own
credentials: the daemon answers with the table's registered format, type and location and the
caller's privileges on it (``airfs catalog describe TABLE NAME``), by the same rules as the
mount. Reading needs ``SELECT``, writing ``MODIFY``; a missing one is a ``PermissionError``
naming it. A name the caller may not see (no ``USE CATALOG`` / ``USE SCHEMA``) and a missing
one are the same :class:`~airfs.tables.source.TableError`.
"""

from __future__ import annotations

import errno
import os
import re
from dataclasses import dataclass

from ..control import client

#: ``catalog.schema.table`` (Unity Catalog's three-level name)
_PART = r"[A-Za-z0-9_][A-Za-z0-9_-]*"
NAME = re.compile(rf"^{_PART}\.{_PART}\.{_PART}$")
DEFAULT_ROOT = "/Volumes"


class UnresolvedName(ValueError):
    """Raised (as :class:`~airfs.tables.source.TableError`) by :func:`lookup`; see there."""


@dataclass(frozen=True)
class Registered:
    """A table as the catalog registers it, with its files' local path on the mount."""

    name: str
    path: str
    data_source_format: str  # "DELTA" or "PARQUET"
    table_type: str  # "MANAGED" or "EXTERNAL"
    privileges: frozenset[str]
    mountpoint: str


def is_name(text: str) -> bool:
    """Whether ``text`` has the form of a table name (and no ``/``)."""
    return "/" not in text and NAME.match(text) is not None


def volumes_root(root: str | os.PathLike[str] | None = None) -> str:
    """The mountpoint names resolve through: ``root``, ``$AIRFS_VOLUMES`` or ``/Volumes``."""
    if root is not None:
        return os.fspath(root)
    return os.environ.get("AIRFS_VOLUMES") or DEFAULT_ROOT


def lookup(
    name: str, *, root: str | os.PathLike[str] | None = None, access: str = "read"
) -> Registered:
    """Table ``name`` as the catalog of the mount at ``root`` shows it to this process.

    ``access`` ``"read"`` needs ``SELECT``, ``"write"`` needs ``MODIFY``: without it,
    ``PermissionError`` (EACCES) naming the privilege and the table. Not a mount, an
    ungoverned one, or a table that does not exist (or that the caller may not see): ``ValueError``
    (:class:`UnresolvedName`, turned into ``TableError`` by the caller) with the reason."""
    where = volumes_root(root)
    mp = client.find_mount(where)
    if mp is None or os.path.realpath(where) != mp:
        raise UnresolvedName(
            f"{name!r} is a catalog.schema.table name, resolved through an airfs mount, and "
            f"{where} is not one (mount airfs there, set AIRFS_VOLUMES or pass root=)"
        )
    try:
        info = client.request(
            mp, "catalog", command="describe", args={"type": "TABLE", "name": name}, timeout=60
        )
    except client.ControlError as exc:
        if exc.errno == errno.ENOENT:
            raise UnresolvedName(
                f"table {name} does not exist at {mp}, or you may not see it (it needs USE "
                "CATALOG and USE SCHEMA)"
            ) from None
        raise UnresolvedName(f"table {name}: {exc}") from None
    except TimeoutError as exc:
        raise UnresolvedName(f"table {name}: the daemon of {mp} did not answer ({exc})") from None
    held = frozenset(str(p) for p in info.get("privileges", []))
    need = "SELECT" if access == "read" else "MODIFY"
    if need not in held:
        raise PermissionError(
            errno.EACCES,
            f"table {name}: permission denied: needs {need} on table {name} (see airfs "
            f"catalog show-grants --type TABLE {name})",
        )
    return Registered(
        name=name,
        path=os.path.join(mp, str(info["location"])),
        data_source_format=str(info["data_source_format"]),
        table_type=str(info["table_type"]),
        privileges=held,
        mountpoint=mp,
    )
