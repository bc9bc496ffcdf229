"""The cached read path: persistence, versions, checksums, eviction, prefetch, warm, adopt."""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from airfs.cache import CacheDamaged, CachedReadPath, CacheInUse, set_aside
from airfs.cache.index import check_lmdb_file
from airfs.core.readpath import ObjectRef
from airfs.origin.aio import AsyncOrigin
from airfs.origin.base import Conflict, Transient
from airfs.origin.latency import LatencyOrigin
from airfs.origin.posix import PosixOrigin
from airfs.testing.memory import FaultyOrigin, MemoryOrigin, Recording

KiB, MiB = 1 << 10, 1 << 20
SMALL = {"block_size": 64 * KiB, "checksum_chunk": 16 * KiB}


def ref(origin: Any, path: str) -> ObjectRef:
    e = origin.stat(path)
    return ObjectRef(path, e.version, e.size)


@asynccontextmanager
async def cached(origin: Any, cache_dir: Path, **kw: Any) -> AsyncIterator[CachedReadPath]:
    opts = {"cache_size": 256 * MiB, **SMALL, **kw}
    async with CachedReadPath.running(AsyncOrigin(origin), str(cache_dir), **opts) as rp:
        yield rp


async def read_all(rp: CachedReadPath, obj: ObjectRef, step: int = 128 * KiB) -> bytes:
    r = rp.open(obj)
    try:
        out = []
        for off in range(0, obj.size, step):
            out.append(await r.read(off, step))
        return b"".join(out)
    finally:
        r.close()


def data_files(cache_dir: Path) -> list[str]:
    return sorted(glob.glob(str(cache_dir / "data" / "*" / "*")))


def blob(n: int, seed: int = 0) -> bytes:
    return random.Random(seed).randbytes(n)


# -- correctness -------------------------------------------------------------------------


async def test_reads_return_exact_bytes(tmp_path: Path) -> None:
    mo = MemoryOrigin()
    data = blob(3 * MiB + 12345)
    mo.put_bytes("f", data)
    obj = ref(mo, "f")
    rng = random.Random(1)
    async with cached(mo, tmp_path) as rp:
        r = rp.open(obj)
        for _ in range(300):
            off = rng.randrange(obj.size + 10)
            n = rng.choice([1, 100, 4096, 16 * KiB, 64 * KiB + 3, 200 * KiB, 1 * MiB])
            assert await r.read(off, n) == data[off : off + n]
        assert await r.read(obj.size, 10) == b""
        assert await r.read(obj.size - 5, 100) == data[-5:]
        r.close()
        with pytest.raises(ValueError):
            await r.read(0, 1)
        assert await read_all(rp, obj) == data


async def test_empty_file(tmp_path: Path) -> None:
    mo = MemoryOrigin()
    mo.put_bytes("e", b"")
    obj = ref(mo, "e")
    async with cached(mo, tmp_path) as rp:
        r = rp.open(obj)
        assert await r.read(0, 100) == b""
        r.close()
        assert await rp.warm(obj) == 0
    assert mo.calls["read_range"] == 0


async def test_cache_hits_after_restart(tmp_path: Path) -> None:
    mo = MemoryOrigin()
    data = blob(2 * MiB + 7)
    mo.put_bytes("f", data)
    obj = ref(mo, "f")
    async with cached(mo, tmp_path) as rp:
        assert await read_all(rp, obj) == data
    reads, nbytes = mo.calls["read_range"], mo.bytes_read
    assert nbytes == obj.size  # each byte fetched once
    async with cached(mo, tmp_path) as rp:  # "restart": a new read path on the same dir
        assert await read_all(rp, obj, step=100 * KiB) == data
        st = rp.statistics()
        assert st.hit_bytes == obj.size and st.miss_bytes == 0
        assert st.origin_requests == 0
    assert (mo.calls["read_range"], mo.bytes_read) == (reads, nbytes)


async def test_restart_with_posix_origin(tmp_path: Path) -> None:
    root = tmp_path / "origin"
    (root / "d").mkdir(parents=True)
    data = blob(5 * MiB + 3, seed=2)
    (root / "d" / "big.bin").write_bytes(data)
    po = Recording(PosixOrigin(str(root)))
    obj = ref(po, "d/big.bin")
    cache = tmp_path / "cache"
    async with cached(po, cache) as rp:
        assert await read_all(rp, obj, step=1 * MiB) == data
    n = len(po.ranges)
    assert sum(size for _, _, size in po.ranges) == obj.size
    async with cached(po, cache) as rp:
        assert await read_all(rp, obj) == data
        assert await rp.warm(obj) == 0
    assert len(po.ranges) == n  # nothing read from the origin after the restart
    assert len(data_files(cache)) == 1  # one sparse file per object version


async def test_cache_dir_owned_by_one_daemon(tmp_path: Path) -> None:
    mo = MemoryOrigin()
    async with cached(mo, tmp_path):
        with pytest.raises(CacheInUse):
            async with cached(mo, tmp_path):
                pass
    async with cached(mo, tmp_path):  # released on close
        pass


async def test_changed_version_never_serves_old_bytes(tmp_path: Path) -> None:
    root = tmp_path / "origin"
    root.mkdir()
    old, new = blob(1 * MiB, seed=3), blob(1 * MiB, seed=4)
    (root / "f").write_bytes(old)
    po = PosixOrigin(str(root))
    v1 = ref(po, "f")
    async with cached(po, tmp_path / "cache") as rp:
        assert await read_all(rp, v1) == old
        keep = rp.open(v1)
        part = rp.open(v1)
        # the file changes at the origin (same size, same path)
        src = tmp_path / "new"
        src.write_bytes(new)
        po.put("f", str(src))
        v2 = ref(po, "f")
        assert v2.version != v1.version and v2.size == v1.size
        assert await read_all(rp, v2) == new
        assert await keep.read(0, 1 * MiB) == old  # cached bytes of v1 are still v1's
        keep.close()
        part.close()
    # an uncached read of a version the origin no longer has is an error, never a mix
    async with cached(po, tmp_path / "cache2") as rp:
        r = rp.open(v1)
        with pytest.raises(Conflict):
            await r.read(0, 4096)
        r.close()
        with pytest.raises(Conflict):
            await rp.warm(v1)


async def test_corrupt_block_is_refetched_not_served(tmp_path: Path) -> None:
    mo = MemoryOrigin()
    data = blob(1 * MiB, seed=5)
    mo.put_bytes("f", data)
    obj = ref(mo, "f")
    async with cached(mo, tmp_path) as rp:
        assert await rp.warm(obj) == obj.size
    (path,) = data_files(tmp_path)
    victim = 5 * 64 * KiB + 1000  # in block 5
    with open(path, "r+b") as f:
        f.seek(victim)
        byte = f.read(1)
        f.seek(victim)
        f.write(bytes([byte[0] ^ 0xFF]))
    before = mo.bytes_read
    async with cached(mo, tmp_path) as rp:
        r = rp.open(obj)
        assert await r.read(victim - 10, 100) == data[victim - 10 : victim + 90]
        assert rp.statistics().corrupt_blocks == 1
        assert mo.bytes_read - before == 64 * KiB  # just that block, from the origin
        assert await r.read(0, obj.size) == data
        r.close()
        assert rp.statistics().corrupt_blocks == 1
    assert mo.bytes_read - before == 64 * KiB
    with open(path, "rb") as f:  # the refetch repaired the cache file
        f.seek(victim)
        assert f.read(1) == byte


async def test_missing_cache_file_is_refetched(tmp_path: Path) -> None:
    mo = MemoryOrigin()
    data = blob(300 * KiB, seed=6)
    mo.put_bytes("f", data)
    obj = ref(mo, "f")
    async with cached(mo, tmp_path) as rp:
        await rp.warm(obj)
    for p in data_files(tmp_path):
        os.unlink(p)
    async with cached(mo, tmp_path) as rp:
        assert await read_all(rp, obj) == data
        assert rp.statistics().corrupt_blocks == 0
    assert mo.bytes_read == 2 * obj.size


# -- eviction ------------------------------------------------------------------------------


async def test_eviction_keeps_within_limit_lru(tmp_path: Path) -> None:
    mo = MemoryOrigin()
    files = {f"f{i}": blob(256 * KiB, seed=10 + i) for i in range(8)}
    for name, data in files.items():
        mo.put_bytes(name, data)
    limit = 1 * MiB
    async with cached(mo, tmp_path, cache_size=limit) as rp:
        for name, data in files.items():
            assert await read_all(rp, ref(mo, name)) == data
            assert rp.statistics().cache_bytes_used <= limit
        st = rp.statistics()
        assert st.evictions >= 4 and st.evicted_bytes >= 4 * 256 * KiB
        # the most recent file is cached; the oldest is not
        before = mo.bytes_read
        assert await read_all(rp, ref(mo, "f7")) == files["f7"]
        assert mo.bytes_read == before
        assert await read_all(rp, ref(mo, "f0")) == files["f0"]
        assert mo.bytes_read == before + 256 * KiB
        await trio.sleep(0.05)  # let background deletions run
        await rp.flush()
        on_disk = sum(os.stat(p).st_blocks * 512 for p in data_files(tmp_path))
        assert on_disk <= limit
    # after a restart the limit still holds (and is enforced at start with a smaller one)
    async with cached(mo, tmp_path, cache_size=300 * KiB) as rp:
        assert rp.statistics().cache_bytes_used <= 300 * KiB


async def test_open_reader_blocks_are_not_evicted(tmp_path: Path) -> None:
    mo = MemoryOrigin()
    files = {f"f{i}": blob(256 * KiB, seed=20 + i) for i in range(6)}
    for name, data in files.items():
        mo.put_bytes(name, data)
    async with cached(mo, tmp_path, cache_size=768 * KiB) as rp:
        a = ref(mo, "f0")
        reader = rp.open(a)
        assert await reader.read(0, a.size) == files["f0"]
        # f0 is now the least recently used object, and the cache holds 3 files: reading 5
        # more forces evictions — of everything but the open reader's file
        for name in list(files)[1:]:
            assert await read_all(rp, ref(mo, name)) == files[name]
        assert rp.statistics().evictions >= 3
        before = mo.bytes_read
        assert await reader.read(0, a.size) == files["f0"]
        assert mo.bytes_read == before
        reader.close()


async def test_stream_larger_than_cache(tmp_path: Path) -> None:
    """A file 4x the cache streams through it: blocks behind the reader make room, the
    reader's own window is never evicted, the limit holds."""
    mo = MemoryOrigin()
    data = blob(4 * MiB, seed=7)
    mo.put_bytes("big", data)
    obj = ref(mo, "big")
    async with cached(
        mo, tmp_path, cache_size=1 * MiB, max_window=256 * KiB, part_size=128 * KiB,
        seek_tolerance=128 * KiB,
    ) as rp:  # fmt: skip
        r = rp.open(obj)
        out = []
        for off in range(0, obj.size, 64 * KiB):
            out.append(await r.read(off, 64 * KiB))
            assert rp.statistics().cache_bytes_used <= 1 * MiB
        r.close()
        assert b"".join(out) == data
        st = rp.statistics()
        assert st.evictions > 0
        assert mo.bytes_read <= obj.size + 512 * KiB  # hardly anything fetched twice


# -- prefetch ------------------------------------------------------------------------------


async def test_sequential_read_issues_growing_parallel_fetches(tmp_path: Path) -> None:
    mo = MemoryOrigin()
    data = blob(24 * MiB, seed=8)
    mo.put_bytes("f", data)
    rec = Recording(LatencyOrigin(mo, latency_s=0.01))
    obj = ref(mo, "f")
    async with cached(
        rec, tmp_path, block_size=128 * KiB, checksum_chunk=32 * KiB, initial_window=128 * KiB,
        max_window=4 * MiB, part_size=512 * KiB,
    ) as rp:  # fmt: skip
        r = rp.open(obj)
        for off in range(0, obj.size, 128 * KiB):
            assert await r.read(off, 128 * KiB) == data[off : off + 128 * KiB]
        st = rp.statistics()
        assert st.prefetch_window_current == 4 * MiB == st.prefetch_window_max
        r.close()
    sizes = [size for _, _, size in rec.ranges]
    assert sizes[0] == 128 * KiB  # the first fetch is small: one block
    assert max(sizes) == 512 * KiB  # later ones are whole parts
    assert sum(sizes) == obj.size  # nothing fetched twice
    assert len(sizes) < obj.size // (128 * KiB) // 3  # parts, not block by block
    assert rec.max_running >= 4  # parts of a window are fetched in parallel
    assert st.prefetch_bytes >= obj.size - 1 * MiB
    assert st.prefetch_hits > 100
    # the window grew: the bytes requested ahead per prefetch trigger increase
    offsets = sorted(off for _, off, _ in rec.ranges)
    assert offsets == sorted(set(offsets))


async def test_random_reads_fetch_only_needed_blocks(tmp_path: Path) -> None:
    mo = MemoryOrigin()
    data = blob(8 * MiB, seed=9)
    mo.put_bytes("f", data)
    obj = ref(mo, "f")
    rng = random.Random(3)
    offsets = rng.sample(range(1, 8 * MiB - 4096, 97), 40)
    async with cached(mo, tmp_path) as rp:
        r = rp.open(obj)
        for off in offsets:
            assert await r.read(off, 4096) == data[off : off + 4096]
        r.close()
        st = rp.statistics()
    blocks = {
        b for off in offsets for b in range(off // (64 * KiB), (off + 4095) // (64 * KiB) + 1)
    }
    assert mo.bytes_read == len(blocks) * 64 * KiB
    assert st.prefetch_bytes == 0


async def test_two_readers_of_one_file_keep_their_own_streams(tmp_path: Path) -> None:
    mo = MemoryOrigin()
    data = blob(16 * MiB, seed=11)
    mo.put_bytes("f", data)
    obj = ref(mo, "f")
    async with cached(mo, tmp_path, max_window=2 * MiB, part_size=256 * KiB) as rp:
        a, b = rp.open(obj), rp.open(obj)
        pa, pb = 0, 8 * MiB
        for _ in range(80):  # interleaved, each one sequential (past min_run) in its region
            assert await a.read(pa, 64 * KiB) == data[pa : pa + 64 * KiB]
            assert await b.read(pb, 64 * KiB) == data[pb : pb + 64 * KiB]
            pa += 64 * KiB
            pb += 64 * KiB
        assert a.stream.sequential and b.stream.sequential
        assert a.stream.resets == 0 and b.stream.resets == 0
        assert a.stream.window > 64 * KiB and b.stream.window > 64 * KiB
        a.close()
        b.close()


async def test_concurrent_readers_single_flight(tmp_path: Path) -> None:
    mo = MemoryOrigin()
    data = blob(4 * MiB, seed=12)
    mo.put_bytes("f", data)
    obj = ref(mo, "f")
    results: dict[int, bytes] = {}
    async with cached(LatencyOrigin(mo, latency_s=0.005), tmp_path) as rp:

        async def reader(i: int) -> None:
            results[i] = await read_all(rp, obj, step=(32 + 16 * i) * KiB)

        async with trio.open_nursery() as n:
            for i in range(8):
                n.start_soon(reader, i)
        rng = random.Random(4)

        async def random_reader() -> None:
            r = rp.open(obj)
            for _ in range(50):
                off = rng.randrange(obj.size)
                assert await r.read(off, 10000) == data[off : off + 10000]
            r.close()

        async with trio.open_nursery() as n:
            for _ in range(4):
                n.start_soon(random_reader)
    assert all(v == data for v in results.values()) and len(results) == 8
    assert mo.bytes_read == obj.size  # no block fetched twice


async def test_inflight_budget_bounds_prefetch(tmp_path: Path) -> None:
    mo = MemoryOrigin()
    data = blob(16 * MiB, seed=13)
    mo.put_bytes("f", data)
    obj = ref(mo, "f")
    async with cached(
        LatencyOrigin(mo, latency_s=0.005), tmp_path, max_window=8 * MiB, part_size=256 * KiB,
        inflight_budget=512 * KiB,
    ) as rp:  # fmt: skip
        assert await read_all(rp, obj, step=256 * KiB) == data
        st = rp.statistics()
    # prefetch never goes over the budget; demand fetches (one read's blocks) come on top
    assert st.inflight_peak_bytes <= 512 * KiB + 256 * KiB
    assert st.inflight_bytes == 0


async def test_far_jump_abandons_queued_prefetch(tmp_path: Path) -> None:
    mo = MemoryOrigin()
    data = blob(32 * MiB, seed=14)
    mo.put_bytes("f", data)
    obj = ref(mo, "f")
    async with cached(
        LatencyOrigin(mo, latency_s=0.02), tmp_path, max_window=16 * MiB, part_size=64 * KiB,
        inflight_budget=128 * KiB, initial_window=8 * MiB,
    ) as rp:  # fmt: skip
        r = rp.open(obj)
        assert await r.read(0, 64 * KiB) == data[: 64 * KiB]  # starts a large prefetch
        assert await r.read(30 * MiB, 100) == data[30 * MiB : 30 * MiB + 100]  # far jump
        await trio.sleep(0.1)
        st = rp.statistics()
        assert st.prefetch_resets == 1
        assert st.prefetch_abandoned > 0
        r.close()
    assert mo.bytes_read < 4 * MiB


# -- warm and adopt ------------------------------------------------------------------------


async def test_warm_fills_cache(tmp_path: Path) -> None:
    mo = MemoryOrigin()
    data = blob(5 * MiB + 1, seed=15)
    mo.put_bytes("f", data)
    obj = ref(mo, "f")
    rec = Recording(mo)
    async with cached(rec, tmp_path, part_size=1 * MiB) as rp:
        assert await rp.warm(obj) == obj.size
        assert len(rec.ranges) == 6  # parts of part_size
        assert await rp.warm(obj) == 0
        before = mo.bytes_read
        assert await read_all(rp, obj) == data
        assert mo.bytes_read == before
        st = rp.statistics()
        assert st.cache_bytes_used == obj.size and st.warm_bytes == obj.size


async def test_warm_many_small_files_batches_index_writes(tmp_path: Path) -> None:
    root = tmp_path / "origin"
    root.mkdir()
    files = {f"s{i:03d}": blob(150 * KiB, seed=100 + i) for i in range(200)}
    for name, data in files.items():
        (root / name).write_bytes(data)
    rec = Recording(PosixOrigin(str(root)))
    objs = [ref(rec, name) for name in files]
    fetched: list[int] = []
    async with cached(rec, tmp_path / "cache", block_size=1 * MiB, checksum_chunk=128 * KiB) as rp:

        async def one(o: ObjectRef) -> None:
            fetched.append(await rp.warm(o))

        async with trio.open_nursery() as n:
            for o in objs:
                n.start_soon(one, o)
        assert fetched == [150 * KiB] * 200
        assert len(rec.ranges) == 200  # one range read per small file
        await rp.flush()
        assert rp.statistics().index_flushes <= 3  # batched, not one per file
    async with cached(rec, tmp_path / "cache", block_size=1 * MiB, checksum_chunk=128 * KiB) as rp:
        for o in objs[:20]:
            assert await read_all(rp, o) == files[o.path]
        assert sum([await rp.warm(o) for o in objs]) == 0
    assert len(rec.ranges) == 200


async def test_adopt_local_file(tmp_path: Path) -> None:
    mo = MemoryOrigin()
    data = blob(700 * KiB, seed=16)
    entry = mo.put_bytes("w", data)
    obj = ObjectRef("w", entry.version, entry.size)
    local = tmp_path / "staging"
    local.write_bytes(data)
    async with cached(mo, tmp_path / "cache") as rp:
        assert await rp.adopt(obj, str(local))
        local.unlink()  # the caller may drop its file at once
        assert await read_all(rp, obj) == data
        assert rp.statistics().adopted_bytes == obj.size
        assert await rp.warm(obj) == 0
        wrong = tmp_path / "wrong"
        wrong.write_bytes(b"short")
        other = ObjectRef("x", "v9", 10)
        with pytest.raises(ValueError):
            await rp.adopt(other, str(wrong))
    assert mo.calls["read_range"] == 0
    async with cached(mo, tmp_path / "cache") as rp:  # persisted like fetched data
        assert await read_all(rp, obj) == data
    assert mo.calls["read_range"] == 0


async def test_adopt_refused_when_cache_too_small(tmp_path: Path) -> None:
    mo = MemoryOrigin()
    data = blob(2 * MiB, seed=17)
    entry = mo.put_bytes("w", data)
    obj = ObjectRef("w", entry.version, entry.size)
    local = tmp_path / "staging"
    local.write_bytes(data)
    async with cached(mo, tmp_path / "cache", cache_size=1 * MiB) as rp:
        assert not await rp.adopt(obj, str(local))
        assert rp.statistics().cache_bytes_used == 0
        assert await read_all(rp, obj) == data  # still readable, fetched and streamed


# -- lifecycle -----------------------------------------------------------------------------


async def test_statistics_record_and_closed_use(tmp_path: Path) -> None:
    """statistics() is a frozen record whose numbers follow what happened; to_dict() is what
    ``airfs status`` prints (JSON-ready, kind first)."""
    mo = MemoryOrigin()
    mo.put_bytes("f", b"abc")
    obj = ref(mo, "f")
    async with cached(mo, tmp_path, cache_size=1 * MiB) as rp:
        empty = rp.statistics()
        assert await read_all(rp, obj) == b"abc"
        assert await read_all(rp, obj) == b"abc"
        st = rp.statistics()
        with pytest.raises(dataclasses.FrozenInstanceError):
            st.reads = 0  # type: ignore[misc]
        assert (empty.reads, empty.cache_bytes_used, empty.cache_objects) == (0, 0, 0)
        assert st.reads == 2 and st.origin_requests == 1 and st.origin_bytes_read == 3
        assert st.miss_bytes == 3 and st.hit_bytes == 3  # first read fetched, second hit
        assert st.cache_bytes_used == 3 and st.cache_objects == 1
        assert st.cache_bytes_limit == 1 * MiB and st.block_size == SMALL["block_size"]
        assert st.readers_open == 0 and st.inflight_bytes == 0
        d = st.to_dict()
        assert next(iter(d)) == "kind" and d["kind"] == "cached"
        assert set(d) == {f.name for f in dataclasses.fields(st)}
        assert json.loads(json.dumps(d)) == d
        assert d["hit_bytes"] == 3 and d["cache_dir"] == str(tmp_path)
    with pytest.raises(RuntimeError):
        rp.open(obj)


async def test_create_in_caller_nursery(tmp_path: Path) -> None:
    mo = MemoryOrigin()
    mo.put_bytes("f", b"x" * 1000)
    obj = ref(mo, "f")
    async with trio.open_nursery() as nursery:
        rp = await CachedReadPath.create(
            nursery, AsyncOrigin(mo), str(tmp_path), cache_size=1 * MiB, **SMALL
        )
        assert await read_all(rp, obj) == b"x" * 1000
        await rp.aclose()
    # cancelling the owner's nursery also closes it cleanly
    with trio.move_on_after(5):
        async with trio.open_nursery() as nursery:
            rp = await CachedReadPath.create(
                nursery, AsyncOrigin(mo), str(tmp_path), cache_size=1 * MiB, **SMALL
            )
            assert await read_all(rp, obj) == b"x" * 1000
            nursery.cancel_scope.cancel()
    async with cached(mo, tmp_path) as rp:
        assert await read_all(rp, obj) == b"x" * 1000
    assert mo.calls["read_range"] == 1


async def test_damaged_index_is_refused_with_its_path_and_set_aside(tmp_path: Path) -> None:
    mo = MemoryOrigin()
    mo.put_bytes("f", blob(200 * KiB))
    async with cached(mo, tmp_path) as rp:
        await read_all(rp, ref(mo, "f"))
    data_mdb = tmp_path / "index" / "data.mdb"
    good = data_mdb.read_bytes()
    assert check_lmdb_file(str(data_mdb)) is None
    # truncated below the pages its meta names: LMDB would SIGBUS on it, so it is never opened
    data_mdb.write_bytes(good[: 2 * 4096])
    assert "truncated" in (check_lmdb_file(str(data_mdb)) or "")
    with pytest.raises(CacheDamaged, match="truncated") as info:
        async with cached(mo, tmp_path):
            pass
    assert info.value.path == str(tmp_path / "index")
    data_mdb.write_bytes(b"\0" * 100 + good[100:])
    with pytest.raises(CacheDamaged, match="not an LMDB file"):
        async with cached(mo, tmp_path):
            pass
    # the lock was released on the way out: set the index aside and start empty
    moved = set_aside(str(tmp_path / "index"))
    assert moved is not None and os.path.basename(moved).startswith("index.damaged-")
    assert set_aside(str(tmp_path / "index")) is None
    async with cached(mo, tmp_path) as rp:
        assert await read_all(rp, ref(mo, "f")) == blob(200 * KiB)
        assert rp.statistics().origin_bytes_read == 200 * KiB


async def test_a_cache_fetch_backing_off_holds_no_origin_slot(tmp_path: Path) -> None:
    """Issue 11's one retry policy: a block-cache fetch whose origin read fails transiently
    waits for its retry on the trio loop, outside the origin's limiter (it used to sleep in
    its worker thread, so an outage filled every origin slot with sleeping fetches). With a
    single slot, a stat sent while the fetch keeps failing gets the slot: it completes, and
    only then can the read succeed."""
    mem = MemoryOrigin()
    mem.put_bytes("f", b"x" * 100_000)
    mem.put_bytes("g", b"g")
    faulty = FaultyOrigin(mem)
    ao = AsyncOrigin(faulty, concurrency=1, attempts=6, base_delay=0.5, max_delay=0.5)  # type: ignore[arg-type]
    e = mem.stat("f")
    order: list[str] = []
    failures = [0]

    def flaky() -> Transient:
        failures[0] += 1
        return Transient("origin unreachable (test)")

    async with CachedReadPath.running(ao, str(tmp_path / "c"), cache_size=1 << 30) as rp:
        faulty.fail["read_range"] = flaky
        r = rp.open(ObjectRef("f", e.version, e.size))

        async def read() -> None:
            assert await r.read(0, 4096) == b"x" * 4096
            order.append("read")

        async with trio.open_nursery() as n:
            n.start_soon(read)
            with trio.fail_after(10):
                while failures[0] == 0:  # the fetch failed and is backing off
                    await trio.sleep(0.005)
            assert (await ao.stat("g")).size == 1
            order.append("stat")
            faulty.fail.pop("read_range")
        r.close()
    assert order == ["stat", "read"]
    assert ao.statistics().retries["read"] >= 1
