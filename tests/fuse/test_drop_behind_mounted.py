"""Drop-behind through a real kernel-transport mount: a cold file read sequentially through
the daemon has the kernel's page cache behind its reader given back (asked with ``mincore``
on a mapping of the same open file), its bytes stay right when read again, and
``--no-drop-behind`` keeps them (the check can fail)."""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
import time

import pytest

from airfs.testing.fixtures import Volume

pytestmark = pytest.mark.mount

MiB = 1 << 20
SIZE = 256 * MiB
KEEP, STEP = 64 * MiB, 128 * MiB  # DropBehind's defaults
PAGE = 4096

_libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]


def resident(fd: int, size: int) -> bytes:
    """One byte per page of the open file ``fd``: bit 0 set where the page is in the
    kernel's page cache (``mincore`` on a private mapping never touched: its pages are the
    file's own)."""
    m = mmap.mmap(fd, size, mmap.MAP_PRIVATE, mmap.PROT_READ | mmap.PROT_WRITE)
    try:
        vec = ctypes.create_string_buffer((size + PAGE - 1) // PAGE)
        start = ctypes.c_char.from_buffer(m)
        rc = _libc.mincore(ctypes.addressof(start), size, vec)
        del start  # the mapping cannot close while exported
        if rc != 0:
            raise OSError(ctypes.get_errno(), "mincore")
        return vec.raw
    finally:
        m.close()


def share(vec: bytes, lo: int, hi: int) -> float:
    """The share of the pages of ``[lo, hi)`` that are resident."""
    pages = vec[lo // PAGE : hi // PAGE]
    return sum(b & 1 for b in pages) / max(1, len(pages))


def cold_file(v: Volume) -> bytes:
    """A 256 MiB file at the origin itself (never read through this mount: its reads are
    served by the daemon); returns its first MiB."""
    head = os.urandom(MiB)
    src = v.tmp / "big-src.bin"
    with open(src, "wb") as f:
        f.write(head)
        f.truncate(SIZE)
    v.origin_move("big.bin", src)
    return head


def read_through(v: Volume) -> tuple[bytes, bytes]:
    """Read the file to its end in 1 MiB reads; the page residency at the end, with the
    open still held, and the first MiB read again through the same open."""
    fd = os.open(v.root / "big.bin", os.O_RDONLY)
    try:
        while os.read(fd, MiB):
            pass
        deadline = time.monotonic() + 10
        vec = resident(fd, SIZE)
        # the notifications are written by the daemon's notifier thread and the kernel drops
        # a notified range page after page: wait for all of the range the tests check
        # (waiting for its first 64 MiB only, 21% of [64, 96) was still resident once, under
        # load)
        while share(vec, 0, 96 * MiB) >= 0.05 and time.monotonic() < deadline:
            time.sleep(0.1)
            vec = resident(fd, SIZE)
        return vec, os.pread(fd, MiB, 0)
    finally:
        os.close(fd)


def kernel_volume(make_volume: object, monkeypatch: pytest.MonkeyPatch, *extra: str) -> Volume:
    monkeypatch.setenv("AIRFS_TEST_FUSE", "kernel")
    v: Volume = make_volume(*extra)  # type: ignore[operator]
    fuse = v.m.status()["fuse"]
    if not fuse.get("passthrough"):
        pytest.skip("drop-behind needs FUSE passthrough (Linux 6.9+, CAP_SYS_ADMIN)")
    return v


def test_a_cold_sequential_read_gives_its_pages_back_behind_the_reader(
    make_volume: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    v = kernel_volume(make_volume, monkeypatch)
    assert v.m.status()["fuse"]["drop_behind"] is True
    head = cold_file(v)
    vec, again = read_through(v)
    # KEEP kept behind the end, dropped STEP at a time: [0, STEP) at least is gone
    assert share(vec, 0, 96 * MiB) < 0.05, share(vec, 0, 96 * MiB)
    assert share(vec, SIZE - 48 * MiB, SIZE) > 0.9, share(vec, SIZE - 48 * MiB, SIZE)
    assert again == head  # asked of the daemon again, from the cache file
    fuse = v.m.status()["fuse"]
    assert SIZE - KEEP - STEP <= fuse["dropped_behind_bytes"] <= SIZE - KEEP


def test_no_drop_behind_keeps_the_page_cache(
    make_volume: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    v = kernel_volume(make_volume, monkeypatch, "--no-drop-behind")
    assert v.m.status()["fuse"]["drop_behind"] is False
    head = cold_file(v)
    fd = os.open(v.root / "big.bin", os.O_RDONLY)
    try:
        while os.read(fd, MiB):
            pass
        time.sleep(0.5)
        vec = resident(fd, SIZE)
        assert os.pread(fd, MiB, 0) == head
    finally:
        os.close(fd)
    assert share(vec, 0, 96 * MiB) > 0.9, share(vec, 0, 96 * MiB)
    assert v.m.status()["fuse"]["dropped_behind_bytes"] == 0


def test_a_drop_keeps_the_writes_of_a_shared_writable_mapping(
    make_volume: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A page dirtied through another open's shared writable mapping, inside a range dropped
    behind a reader, reaches the daemon (the kernel writes it back before dropping it): the
    reader, the mapping and the origin all see the write."""
    v = kernel_volume(make_volume, monkeypatch)
    cold_file(v)
    path = v.root / "big.bin"
    wfd = os.open(path, os.O_RDWR)
    try:
        m = mmap.mmap(wfd, MiB, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        try:
            m[0:8] = b"dirtyPG0"  # not msync'ed: only in the page cache
            before = v.m.status()["fuse"]["dropped_behind_bytes"]
            rfd = os.open(path, os.O_RDONLY)
            try:
                while os.read(rfd, MiB):
                    pass
                deadline = time.monotonic() + 10
                while (
                    v.m.status()["fuse"]["dropped_behind_bytes"] == before
                    and time.monotonic() < deadline
                ):
                    time.sleep(0.1)
                assert v.m.status()["fuse"]["dropped_behind_bytes"] > before
                time.sleep(0.5)  # the notifier's write of the drop
                assert os.pread(rfd, 8, 0) == b"dirtyPG0"
            finally:
                os.close(rfd)
            assert m[0:8] == b"dirtyPG0"
        finally:
            m.close()
    finally:
        os.close(wfd)
    v.m.flush()
    assert v.spec.view.read_range("big.bin", 0, 8) == b"dirtyPG0"
