"""The checks the catalog commands share (:mod:`.commands`, :mod:`.tablecmds`): names,
visibility (a hidden object and a missing one answer alike: ENOENT), privileges held
(EACCES), and the object a typed request names."""

from __future__ import annotations

import errno
import time
from typing import Any

from .model import (
    LEVELS,
    RESERVED,
    CatalogError,
    Metastore,
    P,
    Privilege,
    Securable,
    Who,
    allowed,
    check_name,
    check_principal,
    is_admin,
    privileges,
)
from .table import Table

#: securable types (``--type`` / ``securable_type``) → the depth of their names
TYPES = {"catalog": 1, "schema": 2, "volume": 3, "table": 3}


#: where the store keeps the files of dropped managed volumes and tables (inside the reserved
#: directory: unreachable through every mount, for admins to restore or delete at the origin)
DROPPED_DIR = f"{RESERVED}/dropped"


def dropped_path(names: tuple[str, ...], serial: int) -> str:
    """Where the files of managed volume or table ``names`` go when the catalog change of
    ``serial`` drops it."""
    return f"{DROPPED_DIR}/{'.'.join(names)}@{serial}"


def now_ms() -> int:
    """Milliseconds since the epoch (Unity Catalog's timestamps)."""
    return int(time.time() * 1000)


def parse_name(text: str, depth: int | None = None, kind: str | None = None) -> tuple[str, ...]:
    """``"main.raw.images"`` → its parts, each a valid name; ``depth`` (1-3) if given;
    ``kind`` names the third part in messages (``"table"``; default ``"volume"``)."""
    parts = tuple(text.split(".")) if text else ()
    third = (kind or "volume").upper()
    if not parts or len(parts) > 3 or (depth is not None and len(parts) != depth):
        want = {1: "CATALOG", 2: "CATALOG.SCHEMA", 3: f"CATALOG.SCHEMA.{third}"}
        form = want.get(depth or 0, f"CATALOG[.SCHEMA[.{third}]]")
        raise CatalogError(f"bad name {text!r}: expected {form}")
    for i, n in enumerate(parts):
        check_name(n, kind if kind and i == 2 else LEVELS[i + 1])
    return parts


def refuse(message: str) -> CatalogError:
    return CatalogError(message, errno.EACCES)


def visible_object(meta: Metastore, w: Who, names: tuple[str, ...]) -> Securable:
    """The object, if it exists and ``w`` may see it (same answer either way: ENOENT)."""
    found = meta.find(names)
    path = "/".join(names)
    dotted = ".".join(names)
    if found is None or not allowed(meta, w, "lookup", path).ok:
        raise CatalogError(f"{LEVELS[len(names)]} {dotted} does not exist", errno.ENOENT)
    return found[-1]


def visible_table(meta: Metastore, w: Who, names: tuple[str, ...]) -> Table:
    """Table ``names`` if it exists and ``w`` may see it: ``USE CATALOG`` and ``USE SCHEMA``
    (as a volume's name), else ENOENT, the same answer as for a missing one."""
    t = meta.table(names)
    shown = t is not None and (
        is_admin(meta, w)
        or (
            P.USE_CATALOG in (privileges(meta, w, names[:1]) or frozenset())
            and P.USE_SCHEMA in (privileges(meta, w, names[:2]) or frozenset())
        )
    )
    if t is None or not shown:
        raise CatalogError(f"table {'.'.join(names)} does not exist", errno.ENOENT)
    return t


def need(
    meta: Metastore, w: Who, names: tuple[str, ...], *privs: Privilege, table: bool = False
) -> None:
    held = privileges(meta, w, names, table=table) or frozenset()
    for p in privs:
        if p not in held:
            kind = "table" if table else LEVELS[len(names)]
            raise refuse(f"{w.name} lacks {p} on {kind} {'.'.join(names)}")


def use_parents(meta: Metastore, w: Who, names: tuple[str, ...]) -> None:
    if len(names) >= 2:
        need(meta, w, names[:1], P.USE_CATALOG)
    if len(names) >= 3:
        need(meta, w, names[:2], P.USE_SCHEMA)


def manage(meta: Metastore, w: Who, names: tuple[str, ...]) -> Securable:
    obj = visible_object(meta, w, names)
    use_parents(meta, w, names)
    need(meta, w, names, P.MANAGE)
    return obj


def manage_table(meta: Metastore, w: Who, names: tuple[str, ...]) -> Table:
    t = visible_table(meta, w, names)
    use_parents(meta, w, names)
    need(meta, w, names, P.MANAGE, table=True)
    return t


def children(meta: Metastore, names: tuple[str, ...]) -> dict[str, Securable]:
    if not names:
        return meta.catalogs
    found = meta.find(names)
    assert found is not None
    return found[-1].children


def typed(args: dict[str, Any]) -> tuple[str, tuple[str, ...]]:
    """The securable type (lower case) and name of a request's ``type`` and ``name``."""
    kind = str(args.get("type", "")).lower()
    if kind not in TYPES:
        raise CatalogError(
            f"bad securable type {args.get('type')!r}: CATALOG, SCHEMA, VOLUME or TABLE"
        )
    return kind, parse_name(str(args["name"]), TYPES[kind], kind if kind == "table" else None)


def managed_target(meta: Metastore, w: Who, kind: str, names: tuple[str, ...]) -> Securable | Table:
    """The object a grant, revoke, set-owner or update acts on (``MANAGE`` checked)."""
    return manage_table(meta, w, names) if kind == "table" else manage(meta, w, names)


def creator(w: Who, args: dict[str, Any]) -> str:
    return check_principal(str(args["owner"])) if args.get("owner") else w.name
