"""The REST API and a mounted node on one origin (a directory and SeaweedFS S3): a grant made
over the API is honoured by the mount within its catalog TTL (a real user reading through the
kernel), and a file written over the Files API is read through the mount and the other way
round."""

from __future__ import annotations

import io
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from apitest_util import Server, serve, token
from cattest_util import People, Site, User, run_as, site

from airfs.testing.mountfix import fuse_available

pytest.importorskip("databricks.sdk")
from databricks.sdk import WorkspaceClient
from databricks.sdk.errors import NotFound
from databricks.sdk.service.catalog import PermissionsChange, Privilege

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (useradd, mounts)"),
    pytest.mark.mount,
]


@pytest.fixture(params=["posix", pytest.param("s3", marks=pytest.mark.s3)])
def node(request: pytest.FixtureRequest, folks: People) -> Iterator[tuple[Site, Server]]:
    if not fuse_available():
        pytest.skip("needs /dev/fuse and fusermount3")
    seaweed = request.getfixturevalue("seaweed") if request.param == "s3" else None
    with site(request.param, seaweed) as s:
        for argv in (
            ["init", "--admin", "ops"],
            ["create-catalog", "main"],
            ["create-schema", "main.raw"],
            ["create-volume", "main.raw.images"],
        ):
            code, _out, err = s.origin.catalog(*argv)
            assert code == 0, err
        s.mount()
        with serve(s.origin, s.base / "serve.log") as srv:
            srv.tokens = {"ops": token(s.origin, "ops"), "alice": token(s.origin, folks.alice.name)}
            yield s, srv


def _lists(user: User, mp: Path) -> list[object]:
    out: list[object] = run_as(
        user,
        mp,
        """
        print(json.dumps(attempt(lambda: sorted(os.listdir(MP + "/main/raw/images")))))
        """,
    )
    return out


def test_a_grant_over_the_api_reaches_the_mount(node: tuple[Site, Server], folks: People) -> None:
    s, srv = node
    mp = s.nodes[0].mountpoint
    ops = WorkspaceClient(host=srv.url, token=srv.tokens["ops"])
    ops.files.upload("/Volumes/main/raw/images/a.bin", io.BytesIO(b"a" * 100))
    assert _lists(folks.alice, mp)[0] == "ENOENT"  # main is not visible to her
    for kind, name, priv in (
        ("catalog", "main", Privilege.USE_CATALOG),
        ("schema", "main.raw", Privilege.USE_SCHEMA),
        ("volume", "main.raw.images", Privilege.READ_VOLUME),
    ):
        ops.grants.update(
            kind, name, changes=[PermissionsChange(principal=folks.alice.name, add=[priv])]
        )
    for _ in range(20):  # each try takes longer than the catalog TTL (0.5 s) to start
        out = _lists(folks.alice, mp)
        if out[0] == "ok":
            break
    assert out == ["ok", ["a.bin"]], out
    # the same principal over the API: reads, may not write (no WRITE VOLUME)
    alice = WorkspaceClient(host=srv.url, token=srv.tokens["alice"])
    assert alice.files.download("/Volumes/main/raw/images/a.bin").contents.read() == b"a" * 100


def test_files_api_and_mount_see_each_others_writes(node: tuple[Site, Server]) -> None:
    s, srv = node
    mp = s.nodes[0].mountpoint
    ops = WorkspaceClient(host=srv.url, token=srv.tokens["ops"])
    ops.files.upload("/Volumes/main/raw/images/from-api/x.txt", io.BytesIO(b"over the API"))
    seen = None
    for _ in range(50):  # the mount's listing TTL is 0.5 s
        p = mp / "main/raw/images/from-api/x.txt"
        if p.exists():
            seen = p.read_bytes()
            break
        time.sleep(0.2)
    assert seen == b"over the API"
    (mp / "main/raw/images/from-mount.txt").write_bytes(b"through the kernel")
    os.sync()
    got = None
    for _ in range(50):  # the node commits in the background
        try:
            got = ops.files.download("/Volumes/main/raw/images/from-mount.txt").contents.read()
            break
        except NotFound:  # not committed to the origin yet
            time.sleep(0.2)
    assert got == b"through the kernel"
    names = {e.name for e in ops.files.list_directory_contents("/Volumes/main/raw/images")}
    assert {"from-api", "from-mount.txt"} <= names
