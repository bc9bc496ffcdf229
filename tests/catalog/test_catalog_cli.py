"""``airfs catalog`` against an origin directory (no mount): every command, its output and
JSON, exit codes 0/1/2 with one-line reasons, ``--help`` on each command."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from cattest_util import airfs_main

from airfs.catalog.store import CATALOG_PATH


def cat(origin: Path, *argv: str) -> tuple[int, str, str]:
    return airfs_main("catalog", "--origin", str(origin), *argv)


@pytest.mark.skipif(os.geteuid() != 0, reason="--origin is root's")
def test_commands_outputs_and_exit_codes(tmp_path: Path) -> None:
    o = tmp_path / "origin"
    o.mkdir()
    assert cat(o, "list")[0] == 1  # no catalog yet
    assert "run airfs catalog init first" in cat(o, "list")[2]
    assert cat(o, "init", "--admin", "group:ops")[0] == 0
    assert (o / CATALOG_PATH).stat().st_mode & 0o777 == 0o600
    for argv in (
        ["create-catalog", "main", "--comment", "the main one"],
        ["create-schema", "main.raw"],
        ["create-volume", "main.raw.images"],
        ["create-volume", "main.raw.ext", "--location", "s3://bucket/prefix/"],
        ["grant", "read_volume", "on", "volume", "main.raw.images", "to", "group:ml"],
        ["grant", "USE CATALOG", "ON", "CATALOG", "main", "TO", "alice"],
        ["set-owner", "schema", "main.raw", "alice"],
        ["map-principal", "bob", "bob@corp.example"],
    ):
        code, _out, err = cat(o, *argv)
        assert code == 0, (argv, err)
    assert (o / "main/raw/images").stat().st_mode & 0o777 == 0o777
    assert not (o / "main/raw/ext").exists()
    code, out, _ = cat(o, "--json", "list", "main.raw")
    assert code == 0
    assert json.loads(out) == [
        {"name": "main.raw.ext", "type": "volume", "owner": "root",
         "location": "s3://bucket/prefix", "external": True, "immutable": False},
        {"name": "main.raw.images", "type": "volume", "owner": "root",
         "location": "main/raw/images", "external": False, "immutable": False},
    ]  # fmt: skip
    code, out, _ = cat(o, "show-grants", "main.raw.images", "--principal", "group:ml")
    assert out.splitlines() == ["group:ml  READ VOLUME  on main.raw.images"]
    code, out, _ = cat(o, "list")
    assert out.splitlines() == ["catalog  main  owner root"]
    # refusals: exit 1, one line
    for argv, reason in (
        (["create-catalog", "main"], "catalog main exists already"),
        (["create-schema", "nope.raw"], "catalog nope does not exist"),
        (["drop-schema", "main.raw"],
         "schema main.raw is not empty (drop its volumes and tables first)"),
        (["create-volume", "main.raw.bad name"], "bad volume name 'bad name'"),
        (["grant", "USE CATALOG", "ON", "VOLUME", "main.raw.images", "TO", "x"],
         "USE CATALOG cannot be granted on a volume"),
        (["grant", "READ VOLUME", "ON", "VOLUME", "main.raw", "TO", "x"],
         "bad name 'main.raw': expected CATALOG.SCHEMA.VOLUME"),
        (["init"], "the catalog exists already"),
    ):  # fmt: skip
        code, _out, err = cat(o, *argv)
        assert code == 1 and err.count("\n") == 1 and reason in err, (argv, err)
    # usage: exit 2
    for argv in (
        ["grant", "EXECUTE", "ON", "VOLUME", "main.raw.images", "TO", "x"],
        ["grant", "READ VOLUME", "IN", "VOLUME", "main.raw.images", "TO", "x"],
        ["revoke", "READ VOLUME", "ON", "VIEW", "main.raw.images", "FROM", "x"],
        ["create-volume", "main.raw.v", "--location", "relative/dir"],
        ["frobnicate"],
    ):
        assert cat(o, *argv)[0] == 2, argv
    assert cat(o, "revoke", "READ VOLUME", "ON", "VOLUME", "main.raw.images", "FROM",
               "group:ml")[0] == 0  # fmt: skip
    assert cat(o, "show-grants", "main.raw.images", "--principal", "group:ml")[1] == ""
    assert cat(o, "drop-volume", "main.raw.ext")[0] == 0


@pytest.mark.skipif(os.geteuid() != 0, reason="--origin is root's")
def test_a_volume_is_declared_immutable_by_a_holder_of_manage_only(tmp_path: Path) -> None:
    o = tmp_path / "origin"
    o.mkdir()
    for argv in (
        ["init"],
        ["create-catalog", "main"],
        ["create-schema", "main.raw"],
        ["create-volume", "main.raw.images"],
        ["grant", "USE CATALOG", "ON", "CATALOG", "main", "TO", "alice"],
        ["grant", "USE SCHEMA", "ON", "SCHEMA", "main.raw", "TO", "alice"],
        ["grant", "READ VOLUME", "ON", "VOLUME", "main.raw.images", "TO", "alice"],
    ):
        assert cat(o, *argv)[0] == 0, argv
    code, out, err = cat(o, "--json", "update", "volume", "main.raw.images", "--immutable", "true")
    assert code == 0, err
    assert json.loads(out)["immutable"] is True
    doc = json.loads((o / CATALOG_PATH).read_text())
    assert doc["catalogs"]["main"]["schemas"]["raw"]["volumes"]["images"]["immutable"] is True
    code, out, _ = cat(o, "--json", "describe", "volume", "main.raw.images")
    assert json.loads(out)["immutable"] is True
    # alice reads the volume but does not hold MANAGE on it: refused, and the reason says so
    from airfs.catalog.commands import apply
    from airfs.catalog.model import CatalogError, Metastore, who

    meta = Metastore.from_json(doc)
    alice = who(meta, "alice", [], is_root=False)
    args = {"type": "volume", "name": "main.raw.images", "immutable": False}
    reason = re.escape("alice lacks MANAGE on volume main.raw.images")
    with pytest.raises(CatalogError, match=reason) as refused:
        apply(meta, alice, "update", args)
    assert refused.value.errno == 13  # EACCES
    for argv, reason in (
        (["update", "schema", "main.raw", "--immutable", "true"],
         "only a volume can be immutable (main.raw is a schema)"),
    ):  # fmt: skip
        code, _out, err = cat(o, *argv)
        assert code == 1 and reason in err, (argv, err)
    assert cat(o, "update", "volume", "main.raw.images", "--immutable", "maybe")[0] == 2
    assert cat(o, "update", "volume", "main.raw.images", "--immutable", "false")[0] == 0
    doc = json.loads((o / CATALOG_PATH).read_text())
    assert "immutable" not in doc["catalogs"]["main"]["schemas"]["raw"]["volumes"]["images"]


def test_help_on_each_command() -> None:
    from airfs.catalog.cli import register  # noqa: F401  (the commands below exist)

    for c in ("init", "create-catalog", "create-schema", "create-volume", "drop-catalog",
              "drop-schema", "drop-volume", "list", "grant", "revoke", "show-grants",
              "set-owner", "map-principal", "rename-catalog", "rename-schema",
              "rename-volume", "create-table", "drop-table", "show-tables", "describe",
              "update"):  # fmt: skip
        code, out, _ = airfs_main("catalog", c, "--help")
        assert code == 0 and out.startswith(f"usage: airfs catalog {c}"), c
    code, out, _ = airfs_main("catalog", "--help")
    assert code == 0 and "--origin" in out and "--mount" in out


def test_not_a_mount_and_origin_edits_are_roots(tmp_path: Path) -> None:
    code, _, err = airfs_main("catalog", "--mount", str(tmp_path), "list")
    assert code == 1 and err == f"airfs catalog: {tmp_path} is not an airfs mount\n"
    if os.geteuid() != 0:
        pytest.skip("the non-root case below starts as root and drops to nobody")
    script = (
        "import os, sys, shutil, gettext, pwd, grp\n"
        "from airfs.cli import app as cli\ncli.build_parser()\n"
        "os.setgid(65534); os.setuid(65534)\n"
        f"sys.exit(cli.main(['catalog', '--origin', {str(tmp_path)!r}, 'init']))\n"
    )
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert p.returncode == 1, p.stderr
    assert p.stderr.startswith("airfs catalog: only root edits the catalog at the origin")
