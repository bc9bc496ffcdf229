"""Eviction policy, the free-space floor, and the cache under constant eviction pressure."""

from __future__ import annotations

import os
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio

from airfs.cache import CachedReadPath
from airfs.cache.evict import SpaceLimit, plan_eviction
from airfs.cache.store import CachedObject, object_key
from airfs.core.readpath import ObjectRef
from airfs.origin.aio import AsyncOrigin
from airfs.origin.latency import LatencyOrigin
from airfs.testing.memory import MemoryOrigin

KiB, MiB = 1 << 10, 1 << 20


class FakeVfs:
    """A statvfs reporting ``free()`` bytes free."""

    def __init__(self, free: Callable[[], int]) -> None:
        self.free = free
        self.calls = 0

    def __call__(self, path: str) -> Any:
        self.calls += 1
        blocks = max(0, self.free()) // 4096
        return os.statvfs_result((4096, 4096, 1 << 30, blocks, blocks, 0, 0, 0, 0, 255))


def test_space_limit_free_floor() -> None:
    free = [10 * MiB]
    vfs = FakeVfs(lambda: free[0])
    space = SpaceLimit("/x", cache_size=100 * MiB, min_free=4 * MiB, statvfs=vfs, interval=60)
    # 2 MiB cached, 10 MiB free, keep 4 MiB free: the cache may grow to 2 + 10 - 4 = 8 MiB
    assert space.limit(2 * MiB) == 8 * MiB
    # bytes added since the measurement are taken off the free space estimate
    assert space.limit(5 * MiB) == 8 * MiB
    assert vfs.calls == 1
    space.invalidate()
    free[0] = 100 * MiB
    assert space.limit(5 * MiB) == 100 * MiB  # capped by cache_size
    assert SpaceLimit("/x", cache_size=7, min_free=0, statvfs=vfs).limit(3) == 7


class FakeReader:
    def __init__(self, lo: int, hi: int) -> None:
        self.range = (lo, hi)

    def active_range(self) -> tuple[int, int]:
        return self.range


def obj(name: str, size: int, present: bool = True) -> CachedObject:
    o = CachedObject(object_key(name, "v"), name, "v", size, 1, 64 * KiB, 16 * KiB)
    if present:
        assert o.have is not None
        o.have[:] = b"\x01" * o.nblocks
        o.cached = size
    return o


def test_plan_eviction_lru_skips_objects_in_use() -> None:
    a, b, c = obj("a", 256 * KiB), obj("b", 256 * KiB), obj("c", 256 * KiB)
    a.readers.add(FakeReader(0, 256 * KiB))
    plan = plan_eviction([a, b, c], 300 * KiB)
    assert plan.objects == [b, c] and plan.blocks == []
    assert plan.nbytes == 512 * KiB


def test_plan_eviction_blocks_outside_reader_window_only() -> None:
    big = obj("big", 1 * MiB)  # 16 blocks
    big.readers.add(FakeReader(512 * KiB, 640 * KiB))  # blocks 8..10 (+1 margin) protected
    big.inflight[3] = object()
    plan = plan_eviction([big], 10 * MiB)
    assert plan.objects == []
    ((o, blocks),) = plan.blocks
    assert o is big
    assert 3 not in blocks  # being fetched
    assert not set(blocks) & {8, 9, 10}
    assert set(blocks) >= {0, 1, 2, 4, 5, 6, 7, 12, 13, 14, 15}
    pinned = obj("pinned", 1 * MiB)
    pinned.pins = 1  # warm/adopt in progress: nothing of it goes
    assert plan_eviction([pinned], 10 * MiB).nbytes == 0


def test_a_former_passthrough_backing_file_is_evicted_whole_never_punched() -> None:
    """A process may still map a file that was a passthrough backing file: unlinking it
    (whole-object eviction) is safe for the mapping, punching holes into it is not."""
    mapped = obj("mapped", 1 * MiB)
    mapped.passed_through = True
    mapped.readers.add(FakeReader(0, 64 * KiB))  # in use again: only pass 2 could touch it
    assert plan_eviction([mapped], 10 * MiB).nbytes == 0
    mapped.readers.clear()  # nobody uses it: evicted whole
    assert plan_eviction([mapped], 10 * MiB).objects == [mapped]


async def test_min_free_floor_limits_the_cache(tmp_path: Path) -> None:
    mo = MemoryOrigin()
    files = {f"f{i}": random.Random(i).randbytes(256 * KiB) for i in range(6)}
    for name, data in files.items():
        mo.put_bytes(name, data)
    async with CachedReadPath.running(
        AsyncOrigin(mo), str(tmp_path), cache_size=100 * MiB, min_free=1 * MiB,
        block_size=64 * KiB, checksum_chunk=16 * KiB,
    ) as rp:  # fmt: skip
        # pretend the disk has 1.5 MiB free when the cache is empty
        disk = FakeVfs(lambda: 1536 * KiB - rp._table.used)
        rp._table.space = SpaceLimit(rp.cache_dir, 100 * MiB, 1 * MiB, statvfs=disk, interval=0)
        for name, data in files.items():
            e = mo.stat(name)
            r = rp.open(ObjectRef(name, e.version, e.size))
            assert await r.read(0, e.size) == data
            r.close()
            assert rp.statistics().cache_bytes_used <= 512 * KiB
        assert rp.statistics().evictions >= 4


async def test_many_readers_under_constant_eviction(tmp_path: Path) -> None:
    """Sequential and random readers of several files through a cache far too small: every
    byte is right, no block is ever misjudged as corrupt, the limit holds throughout."""
    mo = MemoryOrigin()
    files = {f"f{i}": random.Random(50 + i).randbytes(2 * MiB + 1000 * i) for i in range(3)}
    for name, data in files.items():
        mo.put_bytes(name, data)
    refs = {n: ObjectRef(n, mo.stat(n).version, mo.stat(n).size) for n in files}
    limit = 1 * MiB
    async with CachedReadPath.running(
        AsyncOrigin(LatencyOrigin(mo, latency_s=0.001)), str(tmp_path), cache_size=limit,
        block_size=64 * KiB, checksum_chunk=16 * KiB, max_window=256 * KiB,
        part_size=128 * KiB, seek_tolerance=128 * KiB,
    ) as rp:  # fmt: skip
        over: list[int] = []

        async def sequential(name: str, step: int) -> None:
            r = rp.open(refs[name])
            for off in range(0, refs[name].size, step):
                assert await r.read(off, step) == files[name][off : off + step]
                over.append(rp.statistics().cache_bytes_used - limit)
            r.close()

        async def randomly(seed: int) -> None:
            rng = random.Random(seed)
            for _ in range(60):
                name = rng.choice(list(files))
                r = rp.open(refs[name])
                off = rng.randrange(refs[name].size)
                n = rng.choice([100, 5000, 70 * KiB])
                assert await r.read(off, n) == files[name][off : off + n]
                r.close()

        async def warmer() -> None:
            for name in files:
                await rp.warm(refs[name])

        async with trio.open_nursery() as n:
            n.start_soon(sequential, "f0", 64 * KiB)
            n.start_soon(sequential, "f1", 48 * KiB)
            n.start_soon(sequential, "f2", 100 * KiB)
            n.start_soon(sequential, "f0", 200 * KiB)
            for seed in range(3):
                n.start_soon(randomly, seed)
            n.start_soon(warmer)
        st = rp.statistics()
        assert st.corrupt_blocks == 0
        assert st.evictions > 10
        assert max(over) <= 0
        assert st.inflight_bytes == 0 and st.readers_open == 0
