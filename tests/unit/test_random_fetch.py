"""Fetch sizes follow the access pattern with the read path's default settings: random small
reads of an uncached file pull about one cache block each (not a prefetch part), sequential
reads grow their fetches. Origin bytes are counted by the in-memory origin."""

from __future__ import annotations

import random
from pathlib import Path

from airfs.cache import CachedReadPath
from airfs.core.readpath import ObjectRef
from airfs.origin.aio import AsyncOrigin
from airfs.testing.memory import MemoryOrigin

MiB = 1 << 20


def big_origin(size: int) -> tuple[MemoryOrigin, ObjectRef, bytes]:
    mo = MemoryOrigin()
    data = random.Random(7).randbytes(size)
    mo.put_bytes("big.bin", data)
    e = mo.stat("big.bin")
    return mo, ObjectRef("big.bin", e.version, e.size), data


async def test_64_random_4k_reads_of_192_mib_pull_one_small_block_each(tmp_path: Path) -> None:
    mo, obj, data = big_origin(192 * MiB)
    rng = random.Random(11)
    offsets = [rng.randrange(0, obj.size - 4096) for _ in range(64)]
    async with CachedReadPath.running(AsyncOrigin(mo), str(tmp_path), cache_size=1 << 30) as rp:
        bs = rp._bs
        r = rp.open(obj)
        for off in offsets:
            assert await r.read(off, 4096) == data[off : off + 4096]
        r.close()
        st = rp.statistics()
    blocks = {b for off in offsets for b in (off // bs, (off + 4095) // bs)}
    assert bs <= 256 << 10
    assert mo.bytes_read == len(blocks) * bs  # exactly the blocks touched: <= 32 MiB, not 151
    assert mo.bytes_read <= 64 * 2 * bs
    assert st.prefetch_bytes == 0


async def test_sequential_reads_fetch_in_growing_parts(tmp_path: Path) -> None:
    mo, obj, data = big_origin(64 * MiB)
    async with CachedReadPath.running(AsyncOrigin(mo), str(tmp_path), cache_size=1 << 30) as rp:
        r = rp.open(obj)
        off = 0
        while off < obj.size:
            chunk = await r.read(off, MiB)
            assert chunk == data[off : off + MiB]
            off += len(chunk)
        r.close()
        st = rp.statistics()
    assert mo.bytes_read == obj.size  # each byte once
    assert st.prefetch_bytes > obj.size // 2  # most of it ahead of the reader
    assert mo.calls["read_range"] < obj.size // rp._bs // 4  # parts much larger than a block
