"""A cold sequential read through a real mount (the kernel's readahead and request order
included) asks the origin for whole parts of the object's 8 MiB grid, each byte once: counted
by the daemon (``origin_requests``, ``origin_bytes_read`` of ``airfs status --json``), not
timed.

Before, the prefetch window's growth (1, 2, 4, 8 MiB from the start) left its parts 1 MiB off
the grid, and every request ended with a short piece: this read took 74 requests on both
origins and transports (68 now); a cold 1 GiB read from S3, 145 GETs where 131 do. SeaweedFS,
which keeps 4 MiB chunks, sent a fifth more bytes between its own processes for them
(``docs/benchmarks.md``, stop 46).
"""

from __future__ import annotations

import hashlib
import os

import pytest

from airfs.testing.fixtures import Volume

pytestmark = pytest.mark.mount

MiB = 1 << 20
PART = 8 * MiB
SIZE = 512 * MiB
#: the pieces of the window's first growth (1, 2 and 4 MiB) and the first read's own block,
#: and slack for a read the kernel sends ahead of the stream
FIRST = 6


@pytest.fixture(params=["kernel", "pyfuse3"])
def transport(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("AIRFS_TEST_FUSE", request.param)
    return str(request.param)


def test_a_cold_sequential_read_asks_whole_parts_of_the_grid(
    make_volume, transport: str
) -> None:  # type: ignore[no-untyped-def]
    v: Volume = make_volume()
    src = v.tmp / "big-src.bin"
    h = hashlib.sha256()
    with open(src, "wb") as f:
        for _ in range(SIZE // (16 * MiB)):
            chunk = os.urandom(16 * MiB)
            h.update(chunk)
            f.write(chunk)
    v.origin_move("big.bin", src)
    got = hashlib.sha256()
    fd = os.open(v.root / "big.bin", os.O_RDONLY)
    try:
        while chunk := os.read(fd, MiB):
            got.update(chunk)
    finally:
        os.close(fd)
    assert got.digest() == h.digest()
    st = v.m.status()["cache"]
    assert st["origin_bytes_read"] == SIZE  # each byte once
    assert SIZE // PART <= st["origin_requests"] <= SIZE // PART + FIRST, st["origin_requests"]
