"""``airfs catalog`` table commands against an origin directory (no mount): create-table
(managed and external, by a path on the origin or relative to it), show-tables, describe,
update, grants on a table, drop-table; outputs, JSON and the one-line refusals."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from cattest_util import airfs_main

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="--origin is root's")


def cat(origin: Path, *argv: str) -> tuple[int, str, str]:
    return airfs_main("catalog", "--origin", str(origin), *argv)


def test_table_commands(tmp_path: Path) -> None:
    o = tmp_path / "origin"
    o.mkdir()
    for argv in (
        ["init"],
        ["create-catalog", "main"],
        ["create-schema", "main.default"],
        ["create-volume", "main.default.raw"],
        ["create-table", "main.default.sales", "--comment", "daily sales"],
        ["create-table", "main.default.events", "--location", str(o / "main/default/raw/ev"),
         "--format", "parquet"],
        ["create-table", "main.default.shared", "--location", "shared/tables/s"],
        ["grant", "SELECT", "ON", "TABLE", "main.default.sales", "TO", "group:ml"],
        ["grant", "modify", "ON", "table", "main.default.sales", "TO", "alice"],
        ["update", "TABLE", "main.default.events", "--owner", "alice", "--comment", "raw"],
    ):  # fmt: skip
        code, _out, err = cat(o, *argv)
        assert code == 0, (argv, err)
    # the directories: managed under the schema (no volume), external where asked
    assert (o / "main/default/.table-sales").is_dir()
    assert (o / "main/default/raw/ev").is_dir() and (o / "shared/tables/s").is_dir()
    code, out, _ = cat(o, "show-tables", "main.default")
    assert out.splitlines() == [
        "main.default.events  external PARQUET  owner alice  main/default/raw/ev",
        "main.default.sales  managed DELTA  owner root  main/default/.table-sales",
        "main.default.shared  external DELTA  owner root  shared/tables/s",
    ]
    code, out, _ = cat(o, "--json", "describe", "TABLE", "main.default.sales")
    d = json.loads(out)
    assert d["table_type"] == "MANAGED" and d["comment"] == "daily sales"
    assert d["location"] == "main/default/.table-sales" and d["owner"] == "root"
    code, out, _ = cat(o, "show-grants", "--type", "TABLE", "main.default.sales")
    assert "group:ml  SELECT  on main.default.sales" in out.splitlines()
    assert "alice  MODIFY  on main.default.sales" in out.splitlines()
    code, out, _ = cat(o, "describe", "table", "main.default.events")
    assert "owner                alice" in out.splitlines() and "comment              raw" in out
    for argv, reason in (
        (["create-table", "main.default.raw"], "main.default.raw is a volume"),
        (["create-table", "main.default.t", "--location", "/elsewhere/x"],
         "--location /elsewhere/x: not under"),
        (["create-table", "main.default.t", "--location", "main/default/raw/ev/part"],
         "overlaps that of table main.default.events"),
        (["grant", "READ VOLUME", "ON", "TABLE", "main.default.sales", "TO", "x"],
         "READ VOLUME cannot be granted on a table"),
        (["describe", "TABLE", "main.default.nope"], "table main.default.nope does not exist"),
        (["drop-volume", "main.default.raw"], "holds the files of table main.default.events"),
        (["update", "TABLE", "main.default.sales"], "nothing to change"),
    ):  # fmt: skip
        code, _out, err = cat(o, *argv)
        assert code == 1 and err.count("\n") == 1 and reason in err, (argv, err)
    assert cat(o, "create-table", "main.default.t", "--format", "csv")[0] == 2
    (o / "main/default/.table-sales/f.parquet").write_bytes(b"x")
    code, out, _ = cat(o, "--json", "drop-table", "main.default.sales")
    moved = json.loads(out)["files_moved_to"]
    assert code == 0 and moved.startswith(".airfs-catalog/dropped/main.default.sales@")
    assert (o / moved / "f.parquet").exists() and not (o / "main/default/.table-sales").exists()
    assert cat(o, "drop-table", "main.default.events")[0] == 0
    assert (o / "main/default/raw/ev").is_dir()  # an external table's files stay


@pytest.mark.s3
def test_table_commands_on_an_s3_origin(seaweed: object) -> None:
    """The catalog at an S3 origin (SeaweedFS): a managed table's directory made there, its
    objects moved aside by drop-table, an external table's left in place."""
    from cattest_util import put, site

    from airfs.origin.base import NotFound

    with site("s3", seaweed) as s:
        o = s.origin
        for argv in (
            ["init"],
            ["create-catalog", "main"],
            ["create-schema", "main.default"],
            ["create-volume", "main.default.raw"],
            ["create-table", "main.default.sales"],
            ["create-table", "main.default.ev", "--location", "main/default/raw/ev"],
        ):
            code, _out, err = o.catalog(*argv)
            assert code == 0, (argv, err)
        put(o.view, s.base, "main/default/.table-sales/_delta_log/0.json", b"{}")
        put(o.view, s.base, "main/default/raw/ev/p.parquet", b"p")
        code, out, err = o.catalog("--json", "show-tables", "main.default")
        assert [t["full_name"] for t in json.loads(out)] == [
            "main.default.ev",
            "main.default.sales",
        ]
        code, out, err = o.catalog("--json", "drop-table", "main.default.sales")
        assert code == 0, err
        moved = json.loads(out)["files_moved_to"]
        assert o.view.stat(f"{moved}/_delta_log/0.json").size == 2
        with pytest.raises(NotFound):
            o.view.stat("main/default/.table-sales/_delta_log/0.json")
        assert o.catalog("drop-table", "main.default.ev")[0] == 0
        assert o.view.stat("main/default/raw/ev/p.parquet").size == 1
