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

from .model import (
    GRANTABLE,
    LEVELS,
    RESERVED,
    CatalogError,
    Metastore,
    P,
    Privilege,
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

Result = tuple[Metastore | None, Any]

#: commands that never change the document
READ_ONLY = frozenset({"list", "show-grants", "why"})
TYPES = {"catalog": 1, "schema": 2, "volume": 3}


def parse_name(text: str, depth: int | None = None) -> tuple[str, ...]:
    """``"main.raw.images"`` → its parts, each a valid name; ``depth`` (1-3) if given."""
    parts = tuple(text.split(".")) if text else ()
    if not parts or len(parts) > 3 or (depth is not None and len(parts) != depth):
        want = {1: "CATALOG", 2: "CATALOG.SCHEMA", 3: "CATALOG.SCHEMA.VOLUME"}
        form = want.get(depth or 0, "CATALOG[.SCHEMA[.VOLUME]]")
        raise CatalogError(f"bad name {text!r}: expected {form}")
    for i, n in enumerate(parts):
        check_name(n, LEVELS[i + 1])
    return parts


def _refuse(message: str) -> CatalogError:
    return CatalogError(message, errno.EACCES)


def _object(meta: Metastore, w: Who, names: tuple[str, ...]) -> Securable:
    """The object, if it exists and ``w`` may see it (same answer either way: ENOENT)."""
    found = meta.find(names)
    path = "/".join(names)
    dotted = ".".join(names)
    if found is None or not allowed(meta, w, "lookup", path).ok:
        raise CatalogError(f"{LEVELS[len(names)]} {dotted} does not exist", errno.ENOENT)
    return found[-1]


def _need(meta: Metastore, w: Who, names: tuple[str, ...], *privs: Privilege) -> None:
    held = privileges(meta, w, names) or frozenset()
    for p in privs:
        if p not in held:
            what = f"{LEVELS[len(names)]} {'.'.join(names)}"
            raise _refuse(f"{w.name} lacks {p} on {what}")


def _use_parents(meta: Metastore, w: Who, names: tuple[str, ...]) -> None:
    if len(names) >= 2:
        _need(meta, w, names[:1], P.USE_CATALOG)
    if len(names) >= 3:
        _need(meta, w, names[:2], P.USE_SCHEMA)


def _manage(meta: Metastore, w: Who, names: tuple[str, ...]) -> Securable:
    obj = _object(meta, w, names)
    _use_parents(meta, w, names)
    _need(meta, w, names, P.MANAGE)
    return obj


def _children(meta: Metastore, names: tuple[str, ...]) -> dict[str, Securable]:
    if not names:
        return meta.catalogs
    found = meta.find(names)
    assert found is not None
    return found[-1].children


def _typed(args: dict[str, Any]) -> tuple[str, ...]:
    kind = str(args.get("type", "")).lower()
    if kind not in TYPES:
        raise CatalogError(f"bad securable type {args.get('type')!r}: CATALOG, SCHEMA or VOLUME")
    return parse_name(str(args["name"]), TYPES[kind])


def _creator(w: Who, args: dict[str, Any]) -> str:
    return check_principal(str(args["owner"])) if args.get("owner") else w.name


def init(meta: Metastore | None, w: Who, args: dict[str, Any]) -> Result:
    if meta is not None:
        raise CatalogError("the catalog exists already", errno.EEXIST)
    if not w.is_root:
        raise _refuse("only root may create the catalog (airfs catalog init)")
    new = Metastore(
        admins={check_principal(a) for a in args.get("admins", [])},
        root_admin=bool(args.get("root_admin", True)),
    )
    return new, {"initialised": True, "root_admin": new.root_admin, "admins": sorted(new.admins)}


def create_catalog(meta: Metastore, w: Who, args: dict[str, Any]) -> Result:
    (name,) = parse_name(str(args["name"]), 1)
    if not is_admin(meta, w):
        raise _refuse(f"{w.name} is not a catalog admin (only admins create catalogs)")
    if name in meta.catalogs:
        raise CatalogError(f"catalog {name} exists already", errno.EEXIST)
    meta.catalogs[name] = Securable(owner=_creator(w, args), comment=str(args.get("comment", "")))
    return meta, {"created": name}


def create_schema(meta: Metastore, w: Who, args: dict[str, Any]) -> Result:
    names = parse_name(str(args["name"]), 2)
    parent = _object(meta, w, names[:1])
    _need(meta, w, names[:1], P.USE_CATALOG, P.CREATE_SCHEMA)
    if names[1] in parent.children:
        raise CatalogError(f"schema {'.'.join(names)} exists already", errno.EEXIST)
    parent.children[names[1]] = Securable(owner=_creator(w, args))
    return meta, {"created": ".".join(names)}


def create_volume(meta: Metastore, w: Who, args: dict[str, Any]) -> Result:
    names = parse_name(str(args["name"]), 3)
    parent = _object(meta, w, names[:2])
    _use_parents(meta, w, names)
    _need(meta, w, names[:2], P.USE_SCHEMA, P.CREATE_VOLUME)
    location = args.get("location")
    if location:
        location = check_location(str(location))
        if not is_admin(meta, w):
            raise _refuse(f"{w.name} is not a catalog admin (only admins create external volumes)")
    if names[2] in parent.children:
        raise CatalogError(f"volume {'.'.join(names)} exists already", errno.EEXIST)
    parent.children[names[2]] = Securable(owner=_creator(w, args), location=location or None)
    return meta, {"created": ".".join(names), "location": location or "/".join(names)}


def _drop(depth: int) -> Callable[[Metastore, Who, dict[str, Any]], Result]:
    def drop(meta: Metastore, w: Who, args: dict[str, Any]) -> Result:
        names = parse_name(str(args["name"]), depth)
        obj = _manage(meta, w, names)
        if obj.children:
            kinds = LEVELS[depth + 1] + "s"
            raise CatalogError(
                f"{LEVELS[depth]} {'.'.join(names)} is not empty (drop its {kinds} first)",
                errno.ENOTEMPTY,
            )
        del _children(meta, names[:-1])[names[-1]]
        out: dict[str, Any] = {"dropped": ".".join(names)}
        if depth == 3 and obj.location is None:
            # a managed volume's files leave its name (the store moves them aside first):
            # whoever creates the name again gets an empty volume
            out["moves"] = ["/".join(names), dropped_path(names, meta.serial + 1)]
        return meta, out

    return drop


#: where the store keeps the files of dropped managed volumes (inside the reserved directory:
#: unreachable through every mount, for admins to restore or delete at the origin)
DROPPED_DIR = f"{RESERVED}/dropped"


def dropped_path(names: tuple[str, ...], serial: int) -> str:
    """Where the files of managed volume ``names`` go when the catalog change of ``serial``
    drops it."""
    return f"{DROPPED_DIR}/{'.'.join(names)}@{serial}"


def _rename(depth: int) -> Callable[[Metastore, Who, dict[str, Any]], Result]:
    def rename(meta: Metastore, w: Who, args: dict[str, Any]) -> Result:
        names = parse_name(str(args["name"]), depth)
        new = check_name(str(args["new_name"]), LEVELS[depth])
        obj = _manage(meta, w, names)
        if depth > 1:  # as in Unity Catalog: renaming in a container is creating in it
            need = P.CREATE_SCHEMA if depth == 2 else P.CREATE_VOLUME
            _need(meta, w, names[:-1], need)
        elif not is_admin(meta, w):
            raise _refuse(f"{w.name} is not a catalog admin (only admins rename catalogs)")
        siblings = _children(meta, names[:-1])
        if new in siblings:
            dotted = ".".join((*names[:-1], new))
            raise CatalogError(f"{LEVELS[depth]} {dotted} exists already", errno.EEXIST)
        del siblings[names[-1]]
        siblings[new] = obj
        external = depth == 3 and obj.location is not None
        return meta, {
            "renamed": ".".join(names),
            "to": ".".join((*names[:-1], new)),
            "moves": None if external else ["/".join(names), "/".join((*names[:-1], new))],
        }

    return rename


def _grant(revoke: bool) -> Callable[[Metastore, Who, dict[str, Any]], Result]:
    def grant(meta: Metastore, w: Who, args: dict[str, Any]) -> Result:
        names = _typed(args)
        priv = parse_privilege(str(args["privilege"]))
        principal = check_principal(str(args["principal"]))
        if priv not in GRANTABLE[len(names)]:
            raise CatalogError(f"{priv} cannot be granted on a {LEVELS[len(names)]}")
        obj = _manage(meta, w, names)
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
    names = _typed(args)
    principal = check_principal(str(args["principal"]))
    obj = _manage(meta, w, names)
    obj.owner = principal
    return meta, {"owner": principal, "of": ".".join(names)}


def map_principal(meta: Metastore, w: Who, args: dict[str, Any]) -> Result:
    local = check_principal(str(args["local"]))
    if not is_admin(meta, w):
        raise _refuse(f"{w.name} is not a catalog admin (only admins map principals)")
    if args.get("principal"):
        meta.aliases[local] = check_principal(str(args["principal"]))
    else:
        meta.aliases.pop(local, None)
    return meta, {"local": local, "principal": meta.aliases.get(local)}


def list_objects(meta: Metastore, w: Who, args: dict[str, Any]) -> Result:
    names = parse_name(str(args["name"])) if args.get("name") else ()
    if names:
        _object(meta, w, names)
    if len(names) == 3:
        raise CatalogError("list takes a catalog or CATALOG.SCHEMA (a volume has no children)")
    out = []
    for n, obj in sorted(_children(meta, names).items()):
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
        out.append(item)
    return None, out


def show_grants(meta: Metastore, w: Who, args: dict[str, Any]) -> Result:
    names = parse_name(str(args["name"]))
    _object(meta, w, names)
    found = meta.find(names)
    assert found is not None
    held = privileges(meta, w, names) or frozenset()
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
