"""Page-aligned part buffers reused while nothing refers to them (``airfs.cache.buffers``), and
the parts of a cold sequential read that land in them (``Capabilities.into_reads``)."""

from __future__ import annotations

import gc
import hashlib
import os
from pathlib import Path

import pytest
import trio
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from airfs.cache import CachedReadPath
from airfs.cache.buffers import ALIGN, PartBuffers
from airfs.cache.direct import DirectWriter, address_of
from airfs.core.readpath import ObjectRef
from airfs.origin.aio import AsyncOrigin
from airfs.origin.posix import PosixOrigin
from airfs.testing.memory import Recording

MiB = 1 << 20


def test_a_buffer_is_reused_once_its_last_view_is_gone() -> None:
    pool = PartBuffers(MiB, 4)
    v = pool.lease(MiB)
    assert address_of(v) % ALIGN == 0 and not v.readonly
    first = address_of(v)
    v[:5] = b"hello"
    ro = v.toreadonly()
    piece = ro[1:4]
    del v, ro
    assert pool.idle == 0  # a slice of a read-only view of it is still alive
    again = pool.lease(MiB)
    assert address_of(again) != first and pool.made == 2
    again[:5] = b"XXXXX"
    assert bytes(piece) == b"ell"  # the other buffer: untouched
    del piece, again
    assert pool.idle == 2
    third = pool.lease(100)
    assert len(third) == 100 and pool.made == 2  # taken from the pool


def test_lease_sizes_idle_cap_and_trim() -> None:
    pool = PartBuffers(MiB + 1, 2)
    assert pool.size == MiB + ALIGN  # rounded up to a page
    with pytest.raises(ValueError):
        pool.lease(0)
    with pytest.raises(ValueError):
        pool.lease(pool.size + 1)
    views = [pool.lease(MiB) for _ in range(3)]
    del views
    assert pool.idle == 2  # the third was unmapped
    assert pool.trim(60) == 0 and pool.idle == 2
    assert pool.trim(0) == 2 and pool.idle == 0


def test_a_direct_write_from_an_aligned_buffer_needs_no_bounce(tmp_path: Path) -> None:
    pool = PartBuffers(2 * MiB, 2)
    data = os.urandom(2 * MiB - 100)  # an unaligned tail too
    v = pool.lease(len(data))
    v[:] = data
    w = DirectWriter(2 * MiB, 1)
    fd = os.open(tmp_path / "c.bin", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        w.write(fd, v.toreadonly(), 0)
    finally:
        os.close(fd)
    assert (tmp_path / "c.bin").read_bytes() == data
    if w.enabled:  # tmp_path refuses O_DIRECT on tmpfs: the page cache took it
        assert w.unbounced_bytes == w.direct_bytes == len(data) - len(data) % 4096


class LeaseModel(RuleBasedStateMachine):
    """Leases written, viewed in pieces and dropped in any order: every live view reads what
    was written into its own lease (no buffer is handed out while a view of it lives), and a
    buffer comes back only when nothing refers to it."""

    def __init__(self) -> None:
        super().__init__()
        self.pool = PartBuffers(64 * 1024, 3)
        self.views: list[tuple[memoryview, bytes]] = []  # a view, what it must read
        self.seq = 0

    @rule(n=st.integers(1, 64 * 1024))
    def lease(self, n: int) -> None:
        self.seq += 1
        v = self.pool.lease(n)
        content = hashlib.sha256(str(self.seq).encode()).digest() * (n // 32 + 1)
        v[:] = content[:n]
        self.views.append((v.toreadonly(), content[:n]))

    @precondition(lambda self: self.views)
    @rule(i=st.integers(0, 1000), a=st.integers(0, 1000), b=st.integers(0, 1000))
    def slice(self, i: int, a: int, b: int) -> None:
        v, want = self.views[i % len(self.views)]
        lo, hi = sorted((a % (len(want) + 1), b % (len(want) + 1)))
        self.views.append((v[lo:hi], want[lo:hi]))

    @precondition(lambda self: self.views)
    @rule(i=st.integers(0, 1000))
    def drop(self, i: int) -> None:
        del self.views[i % len(self.views)]

    @rule()
    def trim(self) -> None:
        self.pool.trim(0)

    @invariant()
    def views_read_their_own_bytes(self) -> None:
        for v, want in self.views:
            assert bytes(v) == want
        live = {id(v.obj) for v, _ in self.views}  # the leases still referred to
        assert self.pool.idle + len(live) <= self.pool.made


TestLeaseModel = LeaseModel.TestCase
TestLeaseModel.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)


def test_finalizers_return_buffers_from_cycles_too() -> None:
    pool = PartBuffers(MiB, 2)
    v = pool.lease(10)
    cycle: list[object] = [v]
    cycle.append(cycle)
    del v, cycle
    gc.collect()
    assert pool.idle == 1


async def test_a_cold_sequential_read_reads_its_parts_into_reused_buffers(
    tmp_path: Path,
) -> None:
    """A POSIX origin reads its 8 MiB parts into the pool's buffers: the bytes are right, in
    the cache file too (read again with the origin gone), and two objects read one after the
    other map few buffers between them (the second reuses the first's)."""
    root = tmp_path / "origin"
    root.mkdir()
    data = {name: os.urandom(64 * MiB) for name in ("a.bin", "b.bin")}
    for name, content in data.items():
        (root / name).write_bytes(content)
    po = PosixOrigin(str(root))
    refs = {n: ObjectRef(n, po.stat(n).version, po.stat(n).size) for n in data}
    assert po.capabilities.into_reads and not Recording(po).capabilities.into_reads
    async with CachedReadPath.running(
        AsyncOrigin(po), str(tmp_path / "cache"), cache_size=512 * MiB
    ) as rp:
        for name in ("a.bin", "b.bin"):
            r = rp.open(refs[name])
            got = bytearray()
            for off in range(0, len(data[name]), MiB):
                got += await r.read(off, MiB)
                await trio.sleep(0.002)
            r.close()
            assert got == data[name]
            await trio.sleep(0.05)
        st1 = rp.statistics()
        assert st1.part_buffers_leased >= 14, st1  # 16 parts of 8 MiB, first ones by demand
        assert st1.part_buffers_mapped < st1.part_buffers_leased // 2, st1
    for name in data:
        (root / name).unlink()  # from here on, only the cache has the bytes
    async with CachedReadPath.running(
        AsyncOrigin(PosixOrigin(str(root))), str(tmp_path / "cache"), cache_size=512 * MiB
    ) as rp:
        r = rp.open(refs["a.bin"])
        assert await r.read(0, len(data["a.bin"])) == data["a.bin"]
        r.close()
