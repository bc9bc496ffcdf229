"""``link(2)`` on an S3 origin through two mounts (two nodes): an atomic create-if-absent
copy, as delta-rs commits a table version (``link(tmp, NNN.json)``): exactly one writer wins,
the others get EEXIST, whichever node they are on; each name is then a file of its own."""

from __future__ import annotations

import errno
import os
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from airfs.testing.mountfix import Mounted, fuse_available, mount, teardown_all
from airfs.testing.seaweed import SeaweedServer

pytestmark = [
    pytest.mark.mount,
    pytest.mark.s3,
    pytest.mark.skipif(not fuse_available(), reason="needs /dev/fuse and fusermount3"),
]

TTL = 0.5


@pytest.fixture
def two_nodes(seaweed: SeaweedServer, tmp_path: Path) -> Iterator[tuple[Mounted, Mounted]]:
    spec = seaweed.url(f"links-{uuid.uuid4().hex[:12]}")
    made: list[Mounted] = []
    try:
        for name in ("a", "b"):
            mnt, cache = tmp_path / f"mnt-{name}", tmp_path / f"cache-{name}"
            mnt.mkdir()
            args = ["--ttl", str(TTL), "--s3-endpoint", seaweed.endpoint]
            made.append(mount(spec, mnt, cache, *args, env=seaweed.env))
        yield made[0], made[1]
    finally:
        teardown_all(made)


def seen(path: Path, data: bytes, timeout: float = 10.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            if path.read_bytes() == data:
                return True
        except OSError:
            pass
        time.sleep(0.05)
    return False


def test_link_race_across_nodes_has_exactly_one_winner(two_nodes: tuple[Mounted, Mounted]) -> None:
    a, b = two_nodes
    (a.mountpoint / "_delta_log").mkdir()
    a.flush()  # the directory exists at the origin: node b sees it within the TTL
    writers = [(a, i) for i in range(3)] + [(b, i) for i in range(3, 6)]
    for m, i in writers:  # each writer's temporary file, closed (not yet committed)
        (m.mountpoint / "_delta_log" / f".tmp-{i}").write_bytes(f"version 1 by {i}".encode())
    barrier = threading.Barrier(len(writers))
    results: dict[int, int] = {}

    def attempt(m: Mounted, i: int) -> None:
        log = m.mountpoint / "_delta_log"
        barrier.wait()
        try:
            os.link(log / f".tmp-{i}", log / "00000000000000000001.json")
            results[i] = 0
        except OSError as exc:
            results[i] = exc.errno or -1

    threads = [threading.Thread(target=attempt, args=w) for w in writers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    winners = [i for i, code in results.items() if code == 0]
    assert len(winners) == 1, results
    assert all(code == errno.EEXIST for i, code in results.items() if i not in winners), results
    want = f"version 1 by {winners[0]}".encode()
    for m in (a, b):  # the winner's bytes, on both nodes
        assert seen(m.mountpoint / "_delta_log" / "00000000000000000001.json", want)
    # each name is a file of its own: link count 1, and rewriting the source leaves the copy
    winner_node = a if winners[0] < 3 else b
    log = winner_node.mountpoint / "_delta_log"
    assert os.stat(log / "00000000000000000001.json").st_nlink == 1
    (log / f".tmp-{winners[0]}").write_bytes(b"rewritten")
    winner_node.flush()
    assert (log / "00000000000000000001.json").read_bytes() == want
