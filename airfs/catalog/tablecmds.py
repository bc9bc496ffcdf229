"""The table commands and ``describe``/``update`` for every securable, as pure functions over a
:class:`~airfs.catalog.model.Metastore` (the same contract as :mod:`.commands`).

Who may do what (Unity Catalog's rules):

* ``create-table C.S.T`` — ``USE CATALOG``, ``USE SCHEMA`` and ``CREATE TABLE`` on C.S. With
  ``location`` (an *external* table): a path inside a managed volume needs ``READ VOLUME``
  and ``WRITE VOLUME`` on that volume (whoever registers a table over files gives its grantees
  a way to them, so they must be the registrant's to give); a path outside every catalog is
  for admins only, and at least three levels deep (the mount's three top levels take no
  files). Without it (a *managed* table) airfs keeps the files at
  :func:`~.table.managed_location`. A table and a volume of one schema never share a name;
  two tables never share (or nest) a location.
* ``drop-table`` — ``MANAGE`` on the table (owners have it) and ``USE`` above. A managed
  table's files are moved aside by the store (like a managed volume's); an external table's
  files stay where they are.
* ``show-tables C.S`` and ``describe`` — what a caller with ``USE CATALOG`` and ``USE SCHEMA``
  sees (admins: everything); the answer includes the caller's own privileges on the object.
* ``update`` (``comment``, ``owner``; a volume's ``immutable``) — ``MANAGE`` on the object.
  An immutable volume's files are declared never to change at the origin: mounts trust the
  names and versions they know of it until ``airfs refresh`` or a remount (seen by every
  node within its catalog TTL; writes through a mount still work).
"""

from __future__ import annotations

import errno
from typing import Any

from .checks import (
    creator,
    dropped_path,
    manage_table,
    managed_target,
    need,
    now_ms,
    parse_name,
    refuse,
    typed,
    use_parents,
    visible_object,
    visible_table,
)
from .model import CatalogError, Metastore, P, Securable, Who, is_admin, privileges
from .table import Table, check_format, check_table_path, managed_location

Result = tuple[Metastore | None, Any]


def table_info(meta: Metastore, w: Who, names: tuple[str, ...], t: Table) -> dict[str, Any]:
    """What ``describe`` and ``show-tables`` answer for table ``names``."""
    held = privileges(meta, w, names, table=True) or frozenset()
    out = t.to_json()
    out.pop("grants")
    out.update(
        {
            "name": names[2],
            "catalog_name": names[0],
            "schema_name": names[1],
            "full_name": ".".join(names),
            "type": "table",
            "privileges": sorted(p.value for p in held),
        }
    )
    return out


def _check_external(meta: Metastore, w: Who, location: str, names: tuple[str, ...]) -> None:
    parts = location.split("/")
    dotted = ".".join(names)
    if parts[0] in meta.catalogs:
        vol = tuple(parts[:3])
        found = meta.find(vol) if len(parts) >= 4 else None
        if found is None:
            raise CatalogError(
                f"bad location {location!r} for table {dotted}: inside catalog {parts[0]} a "
                "table's files are inside a volume (CAT/SCH/VOL/PATH)"
            )
        if found[-1].location is not None:
            raise CatalogError(
                f"bad location {location!r}: volume {'.'.join(vol)} is external (not served)"
            )
        if not is_admin(meta, w):
            use_parents(meta, w, vol)
            need(meta, w, vol, P.READ_VOLUME, P.WRITE_VOLUME)
    elif not is_admin(meta, w):
        raise refuse(
            f"{w.name} is not a catalog admin (only admins register tables outside volumes)"
        )
    elif len(parts) < 3:
        raise CatalogError(
            f"bad location {location!r} for table {dotted}: outside the catalogs a table's "
            "location has at least three levels (TOP/A/B): the mount's three top levels take "
            "no files"
        )
    for other, onames in meta.tables().items():
        if (
            other == location
            or location.startswith(other + "/")
            or other.startswith(location + "/")
        ):
            raise CatalogError(
                f"location {location!r} overlaps that of table {'.'.join(onames)} ({other})",
                errno.EEXIST,
            )


def create_table(meta: Metastore, w: Who, args: dict[str, Any]) -> Result:
    names = parse_name(str(args["name"]), 3, "table")
    schema = visible_object(meta, w, names[:2])
    use_parents(meta, w, names)
    need(meta, w, names[:2], P.USE_SCHEMA, P.CREATE_TABLE)
    dotted = ".".join(names)
    if names[2] in schema.tables:
        raise CatalogError(f"table {dotted} exists already", errno.EEXIST)
    if names[2] in schema.children:
        raise CatalogError(f"{dotted} is a volume: a table cannot take its name", errno.EEXIST)
    fmt = check_format(str(args.get("format") or "DELTA"))
    if args.get("location"):
        location = check_table_path(str(args["location"]))
        _check_external(meta, w, location, names)
        kind = "EXTERNAL"
    else:
        location, kind = managed_location(*names), "MANAGED"
    columns = args.get("columns") or []
    props = args.get("properties") or {}
    if not isinstance(columns, list) or not all(isinstance(c, dict) for c in columns):
        raise CatalogError("columns: a list of objects")
    if not isinstance(props, dict):
        raise CatalogError("properties: an object of strings")
    now = now_ms()
    t = Table(
        owner=creator(w, args),
        table_type=kind,
        data_source_format=fmt,
        location=location,
        comment=str(args.get("comment") or ""),
        created_at=now,
        updated_at=now,
        created_by=w.name,
        updated_by=w.name,
        columns=[dict(c) for c in columns],
        properties={str(k): str(v) for k, v in props.items()},
    )
    schema.tables[names[2]] = t
    out = table_info(meta, w, names, t)
    out["created"] = dotted
    return meta, out


def drop_table(meta: Metastore, w: Who, args: dict[str, Any]) -> Result:
    names = parse_name(str(args["name"]), 3, "table")
    t = manage_table(meta, w, names)
    found = meta.find(names[:2])
    assert found is not None
    del found[-1].tables[names[2]]
    out: dict[str, Any] = {"dropped": ".".join(names), "table_type": t.table_type}
    if t.managed:
        out["moves"] = [t.location, dropped_path(names, meta.serial + 1)]
    return meta, out


def show_tables(meta: Metastore, w: Who, args: dict[str, Any]) -> Result:
    names = parse_name(str(args["name"]), 2)
    schema = visible_object(meta, w, names)
    need(meta, w, names[:1], P.USE_CATALOG)
    need(meta, w, names, P.USE_SCHEMA)
    return None, [table_info(meta, w, (*names, n), t) for n, t in sorted(schema.tables.items())]


def _securable_info(
    meta: Metastore, w: Who, kind: str, names: tuple[str, ...], obj: Securable
) -> dict[str, Any]:
    held = privileges(meta, w, names) or frozenset()
    out: dict[str, Any] = {
        "name": names[-1],
        "full_name": ".".join(names),
        "type": kind,
        "owner": obj.owner,
        "comment": obj.comment,
        "created_at": obj.created_at,
        "updated_at": obj.updated_at,
        "privileges": sorted(p.value for p in held),
    }
    if len(names) >= 2:
        out["catalog_name"] = names[0]
    if len(names) == 3:
        out["schema_name"] = names[1]
        out["volume_type"] = "EXTERNAL" if obj.location is not None else "MANAGED"
        out["location"] = obj.location or "/".join(names)
        out["immutable"] = obj.immutable
    return out


def describe(meta: Metastore, w: Who, args: dict[str, Any]) -> Result:
    kind, names = typed(args)
    if kind == "table":
        return None, table_info(meta, w, names, visible_table(meta, w, names))
    obj = visible_object(meta, w, names)
    return None, _securable_info(meta, w, kind, names, obj)


def update(meta: Metastore, w: Who, args: dict[str, Any]) -> Result:
    kind, names = typed(args)
    immutable = parse_flag(args.get("immutable"))
    if args.get("comment") is None and not args.get("owner") and immutable is None:
        raise CatalogError("update: nothing to change (comment, owner, immutable)")
    if immutable is not None and kind != "volume":
        what = ".".join(names)
        raise CatalogError(f"update: only a volume can be immutable ({what} is a {kind})")
    obj = managed_target(meta, w, kind, names)
    if args.get("comment") is not None:
        obj.comment = str(args["comment"])
    if args.get("owner"):
        obj.owner = creator(w, args)
    if immutable is not None:
        assert isinstance(obj, Securable)
        obj.immutable = immutable
    obj.updated_at = now_ms()
    if isinstance(obj, Table):
        obj.updated_by = w.name
        return meta, table_info(meta, w, names, obj)
    return meta, _securable_info(meta, w, kind, names, obj)


def parse_flag(value: Any) -> bool | None:
    """A boolean argument as the CLI, the control socket or JSON carries it (None: absent);
    :class:`CatalogError` for anything but true/false (yes/no, on/off, 1/0)."""
    if value is None or isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "yes", "1", "on"):
        return True
    if text in ("false", "no", "0", "off"):
        return False
    raise CatalogError(f"update: immutable takes true or false, not {value!r}")


def relocate(meta: Metastore, old: str, new: str) -> None:
    """After ``old`` (an origin prefix: a catalog, schema or volume) moved to ``new``: the
    locations of the tables stored under it follow."""
    for cat in meta.catalogs.values():
        for sch in cat.children.values():
            for t in sch.tables.values():
                if t.location == old or t.location.startswith(old + "/"):
                    t.location = new + t.location[len(old) :]


def tables_in(meta: Metastore, prefix: str) -> list[str]:
    """The tables whose files are under origin prefix ``prefix``."""
    return sorted(".".join(n) for loc, n in meta.tables().items() if loc.startswith(prefix + "/"))
