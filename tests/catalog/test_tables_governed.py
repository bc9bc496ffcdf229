"""Tables in the catalog through the mount itself, with real users on root mounts of a directory
and of SeaweedFS S3: a managed table's storage hidden from those without SELECT or MODIFY;
table files read with SELECT though the volume holding them is not readable; writes with
MODIFY; airfs.tables resolving names with clear PermissionErrors; a grant made on one node's
daemon honoured by the other node's mount."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pyarrow as pa
import pytest
from cattest_util import People, Site, airfs_main, governed, put, run_as, site

from airfs.testing.mountfix import fuse_available

deltalake = pytest.importorskip("deltalake")

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (useradd, mounts)"),
    pytest.mark.mount,
]

ROWS = pa.table({"id": pa.array(range(100), pa.int64()), "v": pa.array([1.5] * 100)})


@pytest.fixture(params=["posix", pytest.param("s3", marks=pytest.mark.s3)])
def tsite(request: pytest.FixtureRequest, folks: People) -> Iterator[Site]:
    yield from _tables_site(request, folks, request.param)


@pytest.fixture
def psite(request: pytest.FixtureRequest, folks: People) -> Iterator[Site]:
    """``tsite`` on a directory origin only."""
    yield from _tables_site(request, folks, "posix")


def _tables_site(request: pytest.FixtureRequest, folks: People, kind: str) -> Iterator[Site]:
    """``governed`` plus: main.raw.sales (managed, DELTA, 100 rows) readable by alice;
    main.raw.events (external, PARQUET) in the volume main.raw.secret that nobody may read,
    readable by alice through the table."""
    if not fuse_available():
        pytest.skip("needs /dev/fuse and fusermount3")
    seaweed = request.getfixturevalue("seaweed") if kind == "s3" else None
    with site(kind, seaweed) as s:
        governed(s, folks)
        o = s.origin
        for argv in (
            ["create-table", "main.raw.sales"],
            ["create-table", "main.raw.events", "--location", "main/raw/secret/events",
             "--format", "parquet"],
            ["grant", "SELECT", "ON", "TABLE", "main.raw.sales", "TO", folks.alice.name],
            ["grant", "SELECT", "ON", "TABLE", "main.raw.events", "TO", folks.alice.name],
        ):  # fmt: skip
            code, out, err = o.catalog(*argv)
            assert code == 0, (argv, out, err)
        import io

        import pyarrow.parquet as pq

        buf = io.BytesIO()
        pq.write_table(ROWS, buf)
        put(o.view, s.base, "main/raw/secret/events/part-0.parquet", buf.getvalue())
        s.mount()
        s.mount()  # a second node
        # the managed table's data, written through the mount by root (an admin)
        # (umask 0: the mode bits let the table's other writers in; the grants decide)
        old = os.umask(0)
        try:
            deltalake.write_deltalake(str(s.nodes[0].mountpoint / "main/raw/.table-sales"), ROWS)
        finally:
            os.umask(old)
        yield s


PROBE = """
T = MP + "/main/raw/.table-sales"
E = MP + "/main/raw/secret/events"
def wr(path, data=b"x"):
    with open(path, "wb") as f:
        f.write(data)
def rows(name):
    try:
        return ["ok", at.read_table(name, root=MP).num_rows]
    except PermissionError as exc:
        return ["PermissionError", str(exc)]
    except at.TableError as exc:
        return ["TableError", str(exc)]
r = {
    "schema": attempt(lambda: sorted(os.listdir(MP + "/main/raw"))),
    "managed_stat": attempt(lambda: os.stat(T).st_mode and None),
    "managed_log": attempt(lambda: sorted(os.listdir(T + "/_delta_log"))),
    "managed_write": attempt(wr, T + "/x.parquet"),
    "events_read": attempt(lambda: len(open(E + "/part-0.parquet", "rb").read())),
    "events_list": attempt(lambda: sorted(os.listdir(E))),
    "events_write": attempt(wr, E + "/x.parquet"),
    "secret_list": attempt(os.listdir, MP + "/main/raw/secret"),
    "secret_file": attempt(lambda: open(MP + "/main/raw/secret/s.bin", "rb").read() and None),
    "sales": rows("main.raw.sales"),
    "events": rows("main.raw.events"),
    "nope": rows("main.raw.nope"),
}
r["explain"] = str(explain(PermissionError(13, "denied"), T + "/x.parquet", "write"))
try:
    at.export_table(MP + "/main/raw/secret/events", "main.raw.sales", root=MP)
    r["export_into"] = ["ok", None]
except PermissionError as exc:
    r["export_into"] = ["PermissionError", str(exc)]
print(json.dumps(r))
"""

IMPORTS = (
    "import airfs.tables as at, deltalake, pyarrow, pyarrow.parquet, pyarrow.dataset\n"
    "from airfs.catalog.explain import explain"
)


def test_table_grants_through_the_mount(tsite: Site, folks: People) -> None:
    mp = tsite.nodes[0].mountpoint
    a = run_as(folks.alice, mp, PROBE, imports=IMPORTS)
    b = run_as(folks.bob, mp, PROBE, imports=IMPORTS)
    # alice: SELECT on both tables, nothing on main.raw.secret
    assert a["schema"] == ["ok", [".table-sales", "images", "secret"]], a
    assert a["managed_stat"][0] == "ok" and a["managed_log"][0] == "ok", a
    assert a["managed_write"][0] == "EACCES", a
    assert a["events_read"] == ["ok", len(_parquet_bytes(tsite))], a
    assert a["events_list"] == ["ok", ["part-0.parquet"]], a
    assert a["events_write"][0] == "EACCES", a
    assert a["secret_list"][0] == "EACCES" and a["secret_file"][0] == "EACCES", a
    assert a["sales"] == ["ok", 100] and a["events"] == ["ok", 100], a
    assert a["nope"][0] == "TableError" and "main.raw.nope does not exist" in a["nope"][1]
    assert a["export_into"] == [
        "PermissionError",
        "[Errno 13] table main.raw.sales: permission denied: needs MODIFY on table "
        "main.raw.sales (see airfs catalog show-grants --type TABLE main.raw.sales)",
    ], a
    assert a["explain"].endswith(
        ".table-sales/x.parquet: permission denied: needs MODIFY on table main.raw.sales "
        "(see airfs catalog show-grants --type TABLE main.raw.sales)"
    ), a
    # bob: no table privilege; the managed storage does not exist for him
    assert b["schema"] == ["ok", ["images", "secret"]], b
    assert b["managed_stat"][0] == "ENOENT" and b["managed_log"][0] == "ENOENT", b
    assert b["managed_write"][0] == "ENOENT", b
    assert b["events_read"][0] == "EACCES" and b["events_list"][0] == "EACCES", b
    assert b["sales"][0] == "PermissionError", b
    assert "needs SELECT on table main.raw.sales" in b["sales"][1], b
    # a grant made through node 0's daemon, honoured by node 1's mount (within its TTL)
    code, _, err = airfs_main("catalog", "--mount", str(mp), "grant", "SELECT", "ON", "SCHEMA",
                              "main.raw", "TO", f"group:{folks.group}")  # fmt: skip
    assert code == 0, err
    b2 = run_as(folks.bob, tsite.nodes[1].mountpoint, WAIT_SALES, imports=IMPORTS)
    assert b2 == ["ok", 100], b2


WAIT_SALES = """
import time
deadline = time.monotonic() + 30
while True:  # the other node sees the grant once its catalog cache expires (TTL 0.5 s)
    try:
        n = at.read_table("main.raw.sales", root=MP).num_rows
        print(json.dumps(["ok", n]))
        break
    except PermissionError as exc:
        if time.monotonic() > deadline:
            print(json.dumps(["PermissionError", str(exc)]))
            break
        time.sleep(0.2)
"""


def _parquet_bytes(s: Site) -> bytes:
    entry = s.origin.view.stat("main/raw/secret/events/part-0.parquet")
    return s.origin.view.read_range("main/raw/secret/events/part-0.parquet", 0, entry.size)


MODIFY_PROBE = """
T = MP + "/main/raw/.table-sales"
def wr(path, data=b"x"):
    with open(path, "wb") as f:
        f.write(data)
r = {"modify_only_write": attempt(wr, T + "/raw.bin", b"m" * 10),
     "modify_only_read": attempt(lambda: open(T + "/raw.bin", "rb").read() and None)}
print(json.dumps(r))
"""

APPEND = """
import pyarrow as pa
t = pa.table({"id": pa.array(range(100, 110), pa.int64()), "v": pa.array([2.0] * 10)})
r = {"append": attempt(lambda: deltalake.write_deltalake(MP + "/main/raw/.table-sales", t,
                                                         mode="append"))}
r["rows"] = attempt(lambda: at.read_table("main.raw.sales", root=MP).num_rows)
print(json.dumps(r))
"""


def test_modify_writes_table_files(psite: Site, folks: People) -> None:
    """(On a directory origin: on S3 the directories' mode bits refuse other users' writes.)"""
    mp = psite.nodes[0].mountpoint
    cat = ("catalog", "--mount", str(mp))
    grp = f"group:{folks.group}"
    assert airfs_main(*cat, "grant", "MODIFY", "ON", "TABLE", "main.raw.sales", "TO", grp)[0] == 0
    b = run_as(folks.bob, mp, MODIFY_PROBE, imports=IMPORTS)
    assert b["modify_only_write"] == ["ok", None], b
    assert b["modify_only_read"][0] == "EACCES", b  # MODIFY alone does not read
    assert airfs_main(*cat, "grant", "SELECT", "ON", "TABLE", "main.raw.sales", "TO", grp)[0] == 0
    b = run_as(folks.bob, mp, APPEND, imports=IMPORTS)
    assert b["append"] == ["ok", None] and b["rows"] == ["ok", 110], b
    # alice (SELECT only) sees bob's commit, may not append
    a = run_as(folks.alice, mp, APPEND, imports=IMPORTS)
    assert a["append"][0] != "ok" and a["rows"] == ["ok", 110], a
