"""Tables in the catalog: the :class:`Table` securable (under a schema, beside its volumes),
where its files are, and :class:`TableIndex`, which finds the table a mount path belongs to.

A table has Unity Catalog's fields: ``table_type`` ``MANAGED`` or ``EXTERNAL``,
``data_source_format`` ``DELTA`` or ``PARQUET``, a storage location, a comment, an owner,
grants (``SELECT``, ``MODIFY``, ``MANAGE``, ``ALL PRIVILEGES``), creation and update times
(milliseconds since the epoch, as UC returns them), who made and last changed it, a
``table_id`` (a UUID) and, optionally, the columns and properties a client registered (kept
as given; airfs reads the schema from the files).

Locations are paths relative to the origin root (the mount's root): ``main/default/raw/sales``
is ``/Volumes/main/default/raw/sales`` on a mount at ``/Volumes``. A *managed* table's files
are at :func:`managed_location` — ``CAT/SCH/.table-NAME``, a directory at the schema level
that is no volume (no volume or table name starts with ``.``) and that only holders of the
table's privileges see. An *external* table's location is inside a managed volume
(``CAT/SCH/VOL/...``) or outside every catalog (a path at the origin whose first name is
not a catalog); never inside :data:`~.names.RESERVED`, at or above a catalog level, or
overlapping another table's location.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from .names import RESERVED, CatalogError, Privilege, check_principal, parse_privilege

TABLE_TYPES = ("MANAGED", "EXTERNAL")
FORMATS = ("DELTA", "PARQUET")
#: the prefix of a managed table's directory at the schema level
MANAGED_PREFIX = ".table-"


def managed_location(catalog: str, schema: str, table: str) -> str:
    """Where airfs keeps managed table ``catalog.schema.table`` (origin-relative)."""
    return f"{catalog}/{schema}/{MANAGED_PREFIX}{table}"


def check_format(text: str) -> str:
    """``delta``/``DELTA``/``parquet`` → ``DELTA``/``PARQUET``."""
    fmt = text.strip().upper()
    if fmt not in FORMATS:
        raise CatalogError(f"bad table format {text!r}: DELTA or PARQUET")
    return fmt


def check_table_path(text: str) -> str:
    """An origin-relative location (``a/b/c``, no ``.``/``..``/empty parts, not reserved)."""
    path = text.strip().strip("/")
    parts = path.split("/") if path else []
    if not parts or any(p in ("", ".", "..") or "\0" in p for p in parts):
        raise CatalogError(f"bad table location {text!r}: a path relative to the origin root")
    if parts[0] == RESERVED:
        raise CatalogError(f"bad table location {text!r}: {RESERVED} is reserved")
    return path


@dataclass
class Table:
    """A table: see the module docstring. ``location`` is origin-relative."""

    owner: str
    table_type: str
    data_source_format: str
    location: str
    grants: dict[str, set[Privilege]] = field(default_factory=dict)
    comment: str = ""
    created_at: int = 0
    updated_at: int = 0
    created_by: str = ""
    updated_by: str = ""
    table_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    columns: list[dict[str, Any]] = field(default_factory=list)
    properties: dict[str, str] = field(default_factory=dict)

    @property
    def managed(self) -> bool:
        return self.table_type == "MANAGED"

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "owner": self.owner,
            "grants": {p: sorted(x.value for x in s) for p, s in sorted(self.grants.items()) if s},
            "table_type": self.table_type,
            "data_source_format": self.data_source_format,
            "location": self.location,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
            "created_by": self.created_by,
            "updated_by": self.updated_by,
            "table_id": self.table_id,
        }
        if self.comment:
            out["comment"] = self.comment
        if self.columns:
            out["columns"] = self.columns
        if self.properties:
            out["properties"] = dict(sorted(self.properties.items()))
        return out

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Table:
        kind = str(obj["table_type"]).upper()
        if kind not in TABLE_TYPES:
            raise CatalogError(f"bad table_type {kind!r}")
        columns = obj.get("columns", [])
        props = obj.get("properties", {})
        if not isinstance(columns, list) or not isinstance(props, dict):
            raise CatalogError("bad table columns or properties")
        return cls(
            owner=check_principal(obj["owner"]),
            table_type=kind,
            data_source_format=check_format(str(obj["data_source_format"])),
            location=check_table_path(str(obj["location"])),
            grants={
                check_principal(p): {parse_privilege(x) for x in privs}
                for p, privs in obj.get("grants", {}).items()
            },
            comment=str(obj.get("comment", "")),
            created_at=int(obj.get("created_at", 0)),
            updated_at=int(obj.get("updated_at", 0)),
            created_by=str(obj.get("created_by", "")),
            updated_by=str(obj.get("updated_by", "")),
            table_id=str(obj.get("table_id") or uuid.uuid4()),
            columns=[dict(c) for c in columns],
            properties={str(k): str(v) for k, v in props.items()},
        )


#: how a path relates to a table's location: at it, under it, or above it (an ancestor)
AT, UNDER, ABOVE = "at", "under", "above"


@dataclass(frozen=True, slots=True)
class TableMatch:
    """The tables a mount path concerns: ``relation`` :data:`AT` / :data:`UNDER` (one table,
    ``tables[0]``) or :data:`ABOVE` (the path is a directory on the way to each of
    ``tables``' locations)."""

    relation: str
    tables: tuple[tuple[str, str, str], ...]
    location: str = ""


class TableIndex:
    """The tables of a catalog by location, for :meth:`match` (built once per document)."""

    def __init__(self, tables: dict[str, tuple[str, str, str]]) -> None:
        self.by_location = tables
        self.depth = max((loc.count("/") + 1 for loc in tables), default=0)
        above: dict[str, list[tuple[str, str, str]]] = {}
        for loc, names in tables.items():
            parts = loc.split("/")
            for i in range(1, len(parts)):
                above.setdefault("/".join(parts[:i]), []).append(names)
        self.above = {k: tuple(sorted(v)) for k, v in above.items()}

    def match(self, path: str) -> TableMatch | None:
        """The table ``path`` (origin-relative, ``""`` the root) is at, under or above."""
        if not self.by_location or not path:
            return None
        parts = path.split("/")
        for i in range(1, min(len(parts), self.depth) + 1):
            loc = "/".join(parts[:i])
            names = self.by_location.get(loc)
            if names is not None:
                return TableMatch(AT if i == len(parts) else UNDER, (names,), loc)
        hit = self.above.get(path)
        return TableMatch(ABOVE, hit) if hit is not None else None
