"""The governance decision without a kernel: examples of each rule, and a hypothesis test of
:func:`airfs.catalog.model.allowed` against a small reference model written from the Unity
Catalog tables (a flat list of facts, not the tree walk the model does)."""

from __future__ import annotations

import errno
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airfs.catalog.model import (
    RESERVED,
    CatalogError,
    Metastore,
    P,
    Privilege,
    Securable,
    Who,
    allowed,
    check_location,
    parse_privilege,
    visible,
    who,
)

ALICE = Who(frozenset({"alice", "group:alice"}))
BOB = Who(frozenset({"bob", "group:bob", "group:ml"}))
ROOT = Who(frozenset({"root", "group:root"}), is_root=True)


def meta() -> Metastore:
    """main.raw.images: alice reads (USE on both levels + READ on the volume); group ml reads
    and writes through grants on the schema; main.secret is nobody's but root's."""
    images = Securable(owner="root")
    raw = Securable(
        owner="root",
        grants={
            "group:ml": {P.USE_SCHEMA, P.READ_VOLUME, P.WRITE_VOLUME},
            "alice": {P.USE_SCHEMA},
        },
        children={"images": images, "ext": Securable(owner="root", location="s3://bucket/x")},
    )
    images.grants["alice"] = {P.READ_VOLUME}
    secret = Securable(owner="root", children={"v": Securable(owner="root")})
    main = Securable(
        owner="root",
        grants={"alice": {P.USE_CATALOG}, "group:ml": {P.USE_CATALOG}},
        children={"raw": raw, "secret": secret},
    )
    return Metastore(catalogs={"main": main})


def test_privilege_spellings() -> None:
    assert parse_privilege("READ VOLUME") is P.READ_VOLUME
    assert parse_privilege("read_volume") is P.READ_VOLUME
    assert parse_privilege(" all  privileges ") is P.ALL_PRIVILEGES
    with pytest.raises(CatalogError, match="unknown privilege"):
        parse_privilege("EXECUTE")


def test_no_catalog_allows_everything_but_the_reserved_name() -> None:
    assert allowed(None, ALICE, "mkdir", "x").ok
    assert allowed(None, ALICE, "open_write", "a/b/c/d").ok
    assert allowed(None, ROOT, "lookup", RESERVED).errno == errno.ENOENT
    assert not visible(None, ROOT, "", RESERVED)


def test_reader_reads_but_does_not_write() -> None:
    m = meta()
    for op in ("lookup", "getattr", "readdir", "open_read", "readlink"):
        assert allowed(m, ALICE, op, "main/raw/images/f").ok, op
    d = allowed(m, ALICE, "open_write", "main/raw/images/f")
    assert d.errno == errno.EACCES and d.missing == "WRITE VOLUME on volume main.raw.images"
    for op in ("create", "unlink", "rename_from", "rename_to", "write", "mkdir", "rmdir"):
        assert allowed(m, ALICE, op, "main/raw/images/f").errno == errno.EACCES, op


def test_group_writer_through_a_schema_grant() -> None:
    m = meta()
    assert allowed(m, BOB, "create", "main/raw/images/new").ok
    assert allowed(m, BOB, "unlink", "main/raw/images/d/x").ok
    assert allowed(m, BOB, "readdir", "main/raw/images").ok


def test_without_use_names_are_not_there() -> None:
    m = meta()
    d = allowed(m, ALICE, "lookup", "main/secret")
    assert d.errno == errno.ENOENT and d.missing == "USE SCHEMA on schema main.secret"
    assert allowed(m, ALICE, "open_read", "main/secret/v/f").errno == errno.ENOENT
    assert not visible(m, ALICE, "main", "secret")
    assert visible(m, ALICE, "main", "raw")
    assert allowed(m, ALICE, "lookup", "other").errno == errno.ENOENT
    assert allowed(m, ROOT, "lookup", "other").ok  # admins see unregistered names


def test_visible_volume_content_without_read_is_eacces() -> None:
    m = meta()
    m.catalogs["main"].children["raw"].children["images"].grants.clear()
    assert allowed(m, ALICE, "lookup", "main/raw/images").ok
    d = allowed(m, ALICE, "readdir", "main/raw/images")
    assert d.errno == errno.EACCES and d.missing == "READ VOLUME on volume main.raw.images"


def test_catalog_levels_refuse_changes_even_to_admins() -> None:
    m = meta()
    for path in ("x", "main/x", "main/raw/x", "main/raw/images"):
        for op in ("mkdir", "rmdir", "rename_from", "rename_to", "create", "write"):
            assert allowed(m, ROOT, op, path).errno == errno.EPERM, (op, path)
    assert allowed(m, ROOT, "mkdir", "main/raw/images/d").ok


def test_external_volume_is_listed_not_served() -> None:
    m = meta()
    assert allowed(m, BOB, "lookup", "main/raw/ext").ok
    d = allowed(m, BOB, "readdir", "main/raw/ext")
    assert d.errno == errno.EACCES and "external" in d.reason


def test_owner_and_all_privileges_and_manage() -> None:
    m = meta()
    m.catalogs["main"].children["secret"].owner = "alice"
    assert allowed(m, ALICE, "create", "main/secret/v/f").ok  # ownership covers what is below
    m.catalogs["main"].grants["bob"] = {P.ALL_PRIVILEGES}
    assert allowed(m, BOB, "create", "main/secret/v/f").ok
    m.catalogs["main"].grants["carol"] = {P.MANAGE}
    carol = Who(frozenset({"carol"}))
    assert allowed(m, carol, "lookup", "main").errno == errno.ENOENT  # MANAGE is not USE


def test_root_admin_is_configurable_and_aliases_map_principals() -> None:
    m = meta()
    root = Who(frozenset({"toor"}), is_root=True)  # root, but not the objects' owner "root"
    assert allowed(m, root, "open_read", "main/secret/v/f").ok
    m.root_admin = False
    assert allowed(m, root, "open_read", "main/secret/v/f").errno == errno.ENOENT
    m.admins.add("group:ops")
    assert allowed(m, who(m, "eve", ["ops"], is_root=False), "open_read", "main/secret/v/f").ok
    m.aliases["dave"] = "alice"
    assert allowed(m, who(m, "dave", [], is_root=False), "open_read", "main/raw/images/f").ok


def test_locations_are_validated() -> None:
    assert check_location("s3://bucket/a/") == "s3://bucket/a"
    assert check_location("/data/x") == "/data/x"
    for bad in ("relative/x", "s3://B_ad/x", "http://x", "/a/../b"):
        with pytest.raises(CatalogError):
            check_location(bad)


def test_round_trip_through_json() -> None:
    m = meta()
    m.admins.add("group:ops")
    again = Metastore.from_json(m.to_json())
    assert again.to_json() == m.to_json()


# -- the reference model ------------------------------------------------------------------

USERS = ["alice", "bob"]
GROUPS = ["ml"]
PRINCIPALS = USERS + [f"group:{g}" for g in GROUPS]
OBJECTS = [("c",), ("c", "s"), ("c", "s", "v"), ("c", "t"), ("c", "t", "w"), ("d",)]
PATHS = ["", "c", "c/s", "c/s/v", "c/s/v/f", "c/s/v/d/f", "c/t/w/f", "d", "c/u", "c/s/z/f"]
OPS = ["lookup", "getattr", "readdir", "open_read", "open_write", "create", "unlink", "mkdir"]


@dataclass(frozen=True)
class Fact:
    principal: str
    privilege: Privilege | None  # None: ownership
    obj: tuple[str, ...]


def build(facts: list[Fact], grantable: bool = True) -> Metastore:
    m = Metastore(root_admin=True)
    for obj in OBJECTS:
        level = m.catalogs
        for name in obj[:-1]:
            level = level[name].children
        level[obj[-1]] = Securable(owner="root")
    for f in facts:
        node = m.find(f.obj)
        assert node is not None
        if f.privilege is None:
            node[-1].owner = f.principal
        else:
            node[-1].grants.setdefault(f.principal, set()).add(f.privilege)
    return m


def ref_has(
    facts: list[Fact], principals: frozenset[str], priv: Privilege, obj: tuple[str, ...]
) -> bool:
    """Unity Catalog, literally: a privilege held on the object or any container of it;
    ownership of either gives all (an object has one owner: the last one set); ALL
    PRIVILEGES gives all but MANAGE."""
    owners = {f.obj: f.principal for f in facts if f.privilege is None}
    for f in facts:
        if f.privilege is None and owners[f.obj] != f.principal:
            continue
        if f.principal not in principals or obj[: len(f.obj)] != f.obj:
            continue
        if f.privilege is None or f.privilege is priv:
            return True
        if f.privilege is P.ALL_PRIVILEGES and priv is not P.MANAGE:
            return True
    return False


def reference(facts: list[Fact], w: Who, op: str, path: str) -> int:
    parts = tuple(path.split("/")) if path else ()
    writes = op not in ("lookup", "getattr", "readdir", "open_read")
    if writes and len(parts) <= 3:
        return errno.EPERM
    if w.is_root:
        return 0
    known = set(OBJECTS)
    for i in range(1, min(3, len(parts)) + 1):
        if parts[:i] not in known:
            return errno.ENOENT
    if len(parts) >= 1 and not ref_has(facts, w.principals, P.USE_CATALOG, parts[:1]):
        return errno.ENOENT
    if len(parts) >= 2 and not ref_has(facts, w.principals, P.USE_SCHEMA, parts[:2]):
        return errno.ENOENT
    if len(parts) < 3 or (len(parts) == 3 and op in ("lookup", "getattr")):
        return 0
    needs = [P.READ_VOLUME] + ([P.WRITE_VOLUME] if writes else [])
    if all(ref_has(facts, w.principals, n, parts[:3]) for n in needs):
        return 0
    return errno.EACCES


#: the USE grants most decisions hinge on, drawn often so that the volume rules get exercised
USE_FACTS = [
    Fact(p, priv, obj)
    for p in PRINCIPALS
    for priv, obj in (
        (P.USE_CATALOG, ("c",)),
        (P.USE_SCHEMA, ("c", "s")),
        (P.USE_SCHEMA, ("c", "t")),
    )
]
facts_st = st.builds(
    lambda base, more: base + more,
    st.lists(st.sampled_from(USE_FACTS), max_size=6),
    st.lists(
        st.builds(
            Fact,
            st.sampled_from(PRINCIPALS),
            st.one_of(st.none(), st.sampled_from(list(Privilege))),
            st.sampled_from(OBJECTS),
        ),
        max_size=8,
    ),
)
who_st = st.builds(
    lambda u, gs, root: Who(frozenset({u, *(f"group:{g}" for g in gs)}), root),
    st.sampled_from(USERS),
    st.sets(st.sampled_from(GROUPS)),
    st.booleans(),
)


@settings(max_examples=1000, deadline=None)
@given(facts_st, who_st, st.sampled_from(OPS), st.sampled_from(PATHS))
def test_allowed_matches_the_reference(facts: list[Fact], w: Who, op: str, path: str) -> None:
    m = build(facts)
    assert allowed(m, w, op, path).errno == reference(facts, w, op, path)
    if path and op == "lookup":
        parent, _, name = path.rpartition("/")
        assert visible(m, w, parent, name) == (reference(facts, w, "lookup", path) == 0) or (
            len(parent.split("/")) >= 3
        )


# -- commands against a set model -----------------------------------------------------------

CMD_OBJECTS = [("catalog", "c"), ("schema", "c.s"), ("volume", "c.s.v")]
GRANTABLE_BY_KIND: dict[str, list[Privilege]] = {
    "catalog": list(Privilege),
    "schema": [p for p in Privilege if p not in (P.USE_CATALOG, P.CREATE_SCHEMA)],
    "volume": [P.READ_VOLUME, P.WRITE_VOLUME, P.MANAGE, P.ALL_PRIVILEGES],
}

step_st = st.tuples(
    st.sampled_from(["grant", "revoke", "set-owner"]),
    st.sampled_from(CMD_OBJECTS),
    st.sampled_from(PRINCIPALS),
    st.integers(0, 7),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(step_st, max_size=30))
def test_grant_revoke_set_owner_match_a_set_model(steps: list[tuple[str, Any, str, int]]) -> None:
    """Root runs random grant/revoke/set-owner commands; what show-grants reports on each
    object (its own entries) is exactly the set of grants and the owner the model holds."""
    from airfs.catalog.commands import apply

    m: Metastore | None = None
    setup: list[tuple[str, dict[str, Any]]] = [
        ("init", {}),
        ("create-catalog", {"name": "c"}),
        ("create-schema", {"name": "c.s"}),
        ("create-volume", {"name": "c.s.v"}),
    ]
    for command, cargs in setup:
        m, _ = apply(m, ROOT, command, cargs)
    grants: set[tuple[str, str, str]] = set()
    owners = {name: "root" for _, name in CMD_OBJECTS}
    for command, (kind, name), principal, i in steps:
        args: dict[str, Any] = {"type": kind.upper(), "name": name, "principal": principal}
        if command == "set-owner":
            owners[name] = principal
        else:
            priv = GRANTABLE_BY_KIND[kind][i % len(GRANTABLE_BY_KIND[kind])]
            args["privilege"] = priv.value.replace(" ", "_").lower()
            if command == "grant":
                grants.add((principal, priv.value, name))
            else:
                grants.discard((principal, priv.value, name))
        new, _ = apply(m, ROOT, command, args)
        assert new is not None
        m = new
    for _, name in CMD_OBJECTS:
        _, shown = apply(m, ROOT, "show-grants", {"name": name})
        own = {(g["principal"], g["privilege"]) for g in shown if g["inherited_from"] is None}
        want = {(p, x) for p, x, o in grants if o == name} | {(owners[name], "OWNER")}
        assert own == want, name
