"""Random reads of a cold file through a real mount pull what they need from the origin,
counted by the daemon (``origin_bytes_read`` of ``airfs status --json``), not timed.

What used to pull the rest: Python's ``open`` reads a whole ``st_blksize`` buffer after each
``seek`` (it was 1 MiB for every file), and the kernel cuts such a read into contiguous
128 KiB READs, which the stream detector took for a sequential reader (1-2 MiB of prefetch
per read): 64 random 4 KiB reads of a 192 MiB file pulled 113-144 MiB.
"""

from __future__ import annotations

import os
import random
from typing import Any

import pytest

from airfs.core.attrs import ORIGIN_BLKSIZE
from airfs.testing.fixtures import Volume

pytestmark = pytest.mark.mount

MiB = 1 << 20
SIZE = 192 * MiB
PAGE = 4096


def cache_stats(v: Volume) -> dict[str, Any]:
    return v.m.status()["cache"]


def cold_file(v: Volume, offsets: list[int], span: int) -> dict[int, bytes]:
    """A 192 MiB file at the origin (sparse, with random bytes where the reads land);
    returns the bytes expected at each offset."""
    src = v.tmp / "big-src.bin"
    rng = random.Random(5)
    want = {}
    with open(src, "wb") as f:
        f.truncate(SIZE)
        for off in offsets:
            data = rng.randbytes(span)
            f.seek(off)
            f.write(data)
    with open(src, "rb") as f:
        for off in offsets:
            f.seek(off)
            want[off] = f.read(span)
    v.origin_move("big.bin", src)
    return want


def spread(n: int, span: int, seed: int) -> list[int]:
    """``n`` random offsets in shuffled order, one in each of ``n`` equal slots of the file
    and at least a slot's half apart: no two reads are neighbours, so the kernel's own
    readahead (which widens a read that follows cached pages) never joins in."""
    rng = random.Random(seed)
    slot = SIZE // n
    offsets = [i * slot + rng.randrange(0, slot // 2 - span) for i in range(n)]
    rng.shuffle(offsets)
    return offsets


def blocks_touched(offsets: list[int], length: int, bs: int) -> int:
    """The cache blocks covered by reads of ``length`` bytes at ``offsets``, widened to whole
    pages (what the kernel asks for)."""
    blocks: set[int] = set()
    for off in offsets:
        lo = off // PAGE * PAGE
        hi = min(SIZE, -(-(off + length) // PAGE) * PAGE)
        blocks.update(range(lo // bs, (hi - 1) // bs + 1))
    return len(blocks)


def test_64_random_4k_reads_with_default_buffering_pull_about_a_block_each(
    volume: Volume,
) -> None:
    offsets = spread(64, PAGE, 11)
    want = cold_file(volume, offsets, PAGE)
    with open(volume.root / "big.bin", "rb") as f:  # Python's default buffering
        assert os.fstat(f.fileno()).st_blksize == ORIGIN_BLKSIZE
        for off in offsets:
            f.seek(off)
            assert f.read(PAGE) == want[off]
    s = cache_stats(volume)
    bs = s["block_size"]
    # each read's buffer (st_blksize, plus a page) touches one or two blocks, nothing more
    assert s["origin_bytes_read"] <= blocks_touched(offsets, ORIGIN_BLKSIZE + PAGE, bs) * bs, s
    assert s["origin_bytes_read"] <= 20 * MiB, s  # it was 113-144 MiB
    assert s["prefetch_bytes"] == 0, s


def test_random_1mib_reads_are_not_taken_for_a_stream(volume: Volume) -> None:
    """A 1 MiB read at a random offset arrives as contiguous READs (the kernel cuts it up and
    may add a readahead window): it pulls the blocks the kernel asked for and no prefetch
    (each such read started a stream, prefetching 1-2 MiB more)."""
    offsets = spread(32, MiB, 12)
    want = cold_file(volume, offsets, MiB)
    with open(volume.root / "big.bin", "rb", buffering=0) as f:
        for off in offsets:
            f.seek(off)
            assert f.read(MiB) == want[off]
    s = cache_stats(volume)
    bs = s["block_size"]
    assert s["prefetch_bytes"] == 0, s
    asked = s["hit_bytes"] + s["miss_bytes"]  # what the kernel's READs asked for
    assert s["origin_bytes_read"] <= asked + 2 * bs * s["reads"], s  # rounded to blocks
