"""Through the kernel transport, on S3: a directory of more objects than ``HEADS_MAX``
(:mod:`airfs.core.listings`) is listed without a HEAD per object; its names are answered
without attributes (a ``fuse_direntplus`` of node id 0), and each name's attributes are
asked when it is used: every ``stat`` sees the stored modes, ``getdents``'s inode numbers
are ``stat``'s, and after the TTL a change of mode made at the origin is seen (a listing
fetched again is bare too: its guessed modes never answer a name)."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path
from typing import Any, cast

import pytest

from airfs.core.listings import HEADS_MAX
from airfs.origin.s3 import S3Origin
from airfs.testing.fixtures import OriginSpec, Volume

pytestmark = pytest.mark.mount

FILES = HEADS_MAX + 36


def heads(v: Volume) -> int:
    """HEADs of objects the daemon's S3 client made so far (``airfs status``)."""
    st: dict[str, Any] = v.m.status()
    return int(st["origin_calls"]["requests"]["head"])


def s3_only(spec: OriginSpec) -> None:
    if spec.kind != "s3":
        pytest.skip("a listing that asks attributes per object: S3's")


def test_a_big_directory_lists_by_name(
    origin_spec: OriginSpec, make_volume: Any, tmp_path: Path
) -> None:
    s3_only(origin_spec)
    v: Volume = make_volume("--fuse", "kernel", "--ttl", "0.5")
    view = cast(S3Origin, origin_spec.view)
    src = tmp_path / "src"
    src.write_bytes(b"private")
    for i in range(FILES):
        view.put(f"d/f{i:03}", str(src), None, mode=0o600)
    view.mkdir("d/sub", 0o700)
    d = v.root / "d"
    assert stat.S_ISDIR(os.stat(d).st_mode)
    h0 = heads(v)
    with os.scandir(d) as it:
        listed = {e.name: (e.inode(), e.is_dir(follow_symlinks=False)) for e in it}
    h1 = heads(v)
    assert sorted(listed) == sorted([f"f{i:03}" for i in range(FILES)] + ["sub"])
    assert listed["sub"][1] and not listed["f000"][1]  # the kinds come with the names
    assert h1 - h0 < 3, (h0, h1)  # a LIST, not a HEAD per object (before: 101)
    # each name is asked when used: the stored modes, the listed inode numbers
    for name, (ino, is_dir) in listed.items():
        st = os.lstat(d / name)
        assert st.st_ino == ino, name
        if is_dir:  # the marker's mode where the server keeps it (SeaweedFS: 0o755)
            assert stat.S_IMODE(st.st_mode) == view.stat("d/sub").mode
        else:
            assert stat.S_IMODE(st.st_mode) == 0o600 and st.st_size == 7, name
    assert (d / "f007").read_bytes() == b"private"
    # after the TTL: a mode changed at the origin is seen, the listing fetched again is bare
    view.set_attrs("d/f042", mode=0o640)
    time.sleep(0.7)
    modes = {n: stat.S_IMODE(os.lstat(d / n).st_mode) for n in sorted(listed) if n != "sub"}
    assert modes.pop("f042") == 0o640
    assert set(modes.values()) == {0o600}
    assert sorted(os.listdir(d)) == sorted(listed)


def test_a_small_directory_comes_with_its_attributes(
    origin_spec: OriginSpec, make_volume: Any, tmp_path: Path
) -> None:
    """At most ``HEADS_MAX`` objects: the listing asks them (names and attributes in one
    ``readdir``, as before), so ``ls -l`` asks nothing more."""
    s3_only(origin_spec)
    v: Volume = make_volume("--fuse", "kernel")
    view = cast(S3Origin, origin_spec.view)
    src = tmp_path / "src"
    src.write_bytes(b"x")
    for i in range(8):
        view.put(f"s/f{i}", str(src), None, mode=0o640)
    s = v.root / "s"
    os.stat(s)
    h0 = heads(v)
    lookups0 = int(v.m.status()["fs"]["ops"].get("lookup", 0))
    with os.scandir(s) as it:
        modes = {e.name: stat.S_IMODE(e.stat(follow_symlinks=False).st_mode) for e in it}
    assert modes == {f"f{i}": 0o640 for i in range(8)}
    assert heads(v) - h0 == 8  # asked by the listing, one each
    assert int(v.m.status()["fs"]["ops"].get("lookup", 0)) == lookups0  # the kernel had them


def test_a_big_directory_read_again_is_not_asked_name_by_name(
    origin_spec: OriginSpec, make_volume: Any, tmp_path: Path
) -> None:
    """A job reading every file of a big directory again and again (cached files, epoch
    after epoch): once each name was asked, the directory is listed again (the origin then
    knows every object's attributes) and checked once per TTL by the kernel cache's watch,
    so later passes cost no HEAD per name (before: one per name per TTL, each waited for by
    an ``open``: a cached read's p99 went from 8 to 20-30 ms during a cold read). A change
    of mode made at the origin is still seen after the TTL. (A TTL of 2 s: a listing that
    takes a good part of the TTL, on a loaded machine, is not fetched again at once -- the
    rule of :mod:`airfs.core.listings` -- so the first passes may still ask names.)"""
    s3_only(origin_spec)
    ttl = 2.0
    v: Volume = make_volume("--fuse", "kernel", "--ttl", str(ttl))
    view = cast(S3Origin, origin_spec.view)
    src = tmp_path / "src"
    src.write_bytes(b"epoch")
    for i in range(FILES):
        view.put(f"e/f{i:03}", str(src), None, mode=0o600)
    d = v.root / "e"
    names = sorted(os.listdir(d))
    assert len(names) == FILES
    for n in names:  # the first pass: each name asked (and read) once
        assert (d / n).read_bytes() == b"epoch"
    per_pass = []
    for _ in range(4):
        time.sleep(ttl + 0.3)  # past the TTL
        h0 = heads(v)
        for n in names:
            with open(d / n, "rb") as f:
                assert f.read() == b"epoch"
        per_pass.append(heads(v) - h0)
    # before: FILES each pass, for ever. The first passes may still ask: objects written
    # less than 2 s before they were seen are not trusted by a listing (Last-Modified has
    # whole seconds), and a slow listing is not fetched again at once
    assert per_pass[-1] <= 2 and per_pass[-2] <= 2, per_pass
    watch = v.m.status()["fs"]["kernel_cache"]
    assert watch["leases"] > 0 and watch["checks"] > 0, watch
    view.set_attrs("e/f010", mode=0o640)
    time.sleep(ttl + 0.5)
    assert stat.S_IMODE(os.stat(d / "f010").st_mode) == 0o640
    assert stat.S_IMODE(os.stat(d / "f011").st_mode) == 0o600
