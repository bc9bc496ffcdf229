"""Tables in the catalog without a kernel: the commands (create/drop/show/describe/update,
grants) and the path rule of :func:`airfs.catalog.model.allowed` for table files."""

from __future__ import annotations

import errno
from typing import Any

import pytest

from airfs.catalog.commands import apply
from airfs.catalog.model import CatalogError, Metastore, Who, allowed, visible

ROOT = Who(frozenset({"root", "group:root"}), is_root=True)
ALICE = Who(frozenset({"alice", "group:alice"}))
BOB = Who(frozenset({"bob", "group:bob", "group:ml"}))


def run(m: Metastore | None, w: Who, command: str, **args: Any) -> tuple[Metastore, Any]:
    new, out = apply(m, w, command, args)
    assert m is not None or new is not None
    return (new if new is not None else m), out  # type: ignore[return-value]


def base() -> Metastore:
    """main.default with volume raw; alice and group ml may use both levels."""
    m, _ = run(None, ROOT, "init")
    m, _ = run(m, ROOT, "create-catalog", name="main")
    m, _ = run(m, ROOT, "create-schema", name="main.default")
    m, _ = run(m, ROOT, "create-volume", name="main.default.raw")
    for who in ("alice", "group:ml"):
        m, _ = run(m, ROOT, "grant", privilege="USE CATALOG", type="CATALOG", name="main",
                   principal=who)  # fmt: skip
        m, _ = run(m, ROOT, "grant", privilege="USE SCHEMA", type="SCHEMA", name="main.default",
                   principal=who)  # fmt: skip
    return m


def grant(m: Metastore, priv: str, kind: str, name: str, who: str) -> Metastore:
    return run(m, ROOT, "grant", privilege=priv, type=kind, name=name, principal=who)[0]


def refused(m: Metastore, w: Who, command: str, err: int, text: str, **args: Any) -> None:
    with pytest.raises(CatalogError, match=text) as info:
        apply(m, w, command, args)
    assert info.value.errno == err


def test_create_managed_and_external_tables() -> None:
    m = base()
    m, out = run(m, ROOT, "create-table", name="main.default.sales", comment="daily")
    assert out["table_type"] == "MANAGED" and out["data_source_format"] == "DELTA"
    assert out["location"] == "main/default/.table-sales"
    assert out["full_name"] == "main.default.sales" and out["owner"] == "root"
    m, out = run(m, ROOT, "create-table", name="main.default.ext",
                 location="main/default/raw/tables/ext", format="parquet")  # fmt: skip
    assert out["table_type"] == "EXTERNAL" and out["data_source_format"] == "PARQUET"
    _, shown = run(m, ROOT, "show-tables", name="main.default")
    assert [t["full_name"] for t in shown] == ["main.default.ext", "main.default.sales"]
    _, listed = run(m, ROOT, "list", name="main.default")
    assert [(i["name"], i["type"]) for i in listed] == [
        ("main.default.ext", "table"), ("main.default.raw", "volume"),
        ("main.default.sales", "table"),
    ]  # fmt: skip
    # the document round-trips through JSON
    again = Metastore.from_json(m.to_json())
    t = again.table(("main", "default", "sales"))
    assert t is not None and t.comment == "daily" and t.created_at > 0 and t.table_id


def test_create_table_refusals() -> None:
    m = base()
    refused(m, ALICE, "create-table", errno.EACCES, "lacks CREATE TABLE on schema main.default",
            name="main.default.t")  # fmt: skip
    refused(m, ROOT, "create-table", errno.EEXIST, "is a volume", name="main.default.raw")
    refused(m, ROOT, "create-table", errno.EINVAL, "bad table format", name="main.default.t",
            format="csv")  # fmt: skip
    refused(m, ROOT, "create-table", errno.EINVAL, "inside a volume", name="main.default.t",
            location="main/default/t")  # fmt: skip
    refused(m, ROOT, "create-table", errno.EINVAL, "reserved", name="main.default.t",
            location=".airfs-catalog/x")  # fmt: skip
    refused(m, ROOT, "create-table", errno.EINVAL, "bad table location", name="main.default.t",
            location="main/default/raw/../../x")  # fmt: skip
    m = grant(m, "CREATE TABLE", "SCHEMA", "main.default", "alice")
    # external: inside a volume, the registrant needs READ and WRITE VOLUME on it
    refused(m, ALICE, "create-table", errno.EACCES, "lacks READ VOLUME on volume",
            name="main.default.t", location="main/default/raw/t")  # fmt: skip
    refused(m, ALICE, "create-table", errno.EACCES, "only admins register tables outside",
            name="main.default.t", location="elsewhere/t")  # fmt: skip
    m, _ = run(m, ALICE, "create-table", name="main.default.t")  # managed: CREATE TABLE
    refused(m, ROOT, "create-table", errno.EEXIST, "exists already", name="main.default.t")
    refused(m, ROOT, "create-volume", errno.EEXIST, "is a table", name="main.default.t")
    m, _ = run(m, ROOT, "create-table", name="main.default.x", location="main/default/raw/x/d")
    for inside_or_above in (
        "main/default/raw/x/d/inner",
        "main/default/raw/x",
        "main/default/raw/x/d",
    ):
        refused(m, ROOT, "create-table", errno.EEXIST, "overlaps", name="main.default.y",
                location=inside_or_above)  # fmt: skip


def test_table_grants_describe_update_and_visibility() -> None:
    m = base()
    m, _ = run(m, ROOT, "create-table", name="main.default.sales")
    refused(m, ROOT, "grant", errno.EINVAL, "cannot be granted on a table", privilege="READ VOLUME",
            type="TABLE", name="main.default.sales", principal="alice")  # fmt: skip
    m = grant(m, "SELECT", "TABLE", "main.default.sales", "alice")
    _, d = run(m, ALICE, "describe", type="TABLE", name="main.default.sales")
    assert d["table_type"] == "MANAGED"
    assert set(d["privileges"]) == {"SELECT", "USE CATALOG", "USE SCHEMA"}  # with inherited
    _, d = run(m, BOB, "describe", type="table", name="main.default.sales")
    # the name is seen with USE SCHEMA, the data is not
    assert set(d["privileges"]) == {"USE CATALOG", "USE SCHEMA"}
    outsider = Who(frozenset({"carol"}))
    refused(m, outsider, "describe", errno.ENOENT, "does not exist", type="TABLE",
            name="main.default.sales")  # fmt: skip
    refused(m, ALICE, "update", errno.EACCES, "lacks MANAGE on table", type="TABLE",
            name="main.default.sales", comment="x")  # fmt: skip
    m, d = run(m, ROOT, "update", type="TABLE", name="main.default.sales", comment="new",
               owner="alice")  # fmt: skip
    assert d["comment"] == "new" and d["owner"] == "alice"
    assert set(d["privileges"]) >= {"SELECT", "MODIFY", "MANAGE"}  # ownership: everything
    m, _ = run(m, ALICE, "grant", privilege="MODIFY", type="TABLE", name="main.default.sales",
               principal="group:ml")  # fmt: skip
    _, g = run(m, ALICE, "show-grants", type="TABLE", name="main.default.sales")
    own = {(x["principal"], x["privilege"]) for x in g if x["inherited_from"] is None}
    assert own == {("alice", "OWNER"), ("alice", "SELECT"), ("group:ml", "MODIFY")}
    # schema-level grants reach the tables in it
    m = grant(m, "SELECT", "SCHEMA", "main.default", "group:ml")
    _, d = run(m, BOB, "describe", type="TABLE", name="main.default.sales")
    assert {"MODIFY", "SELECT"} <= set(d["privileges"])
    _, d = run(m, ROOT, "describe", type="VOLUME", name="main.default.raw")
    assert d["volume_type"] == "MANAGED" and d["location"] == "main/default/raw"


def test_managed_storage_rule() -> None:
    m = base()
    m, _ = run(m, ROOT, "create-table", name="main.default.sales")
    loc = "main/default/.table-sales"
    d = allowed(m, ALICE, "lookup", loc)
    assert d.errno == errno.ENOENT  # not visible without SELECT or MODIFY
    assert not visible(m, ALICE, "main/default", ".table-sales")
    assert allowed(m, ALICE, "open_read", f"{loc}/part-0.parquet").errno == errno.ENOENT
    m = grant(m, "SELECT", "TABLE", "main.default.sales", "alice")
    assert visible(m, ALICE, "main/default", ".table-sales")
    assert allowed(m, ALICE, "readdir", loc).ok
    assert allowed(m, ALICE, "open_read", f"{loc}/_delta_log/0.json").ok
    d = allowed(m, ALICE, "create", f"{loc}/part-1.parquet")
    assert d.errno == errno.EACCES and d.missing == "MODIFY on table main.default.sales"
    assert allowed(m, ALICE, "rmdir", loc).errno == errno.EPERM  # a catalog level
    m = grant(m, "MODIFY", "TABLE", "main.default.sales", "alice")
    assert allowed(m, ALICE, "create", f"{loc}/part-1.parquet").ok
    assert allowed(m, ALICE, "unlink", f"{loc}/part-1.parquet").ok
    # MODIFY alone writes but does not read
    m = grant(m, "MODIFY", "TABLE", "main.default.sales", "bob")
    assert allowed(m, BOB, "create", f"{loc}/x").ok
    d = allowed(m, BOB, "open_read", f"{loc}/x")
    assert d.errno == errno.EACCES and d.missing == "SELECT on table main.default.sales"
    # no USE SCHEMA: nothing, whatever the table grants
    m = run(m, ROOT, "revoke", privilege="USE SCHEMA", type="SCHEMA", name="main.default",
            principal="alice")[0]  # fmt: skip
    assert allowed(m, ALICE, "open_read", f"{loc}/x").errno == errno.ENOENT


def test_external_table_in_a_volume_rule() -> None:
    m = base()
    loc = "main/default/raw/tables/sales"
    m, _ = run(m, ROOT, "create-table", name="main.default.sales", location=loc)
    m = grant(m, "SELECT", "TABLE", "main.default.sales", "alice")
    # the table's files: SELECT suffices, no privilege on the volume
    assert allowed(m, ALICE, "open_read", f"{loc}/part-0.parquet").ok
    assert allowed(m, ALICE, "readdir", loc).ok
    # the way there: looked up, not listed; the rest of the volume: the volume's rules
    assert allowed(m, ALICE, "lookup", "main/default/raw/tables").ok
    d = allowed(m, ALICE, "readdir", "main/default/raw/tables")
    assert d.errno == errno.EACCES and d.missing == "READ VOLUME on volume main.default.raw"
    d = allowed(m, ALICE, "open_read", "main/default/raw/other.bin")
    assert d.errno == errno.EACCES and d.missing == "READ VOLUME on volume main.default.raw"
    d = allowed(m, ALICE, "create", f"{loc}/part-1.parquet")
    assert d.missing == "MODIFY on table main.default.sales"
    # a volume reader without table privileges reads the files by path (the union rule)
    m = grant(m, "READ VOLUME", "VOLUME", "main.default.raw", "group:ml")
    assert allowed(m, BOB, "open_read", f"{loc}/part-0.parquet").ok
    d = allowed(m, BOB, "create", f"{loc}/part-1.parquet")
    assert d.missing == "WRITE VOLUME on volume main.default.raw"
    # a table holder cannot remove the location itself; a volume writer can
    m = grant(m, "MODIFY", "TABLE", "main.default.sales", "alice")
    assert allowed(m, ALICE, "create", f"{loc}/part-1.parquet").ok
    assert allowed(m, ALICE, "rmdir", loc).errno == errno.EACCES
    m = grant(m, "WRITE VOLUME", "VOLUME", "main.default.raw", "group:ml")
    assert allowed(m, BOB, "rmdir", loc).ok


def test_external_table_outside_the_catalogs() -> None:
    m = base()
    refused(m, ALICE, "create-table", errno.EACCES, "lacks CREATE TABLE", name="main.default.e",
            location="shared/x/e")  # fmt: skip
    refused(m, ROOT, "create-table", errno.EINVAL, "at least three levels", name="main.default.e",
            location="shared/e")  # fmt: skip
    m, _ = run(m, ROOT, "create-table", name="main.default.e", location="shared/x/e")
    assert allowed(m, ALICE, "lookup", "shared").errno == errno.ENOENT
    m = grant(m, "SELECT", "TABLE", "main.default.e", "alice")
    assert allowed(m, ALICE, "lookup", "shared").ok
    assert visible(m, ALICE, "", "shared")
    assert allowed(m, ALICE, "lookup", "shared/x").ok
    assert allowed(m, ALICE, "open_read", "shared/x/e/f.parquet").ok
    assert allowed(m, ROOT, "create", "shared/x/e/f.parquet").ok
    assert allowed(m, ALICE, "readdir", "shared").errno in (errno.EACCES, errno.ENOENT)


def test_drop_rename_and_the_table_files() -> None:
    m = base()
    m, _ = run(m, ROOT, "create-table", name="main.default.ext", location="main/default/raw/e")
    m, _ = run(m, ROOT, "create-table", name="main.default.man")
    refused(m, ROOT, "drop-volume", errno.ENOTEMPTY, "holds the files of table main.default.ext",
            name="main.default.raw")  # fmt: skip
    refused(m, ROOT, "drop-schema", errno.ENOTEMPTY, "not empty", name="main.default")
    m, out = run(m, ROOT, "rename-volume", name="main.default.raw", new_name="raw2")
    t = m.table(("main", "default", "ext"))
    assert t is not None and t.location == "main/default/raw2/e"
    m, out = run(m, ROOT, "rename-schema", name="main.default", new_name="d2")
    t = m.table(("main", "d2", "man"))
    assert t is not None and t.location == "main/d2/.table-man"
    refused(m, ALICE, "drop-table", errno.EACCES, "lacks MANAGE on table", name="main.d2.man")
    m, out = run(m, ROOT, "drop-table", name="main.d2.man")
    assert out["moves"][0] == "main/d2/.table-man"
    assert out["moves"][1].startswith(".airfs-catalog/dropped/main.d2.man@")
    m, out = run(m, ROOT, "drop-table", name="main.d2.ext")
    assert "moves" not in out  # an external table's files stay
    assert m.tables() == {}


def test_guard_decisions_storage_and_control_for_table_paths() -> None:
    """The daemon's guard over a catalog with tables: decisions keyed by the table a path is
    in (one volume, two answers), a table's location its own storage, flush of a table's path
    with MODIFY, and ``why`` naming the table privilege."""
    import trio

    from airfs.catalog.service import CatalogService
    from airfs.core.context import Caller
    from airfs.testing.memory import MemoryOrigin

    nobody = Caller(65534, 65534, 0)  # "nobody" on Debian
    s = CatalogService(MemoryOrigin(), 60.0)
    run_ = s.store.run
    run_(ROOT, "init", {})
    for command, name in (("create-catalog", "main"), ("create-schema", "main.raw"),
                          ("create-volume", "main.raw.v")):  # fmt: skip
        run_(ROOT, command, {"name": name})
    run_(ROOT, "create-table", {"name": "main.raw.t", "location": "main/raw/v/t"})
    run_(ROOT, "create-table", {"name": "main.raw.m"})
    for priv, kind, name in (("USE CATALOG", "catalog", "main"), ("USE SCHEMA", "schema",
                             "main.raw"), ("SELECT", "table", "main.raw.t"),
                             ("MODIFY", "table", "main.raw.m")):  # fmt: skip
        run_(ROOT, "grant", {"privilege": priv, "type": kind, "name": name, "principal": "nobody"})

    async def main() -> None:
        await s.cache.current()
        g = s.guard
        assert g.decide(nobody, "open_read", "main/raw/v/t/a.parquet").ok
        d = g.decide(nobody, "open_read", "main/raw/v/other.bin")  # same volume, no table
        assert d.errno == errno.EACCES and d.missing == "READ VOLUME on volume main.raw.v"
        assert g.storage("main/raw/v/t/a") == "main/raw/v/t" and g.storage("main/raw/v/x") == (
            "main/raw/v"
        )
        assert g.storage("main/raw/.table-m/x") == "main/raw/.table-m"
        assert g.visible(nobody, "main/raw", ".table-m")
        assert not g.visible(nobody, "main/raw", ".table-x")
        await s.check_control(nobody, "flush", "main/raw/.table-m")  # MODIFY: allowed
        with pytest.raises(OSError) as e:
            await s.check_control(nobody, "flush", "main/raw/v/t")
        assert e.value.errno == errno.EACCES and "MODIFY on table main.raw.t" in str(e.value)
        why = s.why(nobody, "main/raw/.table-m/f", "read")
        assert why["missing"] == "SELECT on table main.raw.m" and why["errno"] == errno.EACCES

    trio.run(main)
