"""S3 metadata (owners, mtimes) and ``link`` as a create-if-absent copy, seen from several
nodes (several :class:`S3Origin` clients on one prefix of a real SeaweedFS bucket)."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import obstore
import pytest

from airfs.origin.base import Conflict, Exists
from airfs.origin.s3 import S3Origin
from airfs.testing.seaweed import SeaweedServer

pytestmark = pytest.mark.s3

Factory = Callable[..., S3Origin]


def put(tmp_path: Path, origin: S3Origin, path: str, data: bytes, **kw: int) -> None:
    src = tmp_path / f"src-{uuid.uuid4().hex}"
    src.write_bytes(data)
    origin.put(path, str(src), None, **kw)
    src.unlink()


def test_owners_and_mtimes_are_in_the_metadata_for_every_node(
    s3_origin_factory: Factory, seaweed: SeaweedServer, tmp_path: Path
) -> None:
    a = s3_origin_factory()
    put(tmp_path, a, "f", b"x", uid=1234, gid=5678, mode=0o640, mtime_ns=1_234_567_890_123)
    obstore.put(a.client.store, "foreign", b"written by another tool")  # no airfs metadata
    b = S3Origin.from_url(a.url, env=seaweed.env)  # another node: nothing known yet
    try:
        st = b.stat("f")
        assert (st.uid, st.gid, st.mode, st.mtime_ns) == (1234, 5678, 0o640, 1_234_567_890_123)
        listed = {e.name: e for e in b.list("")}
        assert (listed["f"].uid, listed["f"].gid) == (1234, 5678)
        assert listed["f"].mtime_ns == 1_234_567_890_123
        foreign = b.stat("foreign")
        assert (foreign.uid, foreign.gid, foreign.mode) == (None, None, 0o644)
        # its Last-Modified (whole seconds), not "now"
        last_modified = obstore.head(a.client.store, "foreign")["last_modified"]
        assert foreign.mtime_ns == int(last_modified.timestamp()) * 1_000_000_000
        # a change made on node b right after a listing on node a (within the same second
        # of Last-Modified, which a metadata copy changes while the ETag stays): a's next
        # listing shows it
        assert {e.name: e.uid for e in a.list("")}["f"] == 1234
        b.set_attrs("f", uid=42, mtime_ns=2_000_000_000_000_000_000)
    finally:
        b.close()
    seen = {e.name: e for e in a.list("")}["f"]
    assert (seen.uid, seen.gid, seen.mtime_ns) == (42, 5678, 2_000_000_000_000_000_000)
    assert a.read_range("f", 0, 10) == b"x"


def test_put_without_an_mtime_stores_the_time_of_the_put(
    s3_origin_factory: Factory, tmp_path: Path
) -> None:
    a = s3_origin_factory()
    before = time.time_ns()
    put(tmp_path, a, "f", b"x")
    after = time.time_ns()
    assert before <= a.stat("f").mtime_ns <= after  # nanoseconds, not Last-Modified's seconds
    a.rename("f", "g")  # a copy keeps the metadata, so the mtime
    assert before <= a.stat("g").mtime_ns <= after


def test_set_attrs_does_not_overwrite_a_version_it_did_not_see(
    s3_origin_factory: Factory, seaweed: SeaweedServer, tmp_path: Path
) -> None:
    a = s3_origin_factory()
    put(tmp_path, a, "f", b"one")
    e = a.stat("f")
    b = S3Origin.from_url(a.url, env=seaweed.env)
    try:
        put(tmp_path, b, "f", b"two, by another node")
    finally:
        b.close()
    # the metadata copy is conditional on the ETag stat saw: a real set_attrs re-stats, so
    # provoke the race by asking for the copy of the version seen before
    with pytest.raises(Conflict):
        a.client.raw.request(  # type: ignore[union-attr]
            "PUT",
            a.client.key("f"),
            "test",
            headers={
                "x-amz-copy-source": a.client.copy_source("f"),
                "x-amz-metadata-directive": "REPLACE",
                "x-amz-copy-source-if-match": e.version,
            },
        )
    assert a.read_range("f", 0, 100) == b"two, by another node"


@pytest.mark.parametrize("how", ["conditional copy", "conditional put"])
def test_link_race_between_nodes_has_exactly_one_winner(
    s3_origin_factory: Factory, seaweed: SeaweedServer, tmp_path: Path, how: str
) -> None:
    """Writers on several nodes link their own file to the same name (a Delta commit):
    exactly one wins, the others get EEXIST, whichever way the copy is made."""
    first = s3_origin_factory()
    nodes = [first] + [S3Origin.from_url(first.url, env=seaweed.env) for _ in range(3)]
    try:
        for n in nodes:
            if how == "conditional put":
                n._conditional_copy = False  # as on a server without If-None-Match on copies
            else:
                assert n.conditional_copies()  # SeaweedFS honours it
        writers = 8
        for i in range(writers):
            put(tmp_path, first, f"_delta_log/.tmp-{i}", f"commit {i}".encode(), uid=100 + i)
        barrier = threading.Barrier(writers)

        def attempt(i: int) -> int | None:
            barrier.wait()
            try:
                nodes[i % len(nodes)].link(f"_delta_log/.tmp-{i}", "_delta_log/00000001.json")
            except Exists:
                return None
            return i

        with ThreadPoolExecutor(writers) as pool:
            won = [i for i in pool.map(attempt, range(writers)) if i is not None]
        assert len(won) == 1
        final = first.stat("_delta_log/00000001.json")
        assert first.read_range("_delta_log/00000001.json", 0, 100) == (
            f"commit {won[0]}".encode()
        )
        assert final.uid == 100 + won[0]  # the winner's metadata came along
    finally:
        for n in nodes[1:]:
            n.close()
