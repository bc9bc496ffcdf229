"""S3-specific behaviour of :class:`S3Origin`, against a real SeaweedFS server."""

from __future__ import annotations

import errno
import hashlib
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import obstore
import pytest
from obstore.store import S3Store

from airfs.origin.base import (
    Conflict,
    Entry,
    Kind,
    NotEmpty,
    NotFound,
    NotSupported,
    OriginError,
    PermissionDenied,
    Transient,
)
from airfs.origin.s3 import S3Origin
from airfs.testing.seaweed import SeaweedServer, seaweed_server

pytestmark = pytest.mark.s3

MiB = 1 << 20
Factory = Callable[..., S3Origin]


def bucket_store(srv: SeaweedServer) -> S3Store:
    """A plain obstore client on the whole bucket: "another tool" writing to it."""
    return S3Store(
        srv.bucket,
        endpoint=srv.endpoint,
        access_key_id=srv.access_key,
        secret_access_key=srv.secret_key,
        region="us-east-1",
        client_options={"allow_http": True},
    )


def put_file(tmp_path: Path, origin: S3Origin, path: str, data: bytes, **kw: str) -> None:
    src = tmp_path / f"src-{uuid.uuid4().hex}"
    src.write_bytes(data)
    origin.put(path, str(src), **kw)
    src.unlink()


def names(origin: S3Origin, path: str = "") -> dict[str, Kind]:
    return {e.name: e.kind for e in origin.list(path)}


def raw_keys(srv: SeaweedServer, prefix: str) -> list[str]:
    """Every key under ``prefix`` exactly as stored (markers keep their trailing slash)."""
    origin = S3Origin.from_url(srv.url(), env=srv.env)
    assert origin.client.raw is not None
    return sorted(k for k, *_ in origin.client.raw.list_keys(prefix, "test"))


# -- from_url and its check --------------------------------------------------------------------


def assert_one_line(exc: OSError) -> None:
    assert exc.strerror and "\n" not in exc.strerror and len(exc.strerror) < 600


def test_url_and_prefix(seaweed: SeaweedServer) -> None:
    o = S3Origin.from_url(f"s3://{seaweed.bucket}/some/prefix/", env=seaweed.env)
    assert o.url == f"s3://{seaweed.bucket}/some/prefix"
    assert o.prefix == "some/prefix"
    assert S3Origin.from_url(f"s3://{seaweed.bucket}", env=seaweed.env).url == "s3://airfs"
    with pytest.raises(OriginError) as ei:
        S3Origin.from_url("http://bucket/x", env=seaweed.env)
    assert ei.value.errno == errno.EINVAL


@pytest.mark.parametrize(
    "change",
    [{"AWS_SECRET_ACCESS_KEY": "wrong-secret"}, {"AWS_ACCESS_KEY_ID": "NOSUCHKEY"}],
    ids=["wrong-secret", "unknown-key"],
)
def test_wrong_credentials(seaweed: SeaweedServer, change: dict[str, str]) -> None:
    env = seaweed.env | change
    with pytest.raises(PermissionDenied) as ei:
        S3Origin.from_url(seaweed.url("x"), env=env)
    assert ei.value.errno == errno.EACCES
    assert_one_line(ei.value)
    msg = str(ei.value.strerror)
    assert msg.startswith("s3://airfs: access denied")
    assert "AWS_ACCESS_KEY_ID" in msg


def test_missing_bucket(seaweed: SeaweedServer) -> None:
    with pytest.raises(NotFound) as ei:
        S3Origin.from_url("s3://no-such-bucket-here/p", env=seaweed.env)
    assert ei.value.errno == errno.ENOENT
    assert_one_line(ei.value)
    assert "s3://no-such-bucket-here: no such bucket" in str(ei.value.strerror)


def test_endpoint_down(seaweed: SeaweedServer) -> None:
    with socket.socket() as s:  # a port with nobody listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t0 = time.monotonic()
    with pytest.raises(Transient) as ei:
        S3Origin.from_url(seaweed.url("x"), env=seaweed.env, endpoint=f"http://127.0.0.1:{port}")
    assert time.monotonic() - t0 < 20
    assert_one_line(ei.value)
    assert "cannot reach the S3 endpoint" in str(ei.value.strerror)
    assert ei.value.transient
    # without the check the origin is built; its calls fail with the same typed error
    o = S3Origin.from_url(
        seaweed.url("x"), env=seaweed.env, endpoint=f"http://127.0.0.1:{port}", check=False
    )
    with pytest.raises(Transient):
        o.stat("anything")


def test_credentials_from_shared_file(seaweed: SeaweedServer, tmp_path: Path) -> None:
    creds = tmp_path / "credentials"
    creds.write_text(
        f"[other]\naws_access_key_id = {seaweed.access_key}\n"
        f"aws_secret_access_key = {seaweed.secret_key}\n"
    )
    env = {
        "AWS_ENDPOINT_URL": seaweed.endpoint,
        "AWS_SHARED_CREDENTIALS_FILE": str(creds),
        "AWS_PROFILE": "other",
        "AWS_CONFIG_FILE": str(tmp_path / "none"),
    }
    o = S3Origin.from_url(seaweed.url(f"t-{uuid.uuid4().hex[:8]}"), env=env)
    o.mkdir("made-with-profile")  # the raw (marker) client signs with them too
    assert names(o) == {"made-with-profile": Kind.DIR}


# -- layout: markers, implied directories, other tools -------------------------------------------


def test_mkdir_writes_a_marker_object(seaweed: SeaweedServer, s3_origin_factory: Factory) -> None:
    o = s3_origin_factory()
    o.mkdir("d")
    o.mkdir("d/e")
    assert raw_keys(seaweed, o.prefix + "/") == [f"{o.prefix}/d/", f"{o.prefix}/d/e/"]
    o.rmdir("d/e")
    o.rmdir("d")
    assert raw_keys(seaweed, o.prefix + "/") == []


def test_objects_from_other_tools_in_implied_directories(
    seaweed: SeaweedServer, s3_origin_factory: Factory
) -> None:
    o = s3_origin_factory()
    other = bucket_store(seaweed)
    p = o.prefix
    obstore.put(other, f"{p}/table/part=1/a.parquet", b"A" * 100)
    obstore.put(other, f"{p}/table/part=1/b.parquet", b"B" * 200)
    obstore.put(other, f"{p}/table/_delta_log/0.json", b"{}")
    obstore.put(other, f"{p}/top.bin", b"T")

    assert names(o) == {"table": Kind.DIR, "top.bin": Kind.FILE}
    assert names(o, "table") == {"part=1": Kind.DIR, "_delta_log": Kind.DIR}
    assert {e.name: e.size for e in o.list("table/part=1")} == {"a.parquet": 100, "b.parquet": 200}
    assert o.stat("table/part=1").kind is Kind.DIR
    assert o.stat("table/part=1/b.parquet").size == 200
    assert o.read_range("table/part=1/b.parquet", 190, 100) == b"B" * 10
    with pytest.raises(NotEmpty):
        o.rmdir("table/part=1")

    # emptying an implied directory through airfs keeps it (its marker is written)
    o.delete("table/part=1/a.parquet")
    o.delete("table/part=1/b.parquet")
    assert o.stat("table/part=1").kind is Kind.DIR
    assert names(o, "table/part=1") == {}
    o.rmdir("table/part=1")
    assert names(o, "table") == {"_delta_log": Kind.DIR}

    # a marker written by another tool (S3 console style) is a directory too
    assert o.client.raw is not None
    o.client.raw.request("PUT", f"{p}/console-folder/", "test")
    assert o.stat("console-folder").kind is Kind.DIR
    assert names(o, "console-folder") == {}


def test_external_change_is_a_new_version(
    seaweed: SeaweedServer, s3_origin_factory: Factory, tmp_path: Path
) -> None:
    o = s3_origin_factory()
    put_file(tmp_path, o, "f", b"mine")
    v1 = o.stat("f").version
    obstore.put(bucket_store(seaweed), f"{o.prefix}/f", b"theirs!")
    st = o.stat("f")
    assert st.version != v1 and st.size == 7
    with pytest.raises(Conflict):
        o.read_range("f", 0, 4, v1)
    with pytest.raises(Conflict):
        put_file(tmp_path, o, "f", b"lost update", if_match=v1)
    assert o.read_range("f", 0, 100) == b"theirs!"


def test_directory_shadows_a_file_of_the_same_name(
    seaweed: SeaweedServer, s3_origin_factory: Factory
) -> None:
    o = s3_origin_factory()
    other = bucket_store(seaweed)
    obstore.put(other, f"{o.prefix}/both", b"file")
    obstore.put(other, f"{o.prefix}/both/child", b"c")
    assert names(o) == {"both": Kind.DIR}


def test_prefixes_are_isolated(s3_origin_factory: Factory, tmp_path: Path) -> None:
    a, b = s3_origin_factory(), s3_origin_factory()
    put_file(tmp_path, a, "only-in-a", b"a")
    assert names(b) == {}
    with pytest.raises(NotFound):
        b.stat("only-in-a")


def test_invalid_key(s3_origin_factory: Factory, tmp_path: Path) -> None:
    o = s3_origin_factory()
    with pytest.raises(OriginError) as ei:
        put_file(tmp_path, o, "control\x01char", b"x")
    assert ei.value.errno == errno.EINVAL


# -- writes ------------------------------------------------------------------------------------


def test_large_multipart_put(s3_origin_factory: Factory, tmp_path: Path) -> None:
    o = s3_origin_factory(single_put_max=8 * MiB, part_size=8 * MiB)
    data = os.urandom(MiB) * 60 + b"tail"
    src = tmp_path / "big"
    src.write_bytes(data)
    t0 = time.monotonic()
    e = o.put("big", str(src))
    put_s = time.monotonic() - t0
    assert e.size == len(data)
    assert e.version.strip('"').endswith("-8")  # a multipart ETag: 8 parts
    st = o.stat("big")
    assert (st.size, st.version) == (e.size, e.version)
    t0 = time.monotonic()
    got = o.read_range("big", 0, len(data) + 1, e.version)
    get_s = time.monotonic() - t0
    assert hashlib.sha256(got).digest() == hashlib.sha256(data).digest()
    mib = len(data) / MiB
    print(f"multipart put {mib / put_s:.0f} MiB/s, get {mib / get_s:.0f} MiB/s")


@pytest.mark.parametrize("mode", ["native", "emulated", "multipart"])
def test_conditional_puts(s3_origin_factory: Factory, tmp_path: Path, mode: str) -> None:
    kw: dict[str, object] = {}
    if mode == "emulated":
        kw["conditional_writes"] = False
    if mode == "multipart":  # obstore cannot make multipart uploads conditional: emulated
        kw["single_put_max"] = 64 * 1024
        kw["part_size"] = 5 * MiB
    o = s3_origin_factory(**kw)
    if mode == "native":
        assert o.conditional_writes()  # SeaweedFS honours If-Match / If-None-Match
        assert names(o) == {}  # the probe object is gone
    data = b"x" * (100 * 1024 if mode == "multipart" else 10)
    put_file(tmp_path, o, "c", data, if_match="")
    v1 = o.stat("c").version
    with pytest.raises(Conflict):
        put_file(tmp_path, o, "c", data, if_match="")
    put_file(tmp_path, o, "c", data + b"2", if_match=v1)
    with pytest.raises(Conflict):
        put_file(tmp_path, o, "c", data + b"3", if_match=v1)
    assert o.stat("c").size == len(data) + 1


def test_rename_directory_with_more_than_a_page(
    seaweed: SeaweedServer, s3_origin_factory: Factory
) -> None:
    o = s3_origin_factory()
    other = bucket_store(seaweed)
    n = 1100
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda i: obstore.put(other, f"{o.prefix}/src/f{i:05d}", b"x"), range(n)))
    o.mkdir("src/sub")
    o.rename("src", "dst")
    assert len(o.list("dst")) == n + 1
    with pytest.raises(NotFound):
        o.stat("src")
    assert raw_keys(seaweed, f"{o.prefix}/src/") == []


def test_without_a_signing_client(
    seaweed: SeaweedServer, s3_origin_factory: Factory, tmp_path: Path
) -> None:
    """When airfs cannot sign requests itself (credentials only obstore can find), files and
    implied directories still work; creating directories says clearly that it cannot."""
    o = s3_origin_factory()
    o.mkdir("d")
    put_file(tmp_path, o, "implied/f", b"x")
    o.client.raw = None
    assert o.stat("d").kind is Kind.DIR
    assert o.stat("implied").kind is Kind.DIR
    assert names(o) == {"d": Kind.DIR, "implied": Kind.DIR}
    with pytest.raises(NotSupported) as ei:
        o.mkdir("e")
    assert "credentials" in str(ei.value.strerror)
    with pytest.raises(NotEmpty):
        o.rmdir("implied")


# -- server restarts ---------------------------------------------------------------------------


def test_server_restart(tmp_path: Path) -> None:
    """Calls fail with Transient while the server is down, and work again (with the data)
    once it is back; base.retry rides over a short outage."""
    with seaweed_server(tmp_path / "srv") as srv:
        o = S3Origin.from_url(srv.url("r"), env=srv.env)
        put_file(tmp_path, o, "kept", b"data")
        srv.stop()
        with pytest.raises(Transient) as ei:
            o.stat("kept")
        assert_one_line(ei.value)
        result: list[object] = []

        def retrying() -> None:
            # a client that keeps trying: the origin's own client recovers once it is back
            exc: Exception | None = None
            for _ in range(60):
                try:
                    result.append(o.stat("kept"))
                    return
                except Transient as e:
                    exc = e
                    time.sleep(0.5)
            result.append(exc or AssertionError("unreachable"))

        waiter = threading.Thread(target=retrying)
        waiter.start()
        time.sleep(1.0)
        srv.start()  # from the main thread (see SeaweedServer.start)
        waiter.join(60)
        (st,) = result
        assert not isinstance(st, Exception), st
        assert isinstance(st, Entry)
        assert st.size == 4
        assert o.read_range("kept", 0, 10) == b"data"


def test_stale_multipart_uploads_are_aborted(seaweed: SeaweedServer) -> None:
    """Bug 15 of "Nothing lost": a daemon killed mid-upload leaves its multipart upload
    behind (8 after 5 kills); the next mount aborts those older than the threshold, under
    its own prefix only."""
    prefix = f"mp-{uuid.uuid4().hex[:8]}"
    o = S3Origin.from_url(seaweed.url(prefix), env=seaweed.env)
    other = S3Origin.from_url(seaweed.url(f"{prefix}-other"), env=seaweed.env)
    assert o.client.raw is not None
    for origin, key in ((o, f"{prefix}/big.bin"), (other, f"{prefix}-other/x.bin")):
        assert origin.client.raw is not None
        origin.client.raw.request("POST", key, "test", {"uploads": ""})
    assert o.abort_stale_uploads(older_than_s=3600) == 0  # too recent
    assert o.abort_stale_uploads(older_than_s=0) == 1
    assert o.abort_stale_uploads(older_than_s=0) == 0
    assert other.abort_stale_uploads(older_than_s=0) == 1  # untouched by the first


def test_deleted_and_renamed_keys_are_not_remembered(
    s3_origin_factory: Factory, tmp_path: Path
) -> None:
    """The per-key attributes the origin remembers (``_known``, for listings without a HEAD
    per object) follow the keys that exist: a deleted key or a renamed-away one is forgotten
    (issue 11, "Memory": rounds of create + delete must not grow the daemon)."""
    o = s3_origin_factory()
    before = len(o.client.known)
    for i in range(10):
        put_file(tmp_path, o, f"f{i}", b"x" * i)
    assert len(o.client.known) == before + 10
    for i in range(5):
        o.delete(f"f{i}")
    for i in range(5, 10):
        o.rename(f"f{i}", f"g{i}")
    assert {p for p in o.client.known if p.startswith("f")} == set()
    for i in range(5, 10):
        o.delete(f"g{i}")
    assert len(o.client.known) == before


def test_known_attributes_are_saved_for_the_next_daemon(
    s3_origin_factory: Factory, seaweed: SeaweedServer, tmp_path: Path
) -> None:
    """What one daemon learnt of objects' stored attributes (HEADs) is saved in its cache
    dir and loaded by the next: its first listing of the directory HEADs nothing it already
    saw, and still gets each object's mode; an object changed since is HEADed again; a file
    of another origin, or a damaged one, adds nothing."""
    o = s3_origin_factory()
    o.mkdir("d")
    for i in range(6):
        src = tmp_path / f"src{i}"
        src.write_bytes(b"x" * i)
        o.put(f"d/f{i}", str(src), None, mode=0o600 if i == 0 else 0o644)
    assert {e.name for e in o.list("d")} == {f"f{i}" for i in range(6)}
    time.sleep(2.1)  # past Last-Modified's second: what is known is trusted from then on
    o.list("d")  # read again now (a HEAD each): remembered as of now
    saved = str(tmp_path / "known.json")
    assert o.save_known(saved) >= 6
    assert oct(os.stat(saved).st_mode & 0o777) == "0o600"

    def counting(origin: S3Origin) -> list[str]:
        heads: list[str] = []
        real = origin.client.head

        def head(path: str) -> Any:
            heads.append(path)
            return real(path)

        origin.client.head = head  # type: ignore[method-assign]
        return heads

    nxt = S3Origin.from_url(o.url, env=seaweed.env)
    try:
        assert nxt.load_known(saved) >= 6
        src = tmp_path / "changed"
        src.write_bytes(b"changed")
        o.put("d/f5", str(src), None, mode=0o640)  # changed since it was saved
        heads = counting(nxt)
        got = {e.name: e for e in nxt.list("d")}
        assert got["f0"].mode & 0o777 == 0o600 and got["f1"].mode & 0o777 == 0o644
        assert got["f5"].mode & 0o777 == 0o640
        assert [h.rsplit("/", 1)[1] for h in heads] == ["f5"]
    finally:
        nxt.close()
    other = s3_origin_factory()
    assert other.load_known(saved) == 0  # another origin's
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert other.load_known(str(bad)) == 0
    assert other.load_known(str(tmp_path / "missing.json")) == 0
