"""Governed volumes through the control socket, with real users and a group on root mounts of
a directory and of SeaweedFS S3: catalog commands applied with the caller's identity, grant
checks of warm/prefetch/flush, changes seen by a second node within the TTL, concurrent
grants from two nodes, denials counted in status."""

from __future__ import annotations

import errno
import json
import os
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from cattest_util import People, Site, governed, run_as, site

from airfs.catalog.store import CatalogStore
from airfs.control import client
from airfs.testing.mountfix import fuse_available

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (useradd, mounts)"),
    pytest.mark.mount,
]


@pytest.fixture(params=["posix", pytest.param("s3", marks=pytest.mark.s3)])
def gsite(request: pytest.FixtureRequest, folks: People) -> Iterator[Site]:
    if not fuse_available():
        pytest.skip("needs /dev/fuse and fusermount3")
    seaweed = request.getfixturevalue("seaweed") if request.param == "s3" else None
    with site(request.param, seaweed) as s:
        governed(s, folks)
        s.mount()
        yield s


def test_catalog_commands_run_with_the_callers_identity(gsite: Site, folks: People) -> None:
    mp = gsite.nodes[0].mountpoint
    out = run_as(
        folks.alice,
        mp,
        """
        print(json.dumps({
            "list": airfs("catalog", "--mount", MP, "--json", "list", "main.raw"),
            "grant": airfs("catalog", "--mount", MP, "grant", "READ VOLUME", "ON", "VOLUME",
                           "main.raw.secret", "TO", "alice"),
            "create": airfs("catalog", "--mount", MP, "create-catalog", "mine"),
            "usage": airfs("catalog", "--mount", MP, "grant", "READ", "ON", "VOLUME", "x",
                           "TO", "y"),
            "create_volume": airfs("catalog", "--mount", MP, "create-volume", "main.raw.x"),
        }))
        """,
    )
    code, text, _ = out["list"]
    assert code == 0
    assert [v["name"] for v in json.loads(text)] == ["main.raw.images", "main.raw.secret"]
    code, _, err = out["grant"]
    assert code == 1 and err.strip() == (
        f"airfs catalog: {folks.alice.name} lacks MANAGE on volume main.raw.secret"
    )
    code, _, err = out["create"]
    assert code == 1 and "is not a catalog admin" in err and err.count("\n") == 1
    assert out["usage"][0] == 2 and "unknown privilege 'READ'" in out["usage"][2]
    assert (
        out["create_volume"][0] == 1
        and "lacks CREATE VOLUME on schema main.raw" in out["create_volume"][2]
    )
    # root (an admin) grants through the mount; bob's group then manages the volume
    from cattest_util import airfs_main

    code, _, err = airfs_main("catalog", "--mount", str(mp), "grant", "MANAGE", "ON", "VOLUME",
                              "main.raw.images", "TO", f"group:{folks.group}")  # fmt: skip
    assert code == 0, err
    out = run_as(
        folks.bob,
        mp,
        """
        print(json.dumps(airfs("catalog", "--mount", MP, "--json", "show-grants",
                               "main.raw.images")))
        """,
    )
    assert out[0] == 0, out
    grants = {(g["principal"], g["privilege"]) for g in json.loads(out[1])}
    assert (folks.alice.name, "READ VOLUME") in grants  # MANAGE shows everyone's
    st = client.status(str(mp))["catalog"]
    assert st["denied_by_op"].get("catalog grant", 0) == 1
    assert st["denied_by_op"].get("catalog create-catalog", 0) == 1
    log = gsite.nodes[0].log.read_text()
    assert f"catalog: denied {folks.alice.name}" in log


def test_warm_prefetch_flush_need_read_and_write_volume(gsite: Site, folks: People) -> None:
    mp = gsite.nodes[0].mountpoint
    code = """
    print(json.dumps({
        "warm_images": call("warm", paths=["main/raw/images"]),
        "warm_secret": call("warm", paths=["main/raw/secret"]),
        "warm_all": call("warm", paths=[""]),
        "prefetch_secret": call("prefetch", paths=["main/raw/secret/s.bin"]),
        "flush_images": call("flush", path="main/raw/images"),
        "warm_hidden": call("warm", paths=["main/raw/nothere"]),
    }))
    """
    a = run_as(folks.alice, mp, code)
    b = run_as(folks.bob, mp, code)
    assert a["warm_images"]["ok"] and a["warm_images"]["result"]["files"] == 1, a
    assert a["warm_secret"] == {
        "ok": False,
        "errno": errno.EACCES,
        "error": "warm /main/raw/secret: not allowed (missing READ VOLUME on volume "
        "main.raw.secret)",
    }
    assert a["warm_all"]["errno"] == errno.EACCES and "name a volume" in a["warm_all"]["error"]
    assert a["prefetch_secret"]["errno"] == errno.EACCES
    assert a["flush_images"]["errno"] == errno.EACCES
    assert a["warm_hidden"]["errno"] == errno.ENOENT
    assert b["warm_images"]["ok"], b
    assert b["warm_secret"]["errno"] == errno.EACCES
    st = client.status(str(mp))["catalog"]
    assert st["denied_by_privilege"]["READ VOLUME"] >= 3
    if gsite.origin.kind == "posix":
        assert "missing WRITE VOLUME on volume main.raw.images" in a["flush_images"]["error"]
        assert b["flush_images"]["ok"], b
        assert st["denied_by_privilege"]["WRITE VOLUME"] == 1
    else:  # S3 directories show 0755 owned by the mount's owner: the mode bits refuse first
        assert b["flush_images"]["errno"] == errno.EACCES, b
    # root is an admin: any path
    assert client.warm(str(mp), [str(mp)])["files"] == 2


def _warm(user: Any, mp: Any, path: str) -> dict[str, Any]:
    out: dict[str, Any] = run_as(user, mp, f"print(json.dumps(call('warm', paths=[{path!r}])))")
    return out


def test_a_grant_on_one_node_is_seen_by_the_other_within_the_ttl(
    gsite: Site, folks: People
) -> None:
    a = gsite.nodes[0]
    b = gsite.mount()
    assert _warm(folks.alice, b.mountpoint, "main/raw/secret")["errno"] == errno.EACCES
    client.request(str(a.mountpoint), "catalog", command="grant",
                   args={"privilege": "READ_VOLUME", "type": "volume",
                         "name": "main.raw.secret", "principal": folks.alice.name})  # fmt: skip
    # the user process takes longer than the TTL (0.5 s) to start: no sleep needed, but a
    # slow machine may still be inside it; retry for a few TTLs, never for long
    deadline = 20
    for _ in range(deadline):
        out = _warm(folks.alice, b.mountpoint, "main/raw/secret")
        if out["ok"]:
            break
    assert out["ok"] and out["result"]["files"] == 1, out
    client.request(str(b.mountpoint), "catalog", command="revoke",
                   args={"privilege": "READ VOLUME", "type": "VOLUME",
                         "name": "main.raw.secret", "principal": folks.alice.name})  # fmt: skip
    for _ in range(deadline):
        out = _warm(folks.alice, a.mountpoint, "main/raw/secret")
        if not out["ok"]:
            break
    assert out["errno"] == errno.EACCES, out


def test_concurrent_grants_from_two_nodes_lose_nothing(gsite: Site, folks: People) -> None:
    a = gsite.nodes[0]
    b = gsite.mount()
    errors: list[BaseException] = []

    def grants(mp: str, names: list[str]) -> None:
        try:
            for n in names:
                client.request(mp, "catalog", command="grant",
                               args={"privilege": "READ VOLUME", "type": "volume",
                                     "name": "main.raw.secret", "principal": n})  # fmt: skip
        except BaseException as exc:  # reported below
            errors.append(exc)

    names = [f"p{i}" for i in range(16)]
    ts = [threading.Thread(target=grants, args=(str(m.mountpoint), names[i::2]))
          for i, m in enumerate((a, b))]  # fmt: skip
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors
    meta, _ = CatalogStore(gsite.origin.view).load()
    assert meta is not None
    found = meta.find(("main", "raw", "secret"))
    assert found is not None and set(names) <= set(found[-1].grants)


def test_ungoverned_whole_mount_warm_keeps_the_mode_filter_and_skips_the_catalog(
    folks: People,
) -> None:
    """A non-root ``warm`` of the whole mount reaches only what the user may read (a 0700
    directory at the top is skipped), and nobody's warm touches ``.airfs-catalog``."""
    if not fuse_available():
        pytest.skip("needs /dev/fuse and fusermount3")
    with site("posix") as s:
        o = s.base / "origin"
        (o / "pub").mkdir()
        (o / "pub" / "a.bin").write_bytes(b"a" * 100)
        (o / "priv").mkdir(mode=0o700)
        (o / "priv" / "s.bin").write_bytes(b"s" * 100)
        (o / ".airfs-catalog").mkdir()
        (o / ".airfs-catalog" / "junk").write_bytes(b"j")  # not a catalog: never served
        m = s.mount()
        out = run_as(folks.alice, m.mountpoint, "print(json.dumps(call('warm', paths=[''])))")
        assert out["ok"] and out["result"]["files"] == 1, out
        assert client.warm(str(m.mountpoint), [str(m.mountpoint)])["files"] == 2
        assert sorted(os.listdir(m.mountpoint)) == ["priv", "pub"]


IMMUTABLE = """
print(json.dumps(airfs("catalog", "--mount", MP, "update", "volume", "main.raw.images",
                       "--immutable", {value!r})))
"""


def test_an_immutable_volume_is_declared_by_its_owner_and_trusted_by_every_node(
    gsite: Site, folks: People
) -> None:
    """Issue 22, item 4: the volume's owner (not a reader) declares it immutable through one
    node; a second node then trusts what it knows of the volume's names and versions past the
    TTL (another volume keeps the TTL), until ``airfs refresh``; the declaration's end is seen
    within the TTL."""
    import time

    from cattest_util import airfs_main, put

    a, b = gsite.nodes[0], gsite.mount()
    o = gsite.origin
    assert o.catalog("set-owner", "volume", "main.raw.images", folks.bob.name)[0] == 0
    code, _, err = run_as(folks.alice, a.mountpoint, IMMUTABLE.format(value="true"))
    assert code == 1 and err.strip() == (
        f"airfs catalog: {folks.alice.name} lacks MANAGE on volume main.raw.images"
    ), err
    code, _, err = run_as(folks.bob, a.mountpoint, IMMUTABLE.format(value="true"))
    assert code == 0, err
    time.sleep(0.7)  # node b's catalog (TTL 0.5 s) is reloaded at its next request
    vol, other = b.mountpoint / "main/raw/images", b.mountpoint / "main/raw/secret"
    assert (vol / "a.bin").read_bytes() == b"a" * 5000
    assert (other / "s.bin").read_bytes() == b"s" * 3000
    assert sorted(os.listdir(vol)) == ["a.bin"]
    put(o.view, gsite.base, "main/raw/images/a.bin", b"changed")  # at the origin
    put(o.view, gsite.base, "main/raw/images/new.bin", b"new")
    put(o.view, gsite.base, "main/raw/secret/s.bin", b"changed")
    time.sleep(0.8)  # past the TTL (kernel and daemon)
    assert os.stat(other / "s.bin").st_size == 7, "a volume not declared keeps the TTL"
    for _ in range(3):
        assert os.stat(vol / "a.bin").st_size == 5000
        assert (vol / "a.bin").read_bytes() == b"a" * 5000
        assert sorted(os.listdir(vol)) == ["a.bin"]
        time.sleep(0.6)
    (vol / "mine.txt").write_bytes(b"mine")  # writes still work, seen at once
    assert sorted(os.listdir(vol)) == ["a.bin", "mine.txt"]
    code, _, err = airfs_main("refresh", str(vol))
    assert code == 0, err
    time.sleep(0.6)  # what the kernel keeps (the TTL)
    assert (vol / "a.bin").read_bytes() == b"changed"
    assert sorted(os.listdir(vol)) == ["a.bin", "mine.txt", "new.bin"]
    # the end of the declaration: a change at the origin is seen within the TTLs again
    code, _, err = run_as(folks.bob, a.mountpoint, IMMUTABLE.format(value="false"))
    assert code == 0, err
    put(o.view, gsite.base, "main/raw/images/a.bin", b"third version")
    deadline = time.monotonic() + 5.0
    while os.stat(vol / "a.bin").st_size != len(b"third version"):
        assert time.monotonic() < deadline, "the end of the declaration was not seen"
        time.sleep(0.2)
    assert (vol / "a.bin").read_bytes() == b"third version"
