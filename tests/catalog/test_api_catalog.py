"""The catalog's REST API against a real ``airfs catalog serve`` on a directory and on
SeaweedFS S3, driven by the real clients (``databricks-sdk``'s ``WorkspaceClient`` and the
official ``unitycatalog-client``) and by raw HTTP for bad input: listing with paging, creating,
updating, dropping, granting, and every refusal checked by its status and ``error_code``."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from apitest_util import Server, serve, token
from cattest_util import Origin_, site

from airfs.catalog.api.tokens import TOKENS_PATH

pytest.importorskip("databricks.sdk")
pytest.importorskip("unitycatalog.client")
from databricks.sdk import WorkspaceClient
from databricks.sdk.errors import DatabricksError, NotFound, PermissionDenied, ResourceAlreadyExists
from databricks.sdk.service.catalog import (
    DataSourceFormat,
    PermissionsChange,
    Privilege,
    TableType,
    VolumeType,
)

CAT = "/api/2.1/unity-catalog"


class Api:
    def __init__(self, o: Origin_, srv: Server) -> None:
        self.o = o
        self.srv = srv

    def sdk(self, who: str) -> WorkspaceClient:
        return WorkspaceClient(host=self.srv.url, token=self.srv.tokens[who])


@pytest.fixture(scope="module", params=["posix", pytest.param("s3", marks=pytest.mark.s3)])
def api(request: pytest.FixtureRequest) -> Iterator[Api]:
    seaweed = request.getfixturevalue("seaweed") if request.param == "s3" else None
    with site(request.param, seaweed) as s:
        o = s.origin
        for argv in (
            ["init", "--admin", "ops"],
            ["create-catalog", "main"],
            ["create-schema", "main.raw"],
            ["create-volume", "main.raw.files"],
        ):
            code, _out, err = o.catalog(*argv)
            assert code == 0, err
        with serve(o, s.base / "serve.log") as srv:
            srv.tokens = {
                "ops": token(o, "ops"),
                "alice": token(o, "alice", "ml"),
                "bob": token(o, "bob"),
            }
            yield Api(o, srv)


def tag() -> str:
    return uuid.uuid4().hex[:8]


def test_sdk_creates_lists_pages_updates_and_drops(api: Api) -> None:
    ops, alice = api.sdk("ops"), api.sdk("alice")
    t = tag()
    names = [f"c{t}{i}" for i in range(3)]
    for n in names:
        info = ops.catalogs.create(name=n, comment=f"about {n}")
        assert (info.name, info.owner, info.comment) == (n, "ops", f"about {n}")
    # paging: one per page, every page followed by the SDK
    status, _h, data = api.srv.raw(
        "GET", f"{CAT}/catalogs?max_results=1", token=api.srv.tokens["ops"]
    )
    page = json.loads(data)
    assert status == 200 and len(page["catalogs"]) == 1 and page["next_page_token"]
    listed = [c.name for c in ops.catalogs.list(max_results=1)]
    assert set(names) <= set(listed) and listed == sorted(listed)
    # alice sees none of them (no USE CATALOG), not even by name
    assert not set(names) & {c.name for c in alice.catalogs.list()}
    with pytest.raises(NotFound) as e:
        alice.catalogs.get(names[0])
    assert e.value.error_code == "RESOURCE_DOES_NOT_EXIST"

    c = names[0]
    sch = ops.schemas.create(name="s", catalog_name=c, comment="a schema")
    assert (sch.full_name, sch.catalog_name, sch.comment) == (f"{c}.s", c, "a schema")
    vol = ops.volumes.create(
        catalog_name=c, schema_name="s", name="v", volume_type=VolumeType.MANAGED
    )
    assert vol.full_name == f"{c}.s.v" and vol.volume_type == VolumeType.MANAGED
    assert vol.storage_location and vol.storage_location.endswith(f"/{c}/s/v")
    assert api.o.view.stat(f"{c}/s/v").kind.value == "dir"
    assert [v.name for v in ops.volumes.list(catalog_name=c, schema_name="s")] == ["v"]

    upd = ops.catalogs.update(c, comment="changed", owner="alice")
    assert (upd.comment, upd.owner) == ("changed", "alice")
    assert alice.catalogs.get(c).owner == "alice"  # the owner sees it now
    ren = alice.schemas.update(f"{c}.s", new_name="s2")
    assert ren.full_name == f"{c}.s2"
    assert api.o.view.stat(f"{c}/s2/v").kind.value == "dir"  # the directory moved too
    with pytest.raises(ResourceAlreadyExists) as e2:
        ops.catalogs.create(name=c)
    assert e2.value.error_code == "RESOURCE_ALREADY_EXISTS"
    with pytest.raises(DatabricksError) as e3:
        ops.schemas.delete(f"{c}.s2")  # not empty
    assert e3.value.error_code == "INVALID_STATE"
    ops.volumes.delete(f"{c}.s2.v")
    ops.schemas.delete(f"{c}.s2")
    for n in names:
        ops.catalogs.delete(n)
    assert not set(names) & {x.name for x in ops.catalogs.list()}


def test_sdk_grants_decide_what_a_principal_sees_and_does(api: Api) -> None:
    ops, alice, bob = api.sdk("ops"), api.sdk("alice"), api.sdk("bob")
    c = f"g{tag()}"
    ops.catalogs.create(name=c)
    ops.schemas.create(name="s", catalog_name=c)
    with pytest.raises(NotFound):
        alice.schemas.get(f"{c}.s")
    ops.grants.update(
        "catalog", c, changes=[PermissionsChange(principal="group:ml", add=[Privilege.USE_CATALOG])]
    )
    got = ops.grants.update(
        "schema",
        f"{c}.s",
        changes=[
            PermissionsChange(
                principal="alice", add=[Privilege.USE_SCHEMA, Privilege.CREATE_VOLUME]
            )
        ],
    )
    assert {(a.principal, tuple(a.privileges or [])) for a in got.privilege_assignments or []} == {
        ("alice", (Privilege.CREATE_VOLUME, Privilege.USE_SCHEMA))
    }
    # alice holds USE CATALOG through her token's group, and may now create a volume
    assert alice.schemas.get(f"{c}.s").full_name == f"{c}.s"
    v = alice.volumes.create(
        catalog_name=c, schema_name="s", name="mine", volume_type=VolumeType.MANAGED
    )
    assert v.owner == "alice"
    # bob has nothing: the catalog is invisible to him; alice may not grant on the schema
    with pytest.raises(NotFound):
        bob.catalogs.get(c)
    with pytest.raises(PermissionDenied) as e:
        alice.grants.update(
            "schema",
            f"{c}.s",
            changes=[PermissionsChange(principal="bob", add=[Privilege.USE_SCHEMA])],
        )
    assert e.value.error_code == "PERMISSION_DENIED" and "MANAGE" in str(e.value)
    # without MANAGE alice sees only the grants to her (and her groups); ops sees all
    ops.grants.update(
        "catalog", c, changes=[PermissionsChange(principal="bob", add=[Privilege.CREATE_SCHEMA])]
    )
    mine = alice.grants.get("catalog", c).privilege_assignments or []
    assert [(a.principal, a.privileges) for a in mine] == [("group:ml", [Privilege.USE_CATALOG])]
    every = ops.grants.get("catalog", c).privilege_assignments or []
    assert [(a.principal, a.privileges) for a in every] == [
        ("bob", [Privilege.CREATE_SCHEMA]),
        ("group:ml", [Privilege.USE_CATALOG]),
    ]
    ops.grants.update(
        "catalog",
        c,
        changes=[PermissionsChange(principal="group:ml", remove=[Privilege.USE_CATALOG])],
    )
    with pytest.raises(NotFound):
        alice.schemas.get(f"{c}.s")


def test_sdk_tables_registered_granted_and_dropped(api: Api) -> None:
    ops, alice = api.sdk("ops"), api.sdk("alice")
    c = f"t{tag()}"
    ops.catalogs.create(name=c)
    ops.schemas.create(name="s", catalog_name=c)
    ops.volumes.create(catalog_name=c, schema_name="s", name="v", volume_type=VolumeType.MANAGED)
    m = ops.tables.create(
        name="sales",
        catalog_name=c,
        schema_name="s",
        table_type=TableType.MANAGED,
        data_source_format=DataSourceFormat.DELTA,
        storage_location="",
    )
    assert (m.full_name, m.table_type, m.data_source_format) == (
        f"{c}.s.sales",
        TableType.MANAGED,
        DataSourceFormat.DELTA,
    )
    x = ops.tables.create(
        name="ext",
        catalog_name=c,
        schema_name="s",
        table_type=TableType.EXTERNAL,
        data_source_format=DataSourceFormat.PARQUET,
        storage_location=f"/Volumes/{c}/s/v/ext",
    )
    assert x.storage_location and x.storage_location.endswith(f"/{c}/s/v/ext")
    assert [t.name for t in ops.tables.list(catalog_name=c, schema_name="s", max_results=1)] == [
        "ext",
        "sales",
    ]
    assert ops.tables.exists(f"{c}.s.sales").table_exists
    ops.grants.update(
        "catalog", c, changes=[PermissionsChange(principal="alice", add=[Privilege.USE_CATALOG])]
    )
    ops.grants.update(
        "schema",
        f"{c}.s",
        changes=[PermissionsChange(principal="alice", add=[Privilege.USE_SCHEMA])],
    )
    got = ops.grants.update(
        "table",
        f"{c}.s.sales",
        changes=[PermissionsChange(principal="alice", add=[Privilege.SELECT])],
    )
    assert [(a.principal, a.privileges) for a in got.privilege_assignments or []] == [
        ("alice", [Privilege.SELECT])
    ]
    assert alice.tables.get(f"{c}.s.sales").owner == "ops"
    with pytest.raises(PermissionDenied):
        alice.tables.delete(f"{c}.s.sales")
    ops.tables.update(f"{c}.s.sales", owner="alice")
    assert alice.tables.get(f"{c}.s.sales").owner == "alice"
    alice.tables.delete(f"{c}.s.sales")
    with pytest.raises(NotFound):
        ops.tables.get(f"{c}.s.sales")


def test_unitycatalog_client(api: Api) -> None:
    from unitycatalog.client import (
        ApiClient,
        CatalogsApi,
        Configuration,
        GrantsApi,
        SchemasApi,
        TablesApi,
        VolumesApi,
    )
    from unitycatalog.client.exceptions import ApiException
    from unitycatalog.client.models import (
        ColumnInfo,
        ColumnTypeName,
        CreateSchema,
        CreateTable,
        CreateVolumeRequestContent,
        SecurableType,
        UpdatePermissions,
    )
    from unitycatalog.client.models import DataSourceFormat as UcFormat
    from unitycatalog.client.models import (
        PermissionsChange as UcChange,
    )
    from unitycatalog.client.models import (
        Privilege as UcPrivilege,
    )
    from unitycatalog.client.models import TableType as UcTableType
    from unitycatalog.client.models import (
        VolumeType as UcVolumeType,
    )

    c = f"u{tag()}"
    api.sdk("ops").catalogs.create(name=c)

    async def session(who: str) -> Any:
        conf = Configuration(host=api.srv.url + CAT)
        return ApiClient(
            conf, header_name="Authorization", header_value=f"Bearer {api.srv.tokens[who]}"
        )

    async def main() -> dict[str, Any]:
        out: dict[str, Any] = {}
        async with await session("ops") as ops, await session("alice") as alice:
            out["catalogs"] = [
                x.name for x in (await CatalogsApi(ops).list_catalogs()).catalogs or []
            ]
            s = await SchemasApi(ops).create_schema(
                CreateSchema(name="s", catalog_name=c, comment="uc")
            )
            out["schema"] = (s.full_name, s.comment, s.owner)
            v = await VolumesApi(ops).create_volume(
                CreateVolumeRequestContent(
                    catalog_name=c, schema_name="s", name="v", volume_type=UcVolumeType.MANAGED
                )
            )
            out["volume"] = (v.full_name, v.volume_type)
            g = await GrantsApi(ops).update(
                SecurableType.SCHEMA,
                f"{c}.s",
                UpdatePermissions(
                    changes=[UcChange(principal="alice", add=[UcPrivilege.USE_SCHEMA], remove=[])]
                ),
            )
            out["grants"] = [(a.principal, a.privileges) for a in g.privilege_assignments]
            t = await TablesApi(ops).create_table(
                CreateTable(
                    name="events",
                    catalog_name=c,
                    schema_name="s",
                    table_type=UcTableType.MANAGED,
                    data_source_format=UcFormat.DELTA,
                    columns=[
                        ColumnInfo(
                            name="id",
                            type_text="bigint",
                            type_name=ColumnTypeName.LONG,
                            position=0,
                            nullable=False,
                        )
                    ],
                )
            )
            out["table"] = (t.name, t.table_type, [col.name for col in t.columns or []])
            listed = await TablesApi(ops).list_tables(catalog_name=c, schema_name="s")
            out["tables"] = [x.name for x in listed.tables or []]
            try:
                await CatalogsApi(alice).get_catalog(c)
            except ApiException as exc:
                out["alice"] = (exc.status, json.loads(exc.body)["error_code"])
            try:
                await CatalogsApi(ops).get_catalog("no_such_catalog")
            except ApiException as exc:
                out["missing"] = (exc.status, json.loads(exc.body)["error_code"])
        return out

    out = asyncio.run(main())
    assert c in out["catalogs"]
    assert out["schema"] == (f"{c}.s", "uc", "ops")
    assert out["volume"] == (f"{c}.s.v", UcVolumeType.MANAGED)
    assert out["grants"] == [("alice", [UcPrivilege.USE_SCHEMA])]
    assert out["table"] == ("events", UcTableType.MANAGED, ["id"])
    assert out["tables"] == ["events"]
    assert out["alice"] == (404, "RESOURCE_DOES_NOT_EXIST")
    assert out["missing"] == (404, "RESOURCE_DOES_NOT_EXIST")


def test_bad_input_gets_unity_catalogs_errors(api: Api) -> None:
    srv, ops, alice = api.srv, api.srv.tokens["ops"], api.srv.tokens["alice"]
    e = srv.error
    assert e("GET", f"{CAT}/catalogs")[:2] == (401, "UNAUTHENTICATED")
    assert e("GET", f"{CAT}/catalogs", token="airfs-0-0")[:2] == (401, "UNAUTHENTICATED")
    assert e("GET", f"{CAT}/catalogs", headers={"Authorization": "Basic b3BzOng="})[:2] == (
        401,
        "UNAUTHENTICATED",
    )
    assert e("GET", f"{CAT}/catalogs/nope", token=ops)[:2] == (404, "RESOURCE_DOES_NOT_EXIST")
    assert e("GET", f"{CAT}/schemas/main.nope", token=ops)[:2] == (404, "RESOURCE_DOES_NOT_EXIST")
    assert e("POST", f"{CAT}/catalogs", token=ops, body=b"{bad")[:2] == (400, "MALFORMED_REQUEST")
    assert e("POST", f"{CAT}/catalogs", token=ops, body=b"[1]")[:2] == (
        400,
        "INVALID_PARAMETER_VALUE",
    )
    status, code, msg = e("POST", f"{CAT}/catalogs", token=ops, body=b'{"name": "a b"}')
    assert (status, code) == (400, "INVALID_PARAMETER_VALUE") and "bad catalog name" in msg
    assert e("POST", f"{CAT}/catalogs", token=ops, body=b'{"name": "main"}')[:2] == (
        409,
        "RESOURCE_ALREADY_EXISTS",
    )
    status, code, msg = e("POST", f"{CAT}/catalogs", token=alice, body=b'{"name": "x1"}')
    assert (status, code) == (403, "PERMISSION_DENIED") and "admin" in msg
    bad_priv = json.dumps({"changes": [{"principal": "bob", "add": ["FLY"]}]}).encode()
    status, code, msg = e("PATCH", f"{CAT}/permissions/catalog/main", token=ops, body=bad_priv)
    assert (status, code) == (400, "INVALID_PARAMETER_VALUE") and "unknown privilege" in msg
    assert e("GET", f"{CAT}/permissions/function/main.x.f", token=ops)[:2] == (
        400,
        "INVALID_PARAMETER_VALUE",
    )
    assert e("POST", f"{CAT}/catalogs", token=ops, body=b" " * (2 << 20))[:2] == (
        413,
        "INVALID_PARAMETER_VALUE",
    )
    assert e("GET", f"{CAT}/catalogs?max_results=x", token=ops)[:2] == (
        400,
        "INVALID_PARAMETER_VALUE",
    )
    assert e("GET", f"{CAT}/catalogs?page_token=%%%", token=ops)[:2] == (
        400,
        "INVALID_PARAMETER_VALUE",
    )
    assert e("GET", f"{CAT}/functions", token=ops)[:2] == (404, "ENDPOINT_NOT_FOUND")
    assert e("GET", "/api/2.0/clusters/list", token=ops)[:2] == (404, "ENDPOINT_NOT_FOUND")
    # what the HTTP layer itself refuses, in the same shape
    assert e("OPTIONS", f"{CAT}/catalogs", token=ops)[:2] == (501, "NOT_IMPLEMENTED")
    assert e("GET", "/" + "x" * 70000, token=ops)[:2] == (414, "BAD_REQUEST")
    # a revoked token stops working at the next request
    extra = token(api.o, "carol")
    assert srv.raw("GET", f"{CAT}/catalogs", token=extra)[0] == 200
    code, out, _err = api.o.catalog("--json", "token", "list")
    (tid,) = [t["id"] for t in json.loads(out) if t["principal"] == "carol"]
    assert api.o.catalog("token", "revoke", tid)[0] == 0
    assert e("GET", f"{CAT}/catalogs", token=extra)[:2] == (401, "UNAUTHENTICATED")


def test_tokens_are_kept_hashed(api: Api) -> None:
    text = token(api.o, "dave", "ml")
    code, out, _err = api.o.catalog("--json", "token", "list")
    listed = [t for t in json.loads(out) if t["principal"] == "dave"]
    assert code == 0 and len(listed) == 1 and listed[0]["groups"] == ["ml"]
    assert "token" not in listed[0] and "sha256" not in listed[0]
    entry = api.o.view.stat(TOKENS_PATH)
    stored = api.o.view.read_range(TOKENS_PATH, 0, entry.size)
    assert text.encode() not in stored and text.split("-")[-1].encode() not in stored
    code, _out, err = api.o.catalog("token", "revoke", "nosuchid")
    assert code == 1 and "no token 'nosuchid'" in err
