"""The kernel keeps entries past the TTL (issue 22, item 3), through the kernel transport on
both origins: after the TTL a ``stat`` of a name in a directory the daemon checks is answered
by the kernel (the daemon's lookup and getattr counts do not move), and a change, an addition
or a removal at the origin is still seen within the TTL (the daemon's check invalidates the
kernel's entry). Counted with ``airfs status``, never timed."""

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

N = 40
TTL = 1.0


@pytest.fixture(autouse=True)
def kernel_transport(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFS_TEST_FUSE", "kernel")  # pyfuse3 gives plain TTL timeouts


def asked(v: Volume) -> int:
    """Lookups and getattrs the daemon answered so far."""
    ops: dict[str, Any] = client.status(str(v.root))["fs"]["ops"]
    return int(ops.get("lookup", 0)) + int(ops.get("getattr", 0))


def test_stats_after_the_ttl_are_the_kernels_and_origin_changes_are_seen_within_it(
    make_volume, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    v: Volume = make_volume("--ttl", str(TTL))
    v.spec.view.mkdir("d")
    for i in range(N):
        v.origin_put(f"d/f{i:02d}", b"x")
    d = v.root / "d"
    names = sorted(os.listdir(d))
    assert len(names) == N
    for n in names:
        (d / n).read_bytes()
        os.stat(d / n)  # a read makes the kernel ask for the atime at the next stat
    time.sleep(1.3 * TTL)
    for n in names:  # the kernel comes back after the TTL: the directory is checked
        os.stat(d / n)
    a0 = asked(v)
    for _ in range(2):
        time.sleep(1.3 * TTL)  # the TTL passes
        for n in names:
            assert os.stat(d / n).st_size == 1
    a1 = asked(v)
    # d itself keeps the TTL (the root, its directory, was never listed): a lookup and a
    # getattr of it per pass; none of the names in it
    assert a1 - a0 <= 4, f"{a1 - a0} lookups/getattrs for {2 * N} stats after the TTL"
    kc = client.status(str(v.root))["fs"]["kernel_cache"]
    assert kc["watched"] >= 1 and kc["checks"] >= 2 and kc["dropped"] == 0, kc
    # changed, added and removed at the origin: seen within the TTL, bytes and all
    v.origin_put("d/f03", b"changed")
    v.origin_put("d/new", b"n")
    v.spec.view.delete("d/f04")
    time.sleep(TTL + 0.2)
    assert os.stat(d / "f03").st_size == len(b"changed")
    assert (d / "f03").read_bytes() == b"changed"
    assert os.stat(d / "new").st_size == 1
    with pytest.raises(FileNotFoundError):
        os.stat(d / "f04")
    assert sorted(os.listdir(d)) == sorted({*names, "new"} - {"f04"})
    kc = client.status(str(v.root))["fs"]["kernel_cache"]
    assert kc["changed"] >= 2, kc


def test_a_file_replaced_through_the_mount_is_read_whole_from_another_name_holder(
    make_volume,
) -> None:  # type: ignore[no-untyped-def]
    """A file replaced through the mount (write a temporary, rename over) while the kernel
    keeps the old name past the TTL: the next stat and read show the new file whole."""
    v: Volume = make_volume("--ttl", str(TTL))
    d = v.root / "d"
    d.mkdir()
    (d / "model.bin").write_bytes(b"a" * 4096)
    os.listdir(d)
    time.sleep(1.3 * TTL)
    assert (d / "model.bin").read_bytes() == b"a" * 4096
    (d / "model.tmp").write_bytes(b"b" * 8192)
    os.rename(d / "model.tmp", d / "model.bin")
    assert os.stat(d / "model.bin").st_size == 8192
    assert (d / "model.bin").read_bytes() == b"b" * 8192
    time.sleep(1.3 * TTL)  # committed meanwhile; still the new file
    assert (d / "model.bin").read_bytes() == b"b" * 8192


def test_immutable_names_stay_in_the_kernel_until_airfs_refresh(
    make_volume, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    v: Volume = make_volume("--ttl", str(TTL), "--immutable")
    v.spec.view.mkdir("d")
    for i in range(N):
        v.origin_put(f"d/f{i:02d}", b"x")
    d = v.root / "d"
    names = sorted(os.listdir(d))
    for n in names:
        os.stat(d / n)
    time.sleep(1.3 * TTL)
    for n in names:
        os.stat(d / n)
    v.origin_put("d/f05", b"changed")
    time.sleep(1.3 * TTL)
    a0 = asked(v)
    assert all(os.stat(d / n).st_size == 1 for n in names), "immutable: the first answer"
    assert asked(v) - a0 <= 1
    subprocess.run([*airfs_cmd(), "refresh", str(d)], check=True, capture_output=True)
    assert os.stat(d / "f05").st_size == len(b"changed")
    assert (d / "f05").read_bytes() == b"changed"


def test_a_file_keeps_its_inode_number_when_the_kernel_is_told_to_ask_again(
    make_volume, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    """Telling the kernel to ask again about names it holds (``airfs refresh``, a lease
    dropped by a late check, a take-over) must not renumber files that did not change. A full
    ``INVAL_ENTRY`` unhashes the name: the kernel evicts the inode, forgets it, and the next
    lookup is given a new number, so a tool between its ``stat`` and its ``open`` sees another
    file (``cp``: "skipping file ..., as it was replaced while being copied", met copying 2,000
    cold files while a late check dropped a lease). Such names are now only expired."""
    v: Volume = make_volume("--ttl", str(TTL))
    v.spec.view.mkdir("d")
    for i in range(N):
        v.origin_put(f"d/f{i:02d}", b"x")
    v.origin_put("d/f05", b"version 1")
    d = v.root / "d"
    before = {n: os.stat(d / n).st_ino for n in sorted(os.listdir(d))}
    subprocess.run([*airfs_cmd(), "refresh", str(d)], check=True, capture_output=True)
    v.origin_put("d/f05", b"version 2, longer")  # changed at the origin meanwhile
    time.sleep(0.2)  # the notifications are written by a thread of their own
    after = {n: os.stat(d / n).st_ino for n in before}
    assert after == before, "the same files, the same numbers"
    assert (d / "f05").read_bytes() == b"version 2, longer"  # refresh still shows the change
