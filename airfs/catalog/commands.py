"""The catalog commands as pure functions over a :class:`~airfs.catalog.model.Metastore`:
each checks the caller's privileges (Unity Catalog's rules, below) and returns the changed
document (None when nothing changes) and a JSON-able result. The store applies them with a
conditional write (re-applied on a conflict); the CLI and the control socket only carry them.

Who may do what:

* ``init`` — root on the node (the catalog does not exist yet);
* ``create-catalog`` and ``map-principal`` — admins;
* ``create-schema C.S`` — ``USE CATALOG`` and ``CREATE SCHEMA`` on C;
* ``create-volume C.S.V`` — ``USE CATALOG``, ``USE SCHEMA`` and ``CREATE VOLUME`` on C.S;
  ``--location`` (an external volume) — admins;
* ``drop-*``, ``grant``, ``revoke``, ``set-owner`` — ``MANAGE`` on the object (owners of it or
  of an object above have it; so do admins) and ``USE`` on the objects above; a catalog or
  schema is dropped only when empty; the files of a dropped managed volume are moved aside by
  the store (:func:`dropped_path`), so that a volume made again with its name starts empty;
* ``rename-*`` — the same, and ``CREATE SCHEMA`` / ``CREATE VOLUME`` on the container (a
  catalog: admins); the store moves the directory at the origin too;
* ``list`` — shows what the caller may see; ``show-grants`` — every grant to holders of
  ``MANAGE``, otherwise only the caller's own.

The creator of an object owns it.
"""

from __future__ import annotations

import errno
from collections.abc import Callable
from typing import Any

from . import tablecmds
from .checks import DROPPED_DIR as DROPPED_DIR
from .checks import TYPES as TYPES
from .checks import (
    children,
    creator,
    dropped_path,
    manage,
    managed_target,
    need,
    now_ms,
    refuse,
    typed,
    use_parents,
    visible_object,
    visible_table,
)
from .checks import parse_name as parse_name
from .model import (
    GRANTABLE,
    GRANTABLE_TABLE,
    LEVELS,
    CatalogError,
    Metastore,
    P,
    Securable,
    Who,
    allowed,
    check_location,
    check_name,
    check_principal,
    is_admin,
    parse_privilege,
    privileges,
)
from .table import Table

Result = tuple[Metastore | None, Any]

#: commands that never change the document
READ_ONLY = frozenset({"list", "show-grants", "why", "show-tables", "describe"})


def init(meta: Metastore | None, w: Who, args: dict[str, Any]) -> Result:
    if meta is not None:
        raise CatalogError("the catalog exists already", errno.EEXIST)
    if not w.is_root:
        raise refuse("only root may create the catalog (airfs catalog init)")
    new = Metastore(
        admins={check_principal(a) for a in args.get("admins", [])},
        root_admin=bool(args.get("root_admin", True)),
    )
    return new, {"initialised": True, "root_admin": new.root_admin, "admins": sorted(new.admins)}


def create_catalog(meta: Metastore, w: Who, args: dict[str, Any]) -> Result:
    (name,) = parse_name(str(args["name"]), 1)
    if not is_admin(meta, w):
        raise refuse(f"{w.name} is not a catalog admin (only admins create catalogs)")
    if name in meta.catalogs:
        raise CatalogError(f"catalog {name} exists already", errno.EEXIST)
    now = now_ms()
    meta.catalogs[name] = Securable(
        owner=creator(w, args),
        comment=str(args.get("comment", "")),
        created_at=now,
        updated_at=now,
    )
    return meta, {"created": name}


def create_schema(meta: Metastore, w: Who, args: dict[str, Any]) -> Result:
    names = parse_name(str(args["name"]), 2)
    parent = visible_object(meta, w, names[:1])
    need(meta, w, names[:1], P.USE_CATALOG, P.CREATE_SCHEMA)
    if names[1] in parent.children:
        raise CatalogError(f"schema {'.'.join(names)} exists already", errno.EEXIST)
    now = now_ms()
    parent.children[names[1]] = Securable(
        owner=creator(w, args),
        comment=str(args.get("comment", "")),
        created_at=now,
        updated_at=now,
    )
    return meta, {"created": ".".join(names)}


def create_volume(meta: Metastore, w: Who, args: dict[str, Any]) -> Result:
    names = parse_name(str(args["name"]), 3)
    parent = visible_object(meta, w, names[:2])
    use_parents(meta, w, names)
    need(meta, w, names[:2], P.USE_SCHEMA, P.CREATE_VOLUME)
    location = args.get("location")
    if location:
        location = check_location(str(location))
        if not is_admin(meta, w):
            raise refuse(f"{w.name} is not a catalog admin (only admins create external volumes)")
    if names[2] in parent.children:
        raise CatalogError(f"volume {'.'.join(names)} exists already", errno.EEXIST)
    if names[2] in parent.tables:
        raise CatalogError(f"{'.'.join(names)} is a table: a volume cannot take its name",
                           errno.EEXIST)  # fmt: skip
    now = now_ms()
    parent.children[names[2]] = Securable(
        owner=creator(w, args),
        location=location or None,
        comment=str(args.get("comment", "")),
        created_at=now,
        updated_at=now,
    )
    return meta, {"created": ".".join(names), "location": location or "/".join(names)}


def _drop(depth: int) -> Callable[[Metastore, Who, dict[str, Any]], Result]:
    def drop(meta: Metastore, w: Who, args: dict[str, Any]) -> Result:
        names = parse_name(str(args["name"]), depth)
        obj = manage(meta, w, names)
        if obj.children or obj.tables:
            kinds = LEVELS[depth + 1] + "s" + (" and tables" if depth == 2 else "")
            raise CatalogError(
                f"{LEVELS[depth]} {'.'.join(names)} is not empty (drop its {kinds} first)",
                errno.ENOTEMPTY,
            )
        inside = tablecmds.tables_in(meta, "/".join(names)) if depth == 3 else []
        if inside:
            raise CatalogError(
                f"volume {'.'.join(names)} holds the files of table {', '.join(inside)} "
                "(drop it first)",
                errno.ENOTEMPTY,
            )
        del children(meta, names[:-1])[names[-1]]
        out: dict[str, Any] = {"dropped": ".".join(names)}
        if depth == 3 and obj.location is None:
            # a managed volume's files leave its name (the store moves them aside first):
            # whoever creates the name again gets an empty volume
            out["moves"] = ["/".join(names), dropped_path(names, meta.serial + 1)]
        return meta, out

    return drop


def _rename(depth: int) -> Callable[[Metastore, Who, dict[str, Any]], Result]:
    def rename(meta: Metastore, w: Who, args: dict[str, Any]) -> Result:
        names = parse_name(str(args["name"]), depth)
        new = check_name(str(args["new_name"]), LEVELS[depth])
        obj = manage(meta, w, names)
        if depth > 1:  # as in Unity Catalog: renaming in a container is creating in it
            create = P.CREATE_SCHEMA if depth == 2 else P.CREATE_VOLUME
            need(meta, w, names[:-1], create)
        elif not is_admin(meta, w):
            raise refuse(f"{w.name} is not a catalog admin (only admins rename catalogs)")
        siblings = children(meta, names[:-1])
        dotted = ".".join((*names[:-1], new))
        if new in siblings:
            raise CatalogError(f"{LEVELS[depth]} {dotted} exists already", errno.EEXIST)
        if depth == 3 and new in (meta.find(names[:2]) or [Securable("")])[-1].tables:
            raise CatalogError(f"{dotted} is a table: a volume cannot take its name",
                               errno.EEXIST)  # fmt: skip
        del siblings[names[-1]]
        siblings[new] = obj
        external = depth == 3 and obj.location is not None
        if not external:  # the files of the tables stored under it move with it
            tablecmds.relocate(meta, "/".join(names), "/".join((*names[:-1], new)))
        return meta, {
            "renamed": ".".join(names),
            "to": ".".join((*names[:-1], new)),
            "moves": None if external else ["/".join(names), "/".join((*names[:-1], new))],
        }

    return rename


def _grant(revoke: bool) -> Callable[[Metastore, Who, dict[str, Any]], Result]:
    def grant(meta: Metastore, w: Who, args: dict[str, Any]) -> Result:
        kind, names = typed(args)
        priv = parse_privilege(str(args["privilege"]))
        principal = check_principal(str(args["principal"]))
        grantable = GRANTABLE_TABLE if kind == "table" else GRANTABLE[len(names)]
        if priv not in grantable:
            raise CatalogError(f"{priv} cannot be granted on a {kind}")
        obj = managed_target(meta, w, kind, names)
        held = obj.grants.setdefault(principal, set())
        if revoke:
            held.discard(priv)
            if not held:
                del obj.grants[principal]
        else:
            held.add(priv)
        verb = "revoked" if revoke else "granted"
        return meta, {verb: str(priv), "on": ".".join(names), "principal": principal}

    return grant


def set_owner(meta: Metastore, w: Who, args: dict[str, Any]) -> Result:
    kind, names = typed(args)
    principal = check_principal(str(args["principal"]))
    obj = managed_target(meta, w, kind, names)
    obj.owner = principal
    obj.updated_at = now_ms()
    return meta, {"owner": principal, "of": ".".join(names)}


def map_principal(meta: Metastore, w: Who, args: dict[str, Any]) -> Result:
    local = check_principal(str(args["local"]))
    if not is_admin(meta, w):
        raise refuse(f"{w.name} is not a catalog admin (only admins map principals)")
    if args.get("principal"):
        meta.aliases[local] = check_principal(str(args["principal"]))
    else:
        meta.aliases.pop(local, None)
    return meta, {"local": local, "principal": meta.aliases.get(local)}


def list_objects(meta: Metastore, w: Who, args: dict[str, Any]) -> Result:
    names = parse_name(str(args["name"])) if args.get("name") else ()
    if names:
        visible_object(meta, w, names)
    if len(names) == 3:
        raise CatalogError("list takes a catalog or CATALOG.SCHEMA (a volume has no children)")
    out = []
    for n, obj in sorted(children(meta, names).items()):
        child = (*names, n)
        if not allowed(meta, w, "lookup", "/".join(child)).ok:
            continue
        item: dict[str, Any] = {
            "name": ".".join(child),
            "type": LEVELS[len(child)],
            "owner": obj.owner,
        }
        if len(child) == 3:
            item["location"] = obj.location or "/".join(child)
            item["external"] = obj.location is not None
            item["immutable"] = obj.immutable
        out.append(item)
    if len(names) == 2:
        for n, t in sorted(_schema(meta, names).tables.items()):
            out.append(
                {
                    "name": ".".join((*names, n)),
                    "type": "table",
                    "owner": t.owner,
                    "location": t.location,
                    "external": not t.managed,
                    "format": t.data_source_format,
                }
            )
        out.sort(key=lambda item: str(item["name"]))
    return None, out


def _schema(meta: Metastore, names: tuple[str, ...]) -> Securable:
    found = meta.find(names)
    assert found is not None
    return found[-1]


def show_grants(meta: Metastore, w: Who, args: dict[str, Any]) -> Result:
    """Grants on ``name`` (``type`` TABLE for a table; else by the name's depth)."""
    table = str(args.get("type", "")).lower() == "table"
    found: list[Securable | Table]
    if table:
        names = parse_name(str(args["name"]), 3, "table")
        t = visible_table(meta, w, names)
        found = [*(meta.find(names[:2]) or []), t]
    else:
        names = parse_name(str(args["name"]))
        visible_object(meta, w, names)
        found = list(meta.find(names) or [])
    held = privileges(meta, w, names, table=table) or frozenset()
    only = check_principal(str(args["principal"])) if args.get("principal") else None
    out = []
    for i, obj in enumerate(found):
        dotted = ".".join(names[: i + 1])
        entries = [(obj.owner, "OWNER")]
        entries += [(p, x.value) for p, s in obj.grants.items() for x in s]
        for principal, priv in sorted(entries):
            if only is not None and principal != only:
                continue
            if P.MANAGE not in held and principal not in w.principals:
                continue
            out.append(
                {
                    "principal": principal,
                    "privilege": priv,
                    "object": dotted,
                    "inherited_from": None if i == len(found) - 1 else dotted,
                }
            )
    return None, out


COMMANDS: dict[str, Callable[[Metastore, Who, dict[str, Any]], Result]] = {
    "create-catalog": create_catalog,
    "create-schema": create_schema,
    "create-volume": create_volume,
    "drop-catalog": _drop(1),
    "drop-schema": _drop(2),
    "drop-volume": _drop(3),
    "rename-catalog": _rename(1),
    "rename-schema": _rename(2),
    "rename-volume": _rename(3),
    "grant": _grant(False),
    "revoke": _grant(True),
    "set-owner": set_owner,
    "map-principal": map_principal,
    "list": list_objects,
    "show-grants": show_grants,
    "create-table": tablecmds.create_table,
    "drop-table": tablecmds.drop_table,
    "show-tables": tablecmds.show_tables,
    "describe": tablecmds.describe,
    "update": tablecmds.update,
}


def apply(meta: Metastore | None, w: Who, command: str, args: dict[str, Any]) -> Result:
    """Run ``command`` for ``w`` on a *copy* of ``meta``; return (the changed document or None,
    the result). Raises :class:`CatalogError` with the one-line reason and errno."""
    if command == "init":
        return init(meta, w, args)
    fn = COMMANDS.get(command)
    if fn is None:
        raise CatalogError(f"unknown catalog command {command!r}")
    if meta is None:
        raise CatalogError(
            "this origin has no catalog (run airfs catalog init first)", errno.ENOENT
        )
    try:
        new, out = fn(meta.copy(), w, args)
    except KeyError as exc:
        raise CatalogError(f"{command}: missing argument {exc}") from None
    if new is not None:
        new.serial += 1
    return new, out
