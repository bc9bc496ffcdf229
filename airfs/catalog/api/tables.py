"""``/api/2.1/unity-catalog/tables``: list (``catalog_name``, ``schema_name``, paging), create,
get, ``exists``, update (``owner``, ``comment``) and delete, over the table commands of
:mod:`airfs.catalog.tablecmds` (``CREATE TABLE``, ``SELECT``/``MODIFY`` are enforced where
the bytes are: the mount and the Files API).

``storage_location`` is answered as the origin URL of the table's files; a client gives it as
such a URL, or as ``/Volumes/CAT/SCH/VOL/PATH`` (the mount's name for it): airfs stores it
relative to the origin and refuses a location that is neither. ``MANAGED`` tables take none
(airfs keeps their files under the schema). Tables are not renamed.
"""

from __future__ import annotations

from typing import Any

from .context import Api, Reply, Request
from .errors import bad_request
from .resources import method_not_allowed, names_of, page, run, string

FORMATS = ("DELTA", "PARQUET")


def info(api: Api, t: dict[str, Any]) -> dict[str, Any]:
    """Unity Catalog's ``TableInfo`` of a table command's answer."""
    out = {k: v for k, v in t.items() if k not in ("type", "privileges", "location", "created")}
    out["storage_location"] = f"{api.origin.url.rstrip('/')}/{t['location']}"
    return out


def _location(api: Api, text: str) -> str:
    base = api.origin.url.rstrip("/") + "/"
    if text.startswith("/Volumes/"):
        return text[len("/Volumes/") :].strip("/")
    if text.startswith(base):
        return text[len(base) :].strip("/")
    raise bad_request(
        f"storage_location {text!r}: a path under the origin ({base}...) "
        "or /Volumes/CAT/SCH/VOL/..."
    )


def _create(api: Api, req: Request) -> Reply:
    body = req.body.json()
    parts = [string(body, k) for k in ("catalog_name", "schema_name", "name")]
    names = names_of(".".join(parts), 3)
    kind = string(body, "table_type", required=False).upper() or "MANAGED"
    fmt = string(body, "data_source_format", required=False).upper() or "DELTA"
    where = string(body, "storage_location", required=False)
    if kind not in ("MANAGED", "EXTERNAL"):
        raise bad_request(f"table_type {kind!r}: MANAGED or EXTERNAL (airfs has no views)")
    if fmt not in FORMATS:
        raise bad_request(f"data_source_format {fmt!r}: DELTA or PARQUET")
    if (kind == "EXTERNAL") != bool(where):
        raise bad_request("an EXTERNAL table needs a storage_location, a MANAGED one takes none")
    args: dict[str, Any] = {"name": ".".join(names), "format": fmt}
    if where:
        args["location"] = _location(api, where)
    for key in ("comment", "columns", "properties"):
        if body.get(key):
            args[key] = body[key]
    return Reply(body=info(api, run(api, req, "create-table", args)))


def _list(api: Api, req: Request) -> Reply:
    parent = ".".join(string(dict(req.query), k) for k in ("catalog_name", "schema_name"))
    tables = run(api, req, "show-tables", {"name": ".".join(names_of(parent, 2))})
    by_name = {t["name"]: t for t in tables}
    chunk, nxt = page(req, sorted(by_name))
    body: dict[str, Any] = {"tables": [info(api, by_name[n]) for n in chunk]}
    if nxt:
        body["next_page_token"] = nxt
    return Reply(body=body)


def handle(api: Api, req: Request, rest: str) -> Reply:
    """``rest``: the path after ``tables`` (``""``, ``/CAT.SCH.T`` or ``/CAT.SCH.T/exists``)."""
    rest = rest.strip("/")
    if not rest:
        if req.method == "POST":
            return _create(api, req)
        if req.method == "GET":
            return _list(api, req)
        raise method_not_allowed(req)
    full_name, _, tail = rest.partition("/")
    name = ".".join(names_of(full_name, 3))
    if tail == "exists" and req.method == "GET":
        found = [
            t
            for t in run(api, req, "show-tables", {"name": name.rsplit(".", 1)[0]})
            if t["full_name"] == name
        ]
        return Reply(body={"table_exists": bool(found)})
    if tail:
        raise method_not_allowed(req)
    if req.method == "GET":
        return Reply(body=info(api, run(api, req, "describe", {"type": "table", "name": name})))
    if req.method == "DELETE":
        run(api, req, "drop-table", {"name": name})
        return Reply(body={})
    if req.method != "PATCH":
        raise method_not_allowed(req)
    body = req.body.json()
    if body.get("new_name"):
        raise bad_request("airfs does not rename tables (create the new one, drop the old)")
    change: dict[str, Any] = {"type": "table", "name": name}
    if body.get("owner"):
        change["owner"] = string(body, "owner")
    if body.get("comment") is not None:
        change["comment"] = string(body, "comment", required=False)
    if len(change) > 2:
        run(api, req, "update", change)
    return Reply(body=info(api, run(api, req, "describe", {"type": "table", "name": name})))
