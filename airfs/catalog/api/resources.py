"""``/api/2.1/unity-catalog/``: catalogs, schemas, volumes and their permissions, in Unity
Catalog's request and response shapes, over the catalog commands of
:mod:`airfs.catalog.commands` (the same checks as ``airfs catalog``: visibility, ``USE``,
``CREATE``, ``MANAGE``, ownership).

What a caller may not see answers 404 like a name that does not exist. Listing shows what
the caller may see, sorted by name, ``max_results`` at a time (absent or 0: up to
:data:`PAGE`), with an opaque ``next_page_token``. ``PATCH`` takes ``new_name`` (a rename),
``owner`` and ``comment``; catalogs, schemas and volumes keep no ``properties``.

Permissions (``GET``/``PATCH permissions/{securable_type}/{full_name}``) are the grants made
directly on the object (inherited ones are not listed, as in Unity Catalog); holders of
``MANAGE`` see every principal's, others their own. A ``PATCH`` checks every change first,
then applies them one grant at a time (each a conditional write of the catalog).

Privilege names: requests may write them either way (``USE CATALOG`` or ``USE_CATALOG``);
responses write them with spaces (Unity Catalog's OpenAPI, which ``unitycatalog-client``
validates), or with underscores (Databricks' REST API, which ``databricks-sdk`` parses) when
the caller identifies as ``databricks-sdk`` in its ``User-Agent``.
"""

from __future__ import annotations

from typing import Any

from airfs.catalog.commands import TYPES, parse_name
from airfs.catalog.model import (
    GRANTABLE,
    GRANTABLE_TABLE,
    LEVELS,
    CatalogError,
    Metastore,
    Securable,
    allowed,
    check_principal,
    parse_privilege,
)
from airfs.origin.base import OriginError

from .context import Api, Reply, Request, page_after, page_token
from .errors import ApiError, bad_request, from_catalog, from_origin, not_found

PREFIX = "/api/2.1/unity-catalog/"
#: the longest page a list returns
PAGE = 1000


def run(api: Api, req: Request, command: str, args: dict[str, Any]) -> Any:
    """A catalog command as the caller; its refusals in Unity Catalog's shape."""
    try:
        return api.store.run(req.who, command, args)
    except CatalogError as exc:
        raise from_catalog(exc) from None
    except OriginError as exc:
        raise from_origin(exc, "the catalog") from None


def current(api: Api) -> Metastore:
    try:
        return api.meta()
    except CatalogError as exc:
        raise from_catalog(exc) from None
    except OriginError as exc:
        raise from_origin(exc, "the catalog") from None


def names_of(text: str, depth: int) -> tuple[str, ...]:
    try:
        return parse_name(text, depth)
    except CatalogError as exc:
        raise bad_request(str(exc)) from None


def _visible(
    api: Api, req: Request, names: tuple[str, ...], meta: Metastore | None = None
) -> Securable:
    """The object ``names`` if the caller may see it (in ``meta``, default: read now); 404
    otherwise."""
    meta = meta or current(api)
    found = meta.find(names)
    if found is None or not allowed(meta, req.who, "lookup", "/".join(names)).ok:
        raise not_found(f"{LEVELS[len(names)]} {'.'.join(names)} does not exist")
    return found[-1]


def _info(api: Api, names: tuple[str, ...], obj: Securable) -> dict[str, Any]:
    out: dict[str, Any] = {"name": names[-1], "full_name": ".".join(names), "owner": obj.owner}
    if obj.comment:
        out["comment"] = obj.comment
    if obj.created_at:
        out["created_at"] = obj.created_at
    if obj.updated_at:
        out["updated_at"] = obj.updated_at
    if len(names) == 1:
        out["catalog_type"] = "MANAGED_CATALOG"
    if len(names) >= 2:
        out["catalog_name"] = names[0]
    if len(names) == 3:
        out["schema_name"] = names[1]
        out["volume_type"] = "EXTERNAL" if obj.location else "MANAGED"
        out["storage_location"] = obj.location or f"{api.origin.url.rstrip('/')}/{'/'.join(names)}"
    return out


def page(req: Request, names: list[str]) -> tuple[list[str], str | None]:
    """One page of the sorted ``names`` as ``max_results`` and ``page_token`` ask: (the
    page, the next page's token or None)."""
    raw = req.query.get("max_results", "0") or "0"
    try:
        size = int(raw)
    except ValueError:
        raise bad_request(f"max_results {raw!r} is not a number") from None
    if size < 0:
        raise bad_request("max_results must not be negative")
    size = min(size or PAGE, PAGE)
    token = req.query.get("page_token")
    start = 0
    if token:
        after = page_after(token)
        start = next((i for i, n in enumerate(names) if n > after), len(names))
    chunk = names[start : start + size]
    more = start + size < len(names)
    nxt = page_token(chunk[-1]) if more else None
    return chunk, nxt


def _list(api: Api, req: Request, parent: tuple[str, ...], key: str) -> Reply:
    meta = current(api)
    children = _visible(api, req, parent, meta).children if parent else meta.catalogs
    names = [
        n for n in sorted(children) if allowed(meta, req.who, "lookup", "/".join((*parent, n))).ok
    ]
    chunk, nxt = page(req, names)
    body: dict[str, Any] = {key: [_info(api, (*parent, n), children[n]) for n in chunk]}
    if nxt:
        body["next_page_token"] = nxt
    return Reply(body=body)


def string(body: dict[str, Any], key: str, *, required: bool = True) -> str:
    value = body.get(key)
    if value is None or value == "":
        if required:
            raise bad_request(f"missing {key}")
        return ""
    if not isinstance(value, str):
        raise bad_request(f"{key} must be a string")
    return value


def _no_extras(body: dict[str, Any]) -> None:
    if body.get("properties"):
        raise bad_request("airfs keeps no properties on catalogs, schemas and volumes")
    if body.get("storage_root"):
        raise bad_request(
            "storage_root is not taken: managed volumes live under the origin at CAT/SCH/VOL"
        )


def _create(api: Api, req: Request, depth: int) -> Reply:
    body = req.body.json()
    _no_extras(body)
    given = [string(body, k) for k in ("catalog_name", "schema_name")[: depth - 1]]
    names = names_of(".".join([*given, string(body, "name")]), depth)
    args: dict[str, Any] = {"name": ".".join(names)}
    if body.get("comment"):
        args["comment"] = string(body, "comment")
    if depth == 3:
        kind = string(body, "volume_type", required=False).upper() or "MANAGED"
        location = string(body, "storage_location", required=False)
        if kind not in ("MANAGED", "EXTERNAL"):
            raise bad_request(f"volume_type {kind!r}: MANAGED or EXTERNAL")
        if (kind == "EXTERNAL") != bool(location):
            raise bad_request(
                "an EXTERNAL volume needs a storage_location, a MANAGED one takes none"
            )
        if location:
            args["location"] = location
    run(api, req, f"create-{LEVELS[depth]}", args)
    return Reply(body=_info(api, names, _visible(api, req, names)))


def _update(api: Api, req: Request, names: tuple[str, ...]) -> Reply:
    body = req.body.json()
    _visible(api, req, names)
    _no_extras(body)
    kind = LEVELS[len(names)]
    owner = string(body, "owner", required=False)
    new_name = string(body, "new_name", required=False)
    change: dict[str, Any] = {"type": kind, "name": ".".join(names)}
    if body.get("comment") is not None:
        change["comment"] = string(body, "comment", required=False)
    if owner:
        change["owner"] = owner
    if len(change) > 2:
        run(api, req, "update", change)
    if new_name and new_name != names[-1]:
        run(api, req, f"rename-{kind}", {"name": ".".join(names), "new_name": new_name})
        names = (*names[:-1], new_name)
    return Reply(body=_info(api, names, _visible(api, req, names)))


def _securable(api: Api, req: Request, depth: int, name: str) -> Reply:
    names = names_of(name, depth)
    if req.method == "GET":
        return Reply(body=_info(api, names, _visible(api, req, names)))
    if req.method == "PATCH":
        return _update(api, req, names)
    if req.method == "DELETE":
        run(api, req, f"drop-{LEVELS[depth]}", {"name": ".".join(names)})
        return Reply(body={})
    raise method_not_allowed(req)


def method_not_allowed(req: Request) -> ApiError:
    return ApiError(405, "BAD_REQUEST", f"{req.method} is not supported on {req.raw_path}")


def privilege_name(req: Request, value: str) -> str:
    return value.replace(" ", "_") if req.underscores else value


def _assignments(api: Api, req: Request, kind: str, names: tuple[str, ...]) -> Reply:
    args: dict[str, Any] = {"name": ".".join(names), "type": kind}
    if req.query.get("principal"):
        args["principal"] = req.query["principal"]
    grants = run(api, req, "show-grants", args)
    held: dict[str, list[str]] = {}
    for g in grants:
        if g["inherited_from"] is None and g["privilege"] != "OWNER":
            held.setdefault(g["principal"], []).append(privilege_name(req, g["privilege"]))
    body = {
        "privilege_assignments": [
            {"principal": p, "privileges": sorted(privs)} for p, privs in sorted(held.items())
        ]
    }
    return Reply(body=body)


def _changes(body: dict[str, Any], kind: str) -> list[tuple[str, str, str]]:
    """``changes`` checked: (``grant``/``revoke``, privilege, principal) in order."""
    changes = body.get("changes")
    if not isinstance(changes, list):
        raise bad_request("changes must be a list of {principal, add, remove}")
    out = []
    for c in changes:
        if not isinstance(c, dict) or not isinstance(c.get("principal"), str):
            raise bad_request("each change needs a principal")
        try:
            principal = check_principal(c["principal"])
            for verb, key in (("grant", "add"), ("revoke", "remove")):
                privs = c.get(key) or []
                if not isinstance(privs, list):
                    raise bad_request(f"{key} must be a list of privileges")
                for p in privs:
                    priv = parse_privilege(str(p))
                    grantable = GRANTABLE_TABLE if kind == "table" else GRANTABLE[TYPES[kind]]
                    if priv not in grantable:
                        raise bad_request(f"{priv} cannot be granted on a {kind}")
                    out.append((verb, priv.value, principal))
        except CatalogError as exc:
            raise bad_request(str(exc)) from None
    return out


def _permissions(api: Api, req: Request, rest: str) -> Reply:
    kind, _, full_name = rest.partition("/")
    kind = kind.lower()
    if kind not in TYPES:
        raise bad_request(f"securable_type {kind!r}: catalog, schema, volume or table")
    names = names_of(full_name, TYPES[kind])
    if req.method == "GET":
        return _assignments(api, req, kind, names)
    if req.method != "PATCH":
        raise method_not_allowed(req)
    changes = _changes(req.body.json(), kind)
    if kind == "table":
        run(api, req, "describe", {"type": kind, "name": ".".join(names)})
    else:
        _visible(api, req, names)
    for verb, priv, principal in changes:
        args = {"privilege": priv, "type": kind, "name": ".".join(names), "principal": principal}
        run(api, req, verb, args)
    return _assignments(api, req, kind, names)


def _collection(api: Api, req: Request, depth: int) -> Reply:
    if req.method == "POST":
        return _create(api, req, depth)
    if req.method != "GET":
        raise method_not_allowed(req)
    parent: tuple[str, ...] = ()
    if depth >= 2:
        parent = (string(dict(req.query), "catalog_name"),)
    if depth == 3:
        parent = (*parent, string(dict(req.query), "schema_name"))
    parent = names_of(".".join(parent), depth - 1) if parent else ()
    return _list(api, req, parent, LEVELS[depth] + "s")


#: the first path segment after the prefix → the depth of its objects
COLLECTIONS = {"catalogs": 1, "schemas": 2, "volumes": 3}


def handle(api: Api, req: Request, path: str) -> Reply:
    """``path``: the decoded part after :data:`PREFIX` (``catalogs/main``)."""
    head, _, rest = path.partition("/")
    if head == "permissions":
        return _permissions(api, req, rest)
    if head in COLLECTIONS:
        depth = COLLECTIONS[head]
        if not rest:
            return _collection(api, req, depth)
        return _securable(api, req, depth, rest)
    raise ApiError(404, "ENDPOINT_NOT_FOUND", f"no endpoint {PREFIX}{path}")
