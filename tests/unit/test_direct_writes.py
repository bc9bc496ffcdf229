"""Issue 23: a cold sequential read writes its parts into the cache file without the page cache
(``O_DIRECT``) and serves them to its reader from the fetched buffers kept until read; the
cache file still holds every byte (checked by its checksums) for the next reader."""

from __future__ import annotations

import errno
import mmap
import os
import random
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import pytest
import trio

import airfs.cache.direct as direct_mod
from airfs.cache import CachedReadPath
from airfs.cache.direct import ALIGN, DirectWriter, copy_released
from airfs.core.readpath import ObjectRef
from airfs.origin.aio import AsyncOrigin
from airfs.origin.posix import PosixOrigin

KiB, MiB = 1 << 10, 1 << 20


def blob(n: int, seed: int = 0) -> bytes:
    return random.Random(seed).randbytes(n)


def big_object(tmp_path: Path, size: int, seed: int) -> tuple[bytes, ObjectRef]:
    """``big.bin`` of ``size`` random bytes at a POSIX origin in ``tmp_path/origin``."""
    root = tmp_path / "origin"
    root.mkdir()
    data = blob(size, seed)
    (root / "big.bin").write_bytes(data)
    e = PosixOrigin(str(root)).stat("big.bin")
    return data, ObjectRef("big.bin", e.version, e.size)


def cached(tmp_path: Path) -> AbstractAsyncContextManager[CachedReadPath]:
    """A read path over that origin, its cache in ``tmp_path/cache``."""
    origin = AsyncOrigin(PosixOrigin(str(tmp_path / "origin")))
    return CachedReadPath.running(origin, str(tmp_path / "cache"), cache_size=256 * MiB)


def test_copy_released_copies_a_read_only_view() -> None:
    src = memoryview(blob(3 * ALIGN + 5)).toreadonly()
    dst = mmap.mmap(-1, 4 * ALIGN)
    copy_released(dst, src, len(src))
    assert dst[: len(src)] == src.tobytes()
    with pytest.raises(ValueError, match="larger"):
        copy_released(dst, src, 4 * ALIGN + 1)


def test_direct_writes_land_whole_with_an_unaligned_tail(tmp_path: Path) -> None:
    w = DirectWriter(8 * MiB, 2)
    f = tmp_path / "cache.bin"
    fd = os.open(f, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        os.ftruncate(fd, 3 * MiB + 100)
        a, b = blob(2 * MiB, 1), blob(MiB + 100, 2)  # the object's last part: a short tail
        w.write(fd, memoryview(a).toreadonly(), 0)
        w.write(fd, b, 2 * MiB)
        w.write(fd, blob(10, 3), 7)  # not aligned: through the page cache
    finally:
        os.close(fd)
    data = f.read_bytes()
    assert data[:7] == a[:7] and data[7:17] == blob(10, 3) and data[17 : 2 * MiB] == a[17:]
    assert data[2 * MiB :] == b
    assert w.enabled and w.direct_bytes == 3 * MiB  # the 100-byte tail and the 10 bytes not


def test_without_o_direct_the_writer_uses_the_page_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file system that refuses O_DIRECT (tmpfs: EINVAL) gets the same bytes written through
    the page cache, from then on."""
    real_open = os.open

    def no_direct(path: Any, flags: int, *a: Any) -> int:
        if flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, *a)

    monkeypatch.setattr(direct_mod.os, "open", no_direct)
    w = DirectWriter(MiB, 1)
    f = tmp_path / "c.bin"
    fd = real_open(f, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        w.write(fd, blob(MiB, 4), 0)
        w.write(fd, blob(MiB, 5)[:ALIGN], MiB)
    finally:
        os.close(fd)
    assert f.read_bytes() == blob(MiB, 4) + blob(MiB, 5)[:ALIGN]
    assert not w.enabled and w.direct_bytes == 0


async def test_a_cold_sequential_read_is_served_from_kept_buffers_and_cached_on_disk(
    tmp_path: Path,
) -> None:
    """The reader's prefetched parts are written with O_DIRECT and read from memory; once it
    closes nothing stays kept, the budget is whole again, and a second reader reads every
    byte from the cache file (its checksums checked) without the origin."""
    data, obj = big_object(tmp_path, 48 * MiB, 6)
    async with cached(tmp_path) as rp:
        r = rp.open(obj)
        got = bytearray()
        for off in range(0, len(data), MiB):
            got += await r.read(off, MiB)
            await trio.sleep(0.01)  # the reader's own work: the prefetch gets ahead of it
        assert bytes(got) == data
        st = rp.statistics()
        assert st.direct_write_bytes > 24 * MiB, st
        assert st.kept_hit_bytes > 8 * MiB, st
        r.close()
        await trio.sleep(0.1)
        st = rp.statistics()
        assert st.kept_bytes == 0 and st.inflight_bytes == 0, st
        requests = st.origin_requests
        r2 = rp.open(obj)
        again = bytearray()
        for off in range(0, len(data), 4 * MiB):
            again += await r2.read(off, 4 * MiB)
        r2.close()
        assert bytes(again) == data
        st2 = rp.statistics()
        assert st2.origin_requests == requests and st2.corrupt_blocks == 0
        assert st2.hit_bytes - st.hit_bytes == len(data)


async def test_a_reader_that_jumps_away_lets_its_kept_buffers_go(tmp_path: Path) -> None:
    """Buffers kept for a reader that went elsewhere are given back (to the in-flight budget)
    as its next parts are stored, not held until it closes."""
    data, obj = big_object(tmp_path, 96 * MiB, 7)
    async with cached(tmp_path) as rp:
        r = rp.open(obj)
        for off in range(0, 24 * MiB, MiB):
            assert await r.read(off, MiB) == data[off : off + MiB]
        await trio.sleep(0.5)  # the prefetched parts ahead are stored and kept
        kept = rp.statistics().kept_bytes
        assert kept > 0
        # read on far ahead, sequentially: what was kept behind the new position goes
        for off in range(64 * MiB, 96 * MiB, MiB):
            assert await r.read(off, MiB) == data[off : off + MiB]
        await trio.sleep(0.5)
        st = rp.statistics()
        assert st.kept_bytes < kept, st
        r.close()
        assert rp.statistics().kept_bytes == 0


async def test_airfs_direct_writes_0_turns_both_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The operator's switch: every write through the page cache, no buffer kept."""
    monkeypatch.setenv("AIRFS_DIRECT_WRITES", "0")
    data, obj = big_object(tmp_path, 32 * MiB, 8)
    async with cached(tmp_path) as rp:
        r = rp.open(obj)
        got = bytearray()
        for off in range(0, len(data), MiB):
            got += await r.read(off, MiB)
            await trio.sleep(0.01)
        r.close()
        assert bytes(got) == data
        st = rp.statistics()
        assert st.direct_write_bytes == 0 and st.kept_hit_bytes == 0, st
        assert st.hit_bytes > 8 * MiB  # read back from the cache file instead
