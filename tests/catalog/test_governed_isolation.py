"""Governed root mounts: what one user does never changes what another user gets, and
nothing a user may not see leaks through the kernel's caches, link counts, hard links or a
re-created volume name (real users, posix origin, both FUSE transports where the kernel's
caches matter)."""

from __future__ import annotations

import errno
import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cattest_util import People, Site, airfs_main, governed, put, run_as, site

from airfs.testing.mountfix import fuse_available

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (useradd, mounts)"),
    pytest.mark.mount,
]


def _hidden_catalog(s: Site, p: People) -> None:
    """Catalog ``hidden`` (schema ``s``, volume ``v`` with ``f.bin``) granted to bob only."""
    for argv in (
        ["create-catalog", "hidden"],
        ["create-schema", "hidden.s"],
        ["create-volume", "hidden.s.v"],
        ["grant", "USE CATALOG", "ON", "CATALOG", "hidden", "TO", p.bob.name],
        ["grant", "USE SCHEMA", "ON", "SCHEMA", "hidden.s", "TO", p.bob.name],
        ["grant", "READ VOLUME", "ON", "VOLUME", "hidden.s.v", "TO", p.bob.name],
    ):
        code, out, err = s.origin.catalog(*argv)
        assert code == 0, (argv, out, err)
    put(s.origin.view, s.base, "hidden/s/v/f.bin", b"f" * 1000)


@pytest.fixture
def psite(folks: People) -> Iterator[Site]:
    if not fuse_available():
        pytest.skip("needs /dev/fuse and fusermount3")
    with site("posix") as s:
        governed(s, folks)
        _hidden_catalog(s, folks)
        yield s


#: alice stats the hidden catalog until the stop file exists (at most ROUNDS times)
_STAT_LOOP = """
seen = {}
for i in range(20000):
    if os.path.exists(STOP):
        break
    r = attempt(os.stat, MP + "/hidden")[0]
    seen[r] = seen.get(r, 0) + 1
print(json.dumps(seen))
"""

#: bob opens and reads a file in the hidden catalog, ROUNDS times
_OPEN_LOOP = """
out = {}
for i in range(ROUNDS):
    r = attempt(lambda: len(open(MP + "/hidden/s/v/f.bin", "rb").read()))
    key = r[0] if r[0] != "ok" else f"ok:{r[1]}"
    out[key] = out.get(key, 0) + 1
    time.sleep(0.02)
print(json.dumps(out))
"""


@pytest.mark.parametrize("transport", ["kernel", "pyfuse3"])
def test_an_ungranted_user_cannot_hide_a_catalog_from_granted_users(
    psite: Site, folks: People, transport: str
) -> None:
    """The attack of issue 20 item 8: alice (no USE CATALOG) stats ``/hidden`` in a loop while
    bob opens a file there. Bob never fails; alice never sees the catalog (the kernel keeps
    neither her "no such name" for bob nor bob's entry for her)."""
    mp = psite.mount("--fuse", transport).mountpoint
    stop = psite.base / "stop"
    results: dict[str, Any] = {}

    def alice() -> None:
        results["alice"] = run_as(folks.alice, mp, f"STOP = {str(stop)!r}\n" + _STAT_LOOP)

    t = threading.Thread(target=alice)
    t.start()
    try:
        results["bob"] = run_as(folks.bob, mp, "ROUNDS = 40\n" + _OPEN_LOOP)
    finally:
        stop.touch()
        t.join()
    assert results["bob"] == {"ok:1000": 40}, results
    assert set(results["alice"]) == {"ENOENT"}, results
    assert sum(results["alice"].values()) >= 40, results  # she did run alongside bob
    # and afterwards, in the other order: bob's entry is not kept for alice
    assert run_as(folks.bob, mp, 'print(json.dumps(attempt(os.stat, MP + "/hidden")[0]))') == "ok"
    assert run_as(folks.alice, mp, 'print(json.dumps(attempt(os.stat, MP + "/hidden")[0]))') == (
        "ENOENT"
    )


def test_link_counts_of_the_levels_show_no_hidden_names(psite: Site, folks: People) -> None:
    """Issue 20 item 12: the link count of ``/``, a catalog, a schema and a volume root is 1
    (not counted) for every caller: the origin's count includes names the caller may not
    see (``hidden`` for alice, the volumes of ``main.raw``)."""
    mp = psite.mount().mountpoint
    (psite.base / "origin" / "main" / "raw" / "images" / "sub").mkdir()
    code = """
    print(json.dumps({p: os.stat(MP + p).st_nlink
                      for p in ("", "/main", "/main/raw", "/main/raw/images")}))
    """
    want = {"": 1, "/main": 1, "/main/raw": 1, "/main/raw/images": 1}
    assert run_as(folks.alice, mp, code) == want
    assert run_as(folks.bob, mp, code) == want
    # inside a volume the origin's count stands
    sub = os.stat(mp / "main" / "raw" / "images" / "sub")
    assert sub.st_nlink == 2


def _as(user: Any, mp: Path, expr: str) -> Any:
    return run_as(user, mp, f"print(json.dumps(attempt(lambda: {expr})))")


def test_links_stay_in_one_volume_and_need_read_on_it(psite: Site, folks: People) -> None:
    """Issue 20 items 9 and 10. A link or rename across volumes is EXDEV, also for a user who
    may read and write both (tools then copy, and the copy's read is checked); bob, who may
    write main.raw.images but not read main.raw.secret, cannot link a file of secret into
    images even when the kernel knows its name from root's access (he used to read s.bin's
    bytes through such a link); within a volume a link works and every name reads."""
    o = psite.origin
    for argv in (
        ["grant", "WRITE VOLUME", "ON", "VOLUME", "main.raw.images", "TO", folks.alice.name],
        ["grant", "ALL PRIVILEGES", "ON", "VOLUME", "main.raw.secret", "TO", folks.alice.name],
    ):
        code, out, err = o.catalog(*argv)
        assert code == 0, (argv, out, err)
    org = psite.base / "origin" / "main" / "raw"
    for vol in ("images", "secret"):
        (org / vol).chmod(0o777)
    put(o.view, psite.base, "main/raw/secret/al.bin", b"L" * 7)
    os.chown(org / "secret" / "al.bin", folks.alice.uid, folks.alice.gid)
    os.chown(org / "secret" / "s.bin", folks.bob.uid, folks.bob.gid)  # protected_hardlinks
    mp = psite.mount().mountpoint
    v, sec = f"{mp}/main/raw/images", f"{mp}/main/raw/secret"
    # alice may read and write both volumes: still EXDEV
    r = _as(folks.alice, mp, f"os.link({sec + '/al.bin'!r}, {v + '/al.bin'!r})")
    assert r[0] == "EXDEV", r
    r = _as(folks.alice, mp, f"os.rename({sec + '/al.bin'!r}, {v + '/al.bin'!r})")
    assert r[0] == "EXDEV", r
    assert not (org / "images" / "al.bin").exists() and (org / "secret" / "al.bin").exists()
    # bob: root's access puts s.bin's name in the kernel's cache; bob's link is refused, as
    # EXDEV while the kernel still knows the name, EACCES (his own lookup) once it does not
    assert os.stat(f"{sec}/s.bin").st_size == 3000
    r = _as(folks.bob, mp, f"os.link({sec + '/s.bin'!r}, {v + '/stolen.bin'!r})")
    assert r[0] in ("EXDEV", "EACCES"), r
    r = _as(folks.bob, mp, f"len(open({sec + '/s.bin'!r}, 'rb').read())")
    assert r[0] == "EACCES", r
    assert not (org / "images" / "stolen.bin").exists()
    # within a volume: bob links his own file, alice reads it by both names
    assert _as(folks.bob, mp, f"open({v + '/b.bin'!r}, 'wb').write(b'b' * 10)") == ["ok", 10]
    assert _as(folks.bob, mp, f"os.link({v + '/b.bin'!r}, {v + '/b-link.bin'!r})")[0] == "ok"
    for name in ("b.bin", "b-link.bin"):
        assert _as(folks.alice, mp, f"len(open({v + '/' + name!r}, 'rb').read())") == ["ok", 10]


def test_a_file_linked_across_volumes_at_the_origin_is_checked_by_each_name(
    psite: Site, folks: People
) -> None:
    """Issue 20 item 10: one origin file with a name in main.raw.images and one in
    main.raw.secret (linked at the origin, outside the mount) is two files to the kernel, each
    checked against its own volume: bob reads it by its images name after root opened it by
    its secret name (he got EACCES: the one inode was checked against secret), and still
    cannot read it by the secret name."""
    org = psite.base / "origin" / "main" / "raw"
    os.link(org / "images" / "a.bin", org / "secret" / "a-too.bin")
    mp = psite.mount().mountpoint
    v, sec = f"{mp}/main/raw/images", f"{mp}/main/raw/secret"
    with open(f"{sec}/a-too.bin", "rb") as held:  # root holds it open by the secret name
        assert len(held.read()) == 5000
        assert _as(folks.bob, mp, f"len(open({v + '/a.bin'!r}, 'rb').read())") == ["ok", 5000]
        got = _as(folks.bob, mp, f"len(open({sec + '/a-too.bin'!r}, 'rb').read())")
        assert got[0] == "EACCES"
        assert os.stat(f"{sec}/a-too.bin").st_ino != os.stat(f"{v}/a.bin").st_ino


def test_a_dropped_volumes_files_do_not_go_to_whoever_creates_the_name_again(
    psite: Site, folks: People
) -> None:
    """Issue 20 item 11: alice may create volumes in main.raw; root drops main.raw.secret,
    alice creates it again and owns it: it is empty and its old files are unreachable by
    name (moved aside at the origin into the reserved directory, which no mount shows)."""
    code, out, err = psite.origin.catalog(
        "grant", "CREATE VOLUME", "ON", "SCHEMA", "main.raw", "TO", folks.alice.name
    )
    assert code == 0, (out, err)
    mp = psite.mount().mountpoint
    code, out, err = airfs_main("catalog", "--mount", str(mp), "--json", "drop-volume",
                                "main.raw.secret")  # fmt: skip
    assert code == 0, err
    dropped = json.loads(out)
    r = run_as(
        folks.alice,
        mp,
        """
        made = airfs("catalog", "--mount", MP, "create-volume", "main.raw.secret")
        S = MP + "/main/raw/secret"
        print(json.dumps({"made": made, "list": attempt(lambda: sorted(os.listdir(S))),
                          "old": attempt(lambda: open(S + "/s.bin", "rb").read().decode())}))
        """,
    )
    assert r["made"][0] == 0, r
    assert r["list"] == ["ok", []], r
    assert r["old"][0] == "ENOENT", r
    # the files are kept aside at the origin (for an admin to restore or delete there)
    moved = dropped["files_moved_to"]
    assert moved.startswith(".airfs-catalog/dropped/main.raw.secret@"), dropped
    origin = psite.base / "origin"
    assert (origin / moved / "s.bin").read_bytes() == b"s" * 3000
    assert os.listdir(origin / "main" / "raw" / "secret") == []
    with pytest.raises(FileNotFoundError):
        os.stat(mp / ".airfs-catalog" / "dropped")


ORACLE = """
def both(fn, there, missing):
    a, b = fn(there), fn(missing)
    text = json.dumps(b).replace(missing, there)
    text = text.replace(missing.replace("/", "."), there.replace("/", "."))
    return [a, json.loads(text)]
out = {
    "warm": both(lambda p: call("warm", paths=[p]),
                 "main/raw/secret/s.bin", "main/raw/secret/none.bin"),
    "prefetch": both(lambda p: call("prefetch", paths=[p]),
                     "main/raw/secret/s.bin", "main/raw/secret/none.bin"),
    "flush": both(lambda p: call("flush", path=p),
                  "main/raw/secret/s.bin", "main/raw/secret/none.bin"),
    "warm_hidden": both(lambda p: call("warm", paths=[p]), "hidden/s/v/f.bin", "nosuch/s/v/f.bin"),
    "flush_hidden": both(lambda p: call("flush", path=p), "hidden/s/v/f.bin", "nosuch/s/v/f.bin"),
    "prefetch_hidden": both(lambda p: call("prefetch", paths=[p]),
                            "hidden/s/v/f.bin", "nosuch/s/v/f.bin"),
    "why": both(lambda p: call("catalog", command="why", args={"path": p, "access": "read"}),
                "hidden/s/v", "nosuch/s/v"),
    "why_schema": both(lambda p: call("catalog", command="why",
                                      args={"path": p, "access": "read"}),
                       "hidden/s", "hidden/t"),
}
print(json.dumps(out))
"""


def test_control_answers_do_not_tell_hidden_or_unreadable_names_from_missing_ones(
    psite: Site, folks: People
) -> None:
    """Issue 20 item 12: alice (no USE CATALOG on ``hidden``, no READ VOLUME on
    main.raw.secret) gets the same errno and text from ``warm``, ``prefetch``, ``flush`` and
    ``why`` for an existing name there as for a missing one (the catalog is asked before the
    mode-bit walk)."""
    mp = psite.mount().mountpoint
    out = run_as(folks.alice, mp, ORACLE)
    for k, (there, missing) in out.items():
        assert there == missing, (k, there, missing)
    assert out["warm"][0]["errno"] == errno.EACCES, out
    assert "missing READ VOLUME on volume main.raw.secret" in out["warm"][0]["error"], out
    assert out["prefetch"][0]["errno"] == errno.EACCES, out
    assert out["warm_hidden"][0]["errno"] == errno.ENOENT, out
    assert out["prefetch_hidden"][0] == {"ok": True, "result": {"queued": 0}}, out
    assert out["why"][0]["result"]["errno"] == errno.ENOENT, out
    assert "USE CATALOG" not in json.dumps(out), out
    # bob, who may read hidden.s.v, warms its file
    r = run_as(folks.bob, mp, 'print(json.dumps(call("warm", paths=["hidden/s/v/f.bin"])))')
    assert r["ok"] and r["result"]["files"] == 1, r
