"""Revalidation by directory through the kernel (issue 22, items 2 and 6), both origins and
both transports: after the TTL one listing answers the names of a directory, and a change,
an addition or a removal at the origin is seen within the TTL; a directory whose listing
arrives stale is asked by name, not listed again for each name. Counted with the daemon's
statistics (``airfs status``: ``fs.relists``, ``origin_calls.calls``), never timed."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from airfs.control import client
from airfs.testing.fixtures import Volume
from airfs.testing.mountfix import airfs_cmd

pytestmark = pytest.mark.mount

N = 30


@pytest.fixture(params=["kernel", "pyfuse3"])
def transport(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("AIRFS_TEST_FUSE", request.param)
    return str(request.param)


def counts(v: Volume) -> tuple[int, int, int]:
    """(listings fetched again, origin ``stat`` calls, origin ``list`` calls) so far."""
    s: dict[str, Any] = client.status(str(v.root))
    calls = s["origin_calls"]["calls"]
    return s["fs"]["relists"], calls.get("stat", 0), calls.get("list", 0)


def test_one_listing_revalidates_a_directory_and_origin_changes_are_seen(
    make_volume, transport: str, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    v: Volume = make_volume("--ttl", "1")
    v.spec.view.mkdir("d")
    for i in range(N):
        v.origin_put(f"d/f{i:02d}", b"x")
    d = v.root / "d"
    names = sorted(os.listdir(d))
    assert len(names) == N
    for n in names:
        os.stat(d / n)
    time.sleep(1.2)  # the TTL passes (kernel entries and the daemon's listing)
    r0, s0, _ = counts(v)
    for n in names:
        assert os.stat(d / n).st_size == 1
    r1, s1, _ = counts(v)
    if transport == "kernel":
        # the kernel kept the names past the TTL while the daemon checked the directory
        # (test_kernel_cache_mounted.py): at most the check's listing fell in the loop
        assert r1 - r0 <= 1, "one listing revalidates the directory"
    else:
        assert r1 - r0 == 1, "one listing revalidates the directory"
    assert s1 - s0 <= 2, f"names asked one by one: {s1 - s0} stats for {N} names"
    # changed, added and removed at the origin right after that listing
    v.origin_put("d/f03", b"changed")
    v.origin_put("d/new", b"n")
    v.spec.view.delete("d/f04")
    time.sleep(1.2)
    assert os.stat(d / "f03").st_size == len(b"changed")
    assert (d / "f03").read_bytes() == b"changed"
    assert os.stat(d / "new").st_size == 1
    with pytest.raises(FileNotFoundError):
        os.stat(d / "f04")
    assert sorted(os.listdir(d)) == sorted({*names, "new"} - {"f04"})


def test_a_directory_whose_listing_arrives_stale_is_asked_by_name(
    make_volume, transport: str
) -> None:  # type: ignore[no-untyped-def]
    # `ls -l` of a 100k-entry directory hung: each lstat after the TTL waited for a whole
    # listing that arrived already expired. Here every origin call takes 0.3 s, as long as
    # the TTL: the listing is fetched again only once the names asked one by one cost as
    # much (the old code fetched it for every name).
    v: Volume = make_volume("--ttl", "0.3", "--emulate-latency", "0.3")
    for i in range(8):  # at the origin itself: eight commits at 0.3 s a call are not the point
        v.origin_put(f"f{i}", b"y")
    os.listdir(v.root)
    time.sleep(0.4)
    r0, s0, _ = counts(v)
    for i in range(8):
        assert os.stat(v.root / f"f{i}").st_size == 1
    r1, s1, _ = counts(v)
    assert r1 - r0 < 8, f"{r1 - r0} listings fetched again for 8 names"
    assert r1 - r0 <= s1 - s0, "never more listings than names asked one by one"


def test_immutable_mount_trusts_the_origin_until_airfs_refresh(
    make_volume, transport: str, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    v: Volume = make_volume("--ttl", "0.3", "--immutable")
    v.origin_put("data.bin", b"v1")
    assert (v.root / "data.bin").read_bytes() == b"v1"
    assert "data.bin" in os.listdir(v.root)  # the directory is listed once
    v.origin_put("data.bin", b"version 2")  # changed at the origin
    v.origin_put("late.bin", b"late")  # and added
    time.sleep(0.4)
    _, s0, l0 = counts(v)
    for _ in range(3):
        assert os.stat(v.root / "data.bin").st_size == 2
        assert sorted(os.listdir(v.root)) == ["data.bin"]
        time.sleep(0.35)  # the kernel asks again each TTL; the daemon trusts what it knows
    _, s1, l1 = counts(v)
    assert (s1, l1) == (s0, l0), "nothing asked of the origin"
    (v.root / "mine.txt").write_bytes(b"mine")  # writes still work, seen at once
    assert (v.root / "mine.txt").read_bytes() == b"mine"
    assert sorted(os.listdir(v.root)) == ["data.bin", "mine.txt"]
    bad = subprocess.run(
        [*airfs_cmd(), "refresh", str(tmp_path / "elsewhere")], capture_output=True, text=True
    )
    assert bad.returncode == 1 and "is not on an airfs mount" in bad.stderr, bad.stderr
    done = subprocess.run(
        [*airfs_cmd(), "refresh", str(v.root / "data.bin")], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    time.sleep(0.35)  # what the kernel keeps (the TTL)
    assert os.stat(v.root / "data.bin").st_size == len(b"version 2")
    assert (v.root / "data.bin").read_bytes() == b"version 2"
    # a refresh of a name also forgets its directory's listing: names added there appear
    assert (v.root / "late.bin").read_bytes() == b"late"
