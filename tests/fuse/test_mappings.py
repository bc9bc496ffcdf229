"""Writes through a shared mapping that outlives ``close()`` (numpy.memmap's pattern: it closes
its file right after mapping it) reach the origin: a mapping keeps the file open, so the file is
committed when its last mapping is gone, or at ``msync`` for what was synced."""

from __future__ import annotations

import mmap
import os
import subprocess

import pytest

from airfs.testing.fixtures import Volume

pytestmark = pytest.mark.mount

PAGE = mmap.PAGESIZE


@pytest.fixture(params=["kernel", "pyfuse3"])
def transport(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("AIRFS_TEST_FUSE", request.param)
    return str(request.param)


def _map_after_close(path: str, size: int) -> mmap.mmap:
    """open(w+), size the file, map it shared and writable, close the file (as numpy.memmap)."""
    with open(path, "w+b") as f:
        f.truncate(size)
        m = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_WRITE)
    return m


def test_writes_through_a_mapping_after_close_survive_msync_and_remount(
    make_volume, transport: str
) -> None:  # type: ignore[no-untyped-def]
    v: Volume = make_volume()
    size = 64 * PAGE
    m = _map_after_close(str(v.root / "train.bin"), size)
    m[:PAGE] = b"A" * PAGE
    m[size - PAGE :] = b"Z" * PAGE
    m.flush()  # msync(MS_SYNC): must not fail (numpy.memmap.flush() raised FileNotFoundError)
    m[PAGE : 2 * PAGE] = b"B" * PAGE  # after the msync, before the unmap
    m.close()
    expected = b"A" * PAGE + b"B" * PAGE + b"\0" * (size - 3 * PAGE) + b"Z" * PAGE
    assert (v.root / "train.bin").read_bytes() == expected
    v.m.flush()
    assert v.origin_bytes("train.bin") == expected
    v.remount()
    assert (v.root / "train.bin").read_bytes() == expected


def test_many_mapped_writes_after_close_all_reach_the_origin(
    make_volume, transport: str
) -> None:  # type: ignore[no-untyped-def]
    """Concurrent write-backs of many dirty pages of a closed file (the kernel sends them as
    parallel WRITEs): none is lost, the msync succeeds."""
    v: Volume = make_volume()
    size = 256 * PAGE
    m = _map_after_close(str(v.root / "tok.bin"), size)
    for i in range(0, 256, 3):
        m[i * PAGE : (i + 1) * PAGE] = bytes([i % 251 + 1]) * PAGE
    m.flush()
    m.close()
    expected = bytearray(size)
    for i in range(0, 256, 3):
        expected[i * PAGE : (i + 1) * PAGE] = bytes([i % 251 + 1]) * PAGE
    v.m.flush()
    assert v.origin_bytes("tok.bin") == bytes(expected)


def test_a_mapping_of_an_existing_file_written_after_close(
    make_volume, transport: str
) -> None:  # type: ignore[no-untyped-def]
    """r+ of a committed file: map, close, write, unmap: the origin gets the change."""
    v: Volume = make_volume()
    (v.root / "data.bin").write_bytes(b"x" * (8 * PAGE))
    v.m.flush()
    fd = os.open(v.root / "data.bin", os.O_RDWR)
    m = mmap.mmap(fd, 8 * PAGE, access=mmap.ACCESS_WRITE)
    os.close(fd)
    m[3 * PAGE : 4 * PAGE] = b"y" * PAGE
    m.close()
    expected = b"x" * (3 * PAGE) + b"y" * PAGE + b"x" * (4 * PAGE)
    v.m.flush()
    assert v.origin_bytes("data.bin") == expected


def test_shell_redirect_then_rename_loop_commits_once_and_warns_not(make_volume) -> None:  # type: ignore[no-untyped-def]
    """``echo v > f.tmp; mv f.tmp f`` in a shell loop (how many tools save a file). The shell
    opens ``f.tmp``, ``dup2``s it onto stdout and closes the first descriptor (a FLUSH while
    the open file lives on), then ``echo`` writes. The version journaled at that first
    ``close()`` waits for the open file's end instead of being committed empty at once (its
    commit raced the write: the daemon warned "could not keep ... in the cache")."""
    v: Volume = make_volume()
    script = 'for i in $(seq 1 60); do echo "v$i" > f.tmp; mv f.tmp f; done'
    subprocess.run(["bash", "-c", script], cwd=v.root, check=True, timeout=120)
    assert (v.root / "f").read_bytes() == b"v60\n"
    v.m.flush()
    assert v.origin_bytes("f") == b"v60\n"
    assert "could not keep" not in v.m.log.read_text()

