"""The Files API of ``airfs catalog serve`` on a directory and on SeaweedFS S3, with
``databricks-sdk``'s ``w.files`` (single-shot and multipart uploads, downloads, listings,
directories) and raw HTTP (ranges, traversal, oversize bodies), governed by READ VOLUME and
WRITE VOLUME as a mount is."""

from __future__ import annotations

import io
import json
import os
import re
import uuid
from collections.abc import Iterator

import pytest
from apitest_util import Server, serve, token
from cattest_util import Origin_, site

pytest.importorskip("databricks.sdk")
from databricks.sdk import WorkspaceClient
from databricks.sdk.config import Config
from databricks.sdk.errors import AlreadyExists, DatabricksError, NotFound, PermissionDenied
from databricks.sdk.service.catalog import (
    DataSourceFormat,
    PermissionsChange,
    Privilege,
    TableType,
    VolumeType,
)

from airfs.origin.base import NotFound as OriginNotFound

FS = "/api/2.0/fs"
VOL = "/Volumes/main/raw/files"


class Api:
    def __init__(self, o: Origin_, srv: Server) -> None:
        self.o = o
        self.srv = srv

    def sdk(self, who: str, *, multipart_from: int | None = None) -> WorkspaceClient:
        cfg = Config(host=self.srv.url, token=self.srv.tokens[who])
        if multipart_from is not None:  # a plain attribute of Config, not a constructor keyword
            cfg.files_ext_multipart_upload_min_stream_size = multipart_from
        return WorkspaceClient(config=cfg)


SETUP = [
    ["init", "--admin", "ops"],
    ["create-catalog", "main"],
    ["create-schema", "main.raw"],
    ["create-volume", "main.raw.files"],
    ["create-volume", "main.raw.secret"],
    ["grant", "USE CATALOG", "ON", "CATALOG", "main", "TO", "group:ml"],
    ["grant", "USE SCHEMA", "ON", "SCHEMA", "main.raw", "TO", "group:ml"],
    ["grant", "READ VOLUME", "ON", "VOLUME", "main.raw.files", "TO", "group:ml"],
    ["grant", "WRITE VOLUME", "ON", "VOLUME", "main.raw.files", "TO", "alice"],
]


@pytest.fixture(scope="module", params=["posix", pytest.param("s3", marks=pytest.mark.s3)])
def api(request: pytest.FixtureRequest) -> Iterator[Api]:
    seaweed = request.getfixturevalue("seaweed") if request.param == "s3" else None
    with site(request.param, seaweed) as s:
        o = s.origin
        for argv in SETUP:
            code, _out, err = o.catalog(*argv)
            assert code == 0, err
        with serve(o, s.base / "serve.log") as srv:
            srv.tokens = {
                "ops": token(o, "ops"),
                "alice": token(o, "alice", "ml"),  # READ and WRITE VOLUME
                "bob": token(o, "bob", "ml"),  # READ VOLUME only
            }
            yield Api(o, srv)


def d() -> str:
    return f"{VOL}/t{uuid.uuid4().hex[:8]}"


def test_sdk_small_and_multipart_uploads_downloads_and_listings(api: Api) -> None:
    # multipart from 1 MiB on (the SDK's default threshold is 50 MiB)
    alice = api.sdk("alice", multipart_from=1 << 20)
    base = d()
    small, big = b"hello volume", os.urandom((3 << 20) + 12345)
    before = api.srv.log_text()
    alice.files.upload(f"{base}/small.txt", io.BytesIO(small))
    alice.files.upload(f"{base}/sub/big.bin", io.BytesIO(big), part_size=1 << 20)
    log = api.srv.log_text()[len(before) :]
    # the small file went in one PUT; the big one as a session of 4 parts, then completed
    assert re.search(rf'"PUT {FS}/files{base}/small.txt(\?\S*)? HTTP', log)
    assert "action=initiate-upload" in log and "action=complete-upload" in log
    assert len(re.findall(rf'"PUT {FS}/upload-part/\S+ HTTP/1.1" 200', log)) == 4
    assert alice.files.download(f"{base}/small.txt").contents.read() == small
    assert alice.files.download(f"{base}/sub/big.bin").contents.read() == big
    rel = base.removeprefix("/Volumes/") + "/sub/big.bin"
    assert api.o.view.read_range(rel, 0, len(big) + 1) == big  # at the origin, whole
    assert alice.files.get_metadata(f"{base}/sub/big.bin").content_length == len(big)

    for i in range(3):
        alice.files.upload(f"{base}/n{i}", io.BytesIO(b"%d" % i))
    listed = list(alice.files.list_directory_contents(base, page_size=2))
    assert [(e.name, e.is_directory) for e in listed] == [
        ("n0", False),
        ("n1", False),
        ("n2", False),
        ("small.txt", False),
        ("sub", True),
    ]
    assert listed[3].file_size == len(small) and listed[3].path == f"{base}/small.txt"

    with pytest.raises(AlreadyExists):
        alice.files.upload(f"{base}/small.txt", io.BytesIO(b"other"), overwrite=False)
    alice.files.upload(f"{base}/small.txt", io.BytesIO(b"other"), overwrite=True)
    assert alice.files.download(f"{base}/small.txt").contents.read() == b"other"

    alice.files.create_directory(f"{base}/x/y")
    alice.files.get_directory_metadata(f"{base}/x/y")
    with pytest.raises(NotFound):
        alice.files.get_directory_metadata(f"{base}/x/nope")
    alice.files.upload(f"{base}/x/y/f", io.BytesIO(b"f"))
    with pytest.raises(DatabricksError) as e:
        alice.files.delete_directory(f"{base}/x/y")  # not empty
    assert e.value.error_code == "RESOURCE_CONFLICT"
    alice.files.delete(f"{base}/x/y/f")
    alice.files.delete_directory(f"{base}/x/y")
    with pytest.raises(NotFound):
        alice.files.download(f"{base}/x/y/f").contents.read()


def test_ranges_and_head(api: Api) -> None:
    tok = api.srv.tokens["alice"]
    path = f"{d()}/r.bin"
    data = bytes(range(256)) * 4
    assert api.srv.raw("PUT", f"{FS}/files{path}", token=tok, body=data)[0] == 204
    status, h, got = api.srv.raw(
        "GET", f"{FS}/files{path}", token=tok, headers={"Range": "bytes=10-19"}
    )
    assert (status, got, h["content-range"]) == (206, data[10:20], f"bytes 10-19/{len(data)}")
    status, _h, got = api.srv.raw(
        "GET", f"{FS}/files{path}", token=tok, headers={"Range": "bytes=-3"}
    )
    assert (status, got) == (206, data[-3:])
    status, h, got = api.srv.raw("HEAD", f"{FS}/files{path}", token=tok)
    assert (status, h["content-length"], got) == (200, str(len(data)), b"")
    assert api.srv.error("GET", f"{FS}/files{path}", token=tok, headers={"Range": "bytes=5000-"})[
        :2
    ] == (416, "INVALID_PARAMETER_VALUE")


def test_if_match_puts_only_over_the_version_read(api: Api) -> None:
    """Optimistic concurrency as a node commits: a PUT with the ETag it read wins once; a
    second writer holding the same (now old) ETag gets 412 and changes nothing."""
    tok = api.srv.tokens["alice"]
    url = f"{FS}/files{d()}/shared.txt?overwrite=true"
    assert api.srv.raw("PUT", url, token=tok, body=b"v1")[0] == 204
    _s, h, _b = api.srv.raw("HEAD", url, token=tok)
    etag = h["etag"]
    assert api.srv.raw("PUT", url, token=tok, body=b"v2", headers={"If-Match": etag})[0] == 204
    status, code, _m = api.srv.error("PUT", url, token=tok, body=b"v3", headers={"If-Match": etag})
    assert (status, code) == (412, "PRECONDITION_FAILED")
    assert api.srv.raw("GET", url, token=tok)[2] == b"v2"


def test_files_are_governed_like_the_mount(api: Api) -> None:
    bob, ops = api.sdk("bob"), api.sdk("ops")
    base = d()
    api.sdk("alice").files.upload(f"{base}/a.txt", io.BytesIO(b"alice's"))
    assert bob.files.download(f"{base}/a.txt").contents.read() == b"alice's"  # READ VOLUME
    with pytest.raises(PermissionDenied) as e:
        bob.files.upload(f"{base}/b.txt", io.BytesIO(b"x"))
    assert e.value.error_code == "PERMISSION_DENIED" and "WRITE VOLUME" in str(e.value)
    with pytest.raises(PermissionDenied):
        bob.files.delete(f"{base}/a.txt")
    # a volume of a visible schema without READ VOLUME: refused, as through the mount (EACCES);
    # the admin gets in
    ops.files.upload("/Volumes/main/raw/secret/s.txt", io.BytesIO(b"secret"))
    for who in ("alice", "bob"):
        with pytest.raises(PermissionDenied) as e2:
            api.sdk(who).files.download("/Volumes/main/raw/secret/s.txt").contents.read()
        assert "READ VOLUME on volume main.raw.secret" in str(e2.value)
    tok = api.srv.tokens["alice"]
    got = api.srv.error("GET", f"{FS}/directories/Volumes/main/raw/secret", token=tok)
    assert got[:2] == (403, "PERMISSION_DENIED")
    # a principal without USE CATALOG does not even see the volume: not found
    carol = token(api.o, "carol")
    assert api.srv.error("GET", f"{FS}/files{base}/a.txt", token=carol)[:2] == (404, "NOT_FOUND")
    # the volume itself is a catalog object: not removable here
    status, code, _m = api.srv.error("DELETE", f"{FS}/directories{VOL}", token=tok)
    assert (status, code) == (403, "PERMISSION_DENIED")
    assert api.srv.error("GET", f"{FS}/files/Volumes/main/raw/nope/x", token=tok)[:2] == (
        404,
        "NOT_FOUND",
    )


@pytest.mark.parametrize(
    "path",
    [
        f"{VOL}/../secret/s.txt",
        f"{VOL}/%2e%2e/secret/s.txt",
        f"{VOL}/%2E%2E%2Fsecret%2Fs.txt",
        f"{VOL}/a//b",
        f"{VOL}/./a",
        f"{VOL}/a%00b",
        "/Volumes/main/raw",
        "/etc/passwd",
        "/Volumes/.airfs-catalog/x/y/catalog.json",
        "/Volumes/main/raw/files/%ff",
    ],
)
def test_bad_paths_are_refused(api: Api, path: str) -> None:
    tok = api.srv.tokens["ops"]  # even an admin
    for method, body in (("GET", None), ("PUT", b"x"), ("DELETE", None)):
        status, code, msg = api.srv.error(method, f"{FS}/files{path}", token=tok, body=body)
        assert (status, code) == (400, "INVALID_PARAMETER_VALUE"), (method, path, msg)


def test_oversize_and_unframed_bodies(api: Api, tmp_path_factory: pytest.TempPathFactory) -> None:
    log = tmp_path_factory.mktemp("small") / "serve.log"
    with serve(api.o, log, "--max-file-size", "1M") as srv:
        tok = token(api.o, "alice", "ml")
        path = f"{d()}/big"
        status, code, msg = srv.error(
            "PUT", f"{FS}/files{path}", token=tok, body=b"x" * ((1 << 20) + 1)
        )
        assert (status, code) == (413, "INVALID_PARAMETER_VALUE") and "at most" in msg
        status, code, _m = srv.error(
            "PUT",
            f"{FS}/files{path}",
            token=tok,
            body=iter([b"x"]),
            headers={"Transfer-Encoding": "chunked"},
        )
        assert (status, code) == (411, "INVALID_PARAMETER_VALUE")
        # a multipart session holds at most the limit too
        st, _h, raw = srv.raw("POST", f"{FS}/files{path}?action=initiate-upload", token=tok)
        assert st == 200
        session = json.loads(raw)["multipart_upload"]["session_token"]
        req = json.dumps(
            {"path": path, "session_token": session, "start_part_number": 1, "count": 2}
        ).encode()
        _st, _h, raw = srv.raw("POST", f"{FS}/create-upload-part-urls", token=tok, body=req)
        urls = [u["url"].split(srv.url, 1)[1] for u in json.loads(raw)["upload_part_urls"]]
        assert srv.raw("PUT", urls[0], body=b"a" * (1 << 19))[0] == 200
        assert srv.error("PUT", urls[1], body=b"b" * ((1 << 19) + 1))[:2] == (
            413,
            "INVALID_PARAMETER_VALUE",
        )
        assert srv.raw("PUT", f"{FS}/upload-part/not-a-session/1", body=b"x")[0] == 403
        with pytest.raises(OriginNotFound):
            api.o.view.stat(path.removeprefix("/Volumes/"))  # nothing was written


def test_table_files_follow_select_not_the_volume(api: Api) -> None:
    """A table registered over files in a volume: its grantee reads them over the Files API
    with SELECT alone (no READ VOLUME), as through the mount, and nothing else there."""
    ops = api.sdk("ops")
    v = f"tv{uuid.uuid4().hex[:6]}"
    ops.volumes.create(
        catalog_name="main", schema_name="raw", name=v, volume_type=VolumeType.MANAGED
    )
    ops.files.upload(f"/Volumes/main/raw/{v}/t/part-0.parquet", io.BytesIO(b"PAR1 rows"))
    ops.files.upload(f"/Volumes/main/raw/{v}/other.txt", io.BytesIO(b"not the table's"))
    ops.tables.create(
        name=f"t_{v}",
        catalog_name="main",
        schema_name="raw",
        table_type=TableType.EXTERNAL,
        data_source_format=DataSourceFormat.PARQUET,
        storage_location=f"/Volumes/main/raw/{v}/t",
    )
    ops.grants.update(
        "table",
        f"main.raw.t_{v}",
        changes=[PermissionsChange(principal="carol", add=[Privilege.SELECT])],
    )
    carol = WorkspaceClient(host=api.srv.url, token=token(api.o, "carol", "ml"))
    got = carol.files.download(f"/Volumes/main/raw/{v}/t/part-0.parquet").contents.read()
    assert got == b"PAR1 rows"
    with pytest.raises(PermissionDenied):  # no MODIFY
        carol.files.upload(f"/Volumes/main/raw/{v}/t/part-1.parquet", io.BytesIO(b"x"))
    with pytest.raises(PermissionDenied):  # outside the table: the volume's rules
        carol.files.download(f"/Volumes/main/raw/{v}/other.txt").contents.read()
