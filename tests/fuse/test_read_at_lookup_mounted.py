"""Issue 23 through real mounts: in a directory being read, a cold small file whose name has
expired is revalidated by reading it whole (S3: one GET answers the lookup and fills the
cache), so its open reads nothing more from the origin; a file changed at the origin is seen
changed. POSIX origins (no ``whole_reads``) keep asking by name. Assertions on the daemon's
counters."""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import pytest

from airfs.testing.fixtures import Volume

pytestmark = pytest.mark.mount

KiB = 1 << 10
TTL = 0.3


def put_files(v: Volume, n: int) -> dict[str, bytes]:
    return v.origin_files("data", {f"f{i:03d}.bin": os.urandom(30 * KiB + i) for i in range(n)})


def interleaved(names: list[str], ways: int = 3) -> list[str]:
    """0, k, 2k, 1, k+1, ...: never the next name or the one after (no fetch-ahead walk)."""
    k = len(names) // ways
    return [names[i + j * k] for i in range(k) for j in range(ways)]


def test_expired_cold_small_files_cost_one_read_each(make_volume: Callable[..., Volume]) -> None:
    v = make_volume("--ttl", str(TTL))
    files = put_files(v, 60)
    names = sorted(os.listdir(v.root / "data"))
    assert names == sorted(files)
    order = interleaved(names)
    for name in order[:10]:  # the directory is now being read
        assert (v.root / "data" / name).read_bytes() == files[name]
    time.sleep(TTL + 0.2)  # every name and listing expired
    for name in order[10:]:
        p = v.root / "data" / name
        assert p.stat().st_size == len(files[name])
        assert p.read_bytes() == files[name]
    st = v.m.status()
    fetched = st["cache"]["fetched_at_lookup"]
    reads = st["origin_calls"]["calls"]["read"]
    assert st["fs"]["fetched_ahead"] == 0
    if v.spec.kind == "s3":
        # the 50 read after the pause: each revalidated by its read, stored, opened from
        # the cache; every file read from the origin once in all
        calls = st["origin_calls"]["calls"]
        assert fetched >= 45, st["cache"]
        assert reads == 60, calls
        # no HEAD nor listing for those 50 names: their reads answered them
        assert calls.get("stat", 0) + calls.get("list", 0) <= 12, calls
    else:
        assert fetched == 0, st["cache"]


def test_a_file_changed_at_the_origin_is_read_changed(make_volume: Callable[..., Volume]) -> None:
    v = make_volume("--ttl", str(TTL))
    files = put_files(v, 30)
    names = sorted(os.listdir(v.root / "data"))
    order = interleaved(names)
    for name in order[:10]:
        assert (v.root / "data" / name).read_bytes() == files[name]
    changed = order[10]
    new = os.urandom(50 * KiB)
    v.origin_put(f"data/{changed}", new)  # another writer: a new size and version
    v.spec.view.delete(f"data/{order[11]}")
    time.sleep(TTL + 0.2)
    p = v.root / "data" / changed
    assert p.stat().st_size == len(new)
    assert p.read_bytes() == new
    with pytest.raises(FileNotFoundError):
        (v.root / "data" / order[11]).read_bytes()
    time.sleep(TTL + 0.2)  # the listing that answered the missing name expires
    for name in order[12:]:
        assert (v.root / "data" / name).read_bytes() == files[name]
    if v.spec.kind == "s3":
        assert v.m.status()["cache"]["fetched_at_lookup"] >= 10
