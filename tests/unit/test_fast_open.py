"""The fast open (issue 22, item 1): a read-only open of a file whose version is fresh and
complete and verified in the block cache is answered inline (its coroutine ends without
yielding to trio: no lock wait, no thread, no origin pin), and its release too; a version
older than the TTL allows is never served that way. Over a POSIX origin (one that pins)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import trio

from airfs.cache import CachedReadPath
from airfs.core.inodes import ROOT_INO
from airfs.core.readpath import ReadPath
from airfs.daemon.build import Built, build
from airfs.origin.aio import AsyncOrigin
from airfs.origin.posix import PosixOrigin
from airfs.testing.inline import inline

R = os.O_RDONLY


@asynccontextmanager
async def core(tmp_path: Path, ttl: float) -> AsyncIterator[tuple[Built, Path]]:
    d = tmp_path / "origin"
    d.mkdir()
    origin = PosixOrigin(str(d))

    async def cached(o: AsyncOrigin, nursery: trio.Nursery) -> ReadPath:
        return await CachedReadPath.create(nursery, o, str(tmp_path / "blocks"), cache_size=1 << 30)

    try:
        async with build(
            origin, str(tmp_path / "cache"), ttl=ttl, staging_size=1 << 30, readpath=cached
        ) as b:
            yield b, d
    finally:
        origin.close()


def pins(b: Built) -> int:
    return b.origin.statistics().calls.get("pin", 0)


async def read_all(b: Built, fh: int) -> bytes:
    return await b.fs.read(fh, 0, 1 << 20)


async def test_an_open_of_a_cached_fresh_file_is_answered_inline(tmp_path: Path) -> None:
    async with core(tmp_path, ttl=60) as (b, d):
        fs = b.fs
        (d / "f").write_bytes(b"hello")
        ino = (await fs.lookup(ROOT_INO, "f")).ino
        fh, _ = await fs.open(ino, R)  # the first: cached whole by passthrough's check
        first = await fs.passthrough_source(fh)
        assert first is not None
        await fs.release(fh)
        before = pins(b)
        fh, _ = inline(fs.open(ino, R))
        assert fs.statistics().fast_opens == 1
        again = inline(fs.passthrough_source(fh))
        # the same cache file (its key: the descriptor was closed at the release, and the
        # number the new one gets depends on what else the process opened meanwhile)
        assert again is not None and again[1] == first[1]
        inline(fs.release(fh))
        # daemon-served (a transport without passthrough): reads come from the cache
        fh, _ = inline(fs.open(ino, R))
        assert await read_all(b, fh) == b"hello"
        inline(fs.release(fh))
        assert pins(b) == before, "no origin pin"
        assert fs.statistics().fast_opens == 2


async def test_a_fast_open_never_serves_a_version_older_than_the_ttl(tmp_path: Path) -> None:
    async with core(tmp_path, ttl=0.3) as (b, d):
        fs = b.fs
        (d / "f").write_bytes(b"old")
        ino = (await fs.lookup(ROOT_INO, "f")).ino
        fh, _ = await fs.open(ino, R)
        assert await fs.passthrough_source(fh) is not None  # cached and verified
        await fs.release(fh)
        (d / "f.new").write_bytes(b"new bytes")
        os.replace(d / "f.new", d / "f")  # replaced at the origin
        await trio.sleep(0.35)  # the TTL passes
        fast = fs.statistics().fast_opens
        fh, keep = await fs.open(ino, R)
        assert not keep
        assert fs.statistics().fast_opens == fast, "a stale version is revalidated first"
        src = await fs.passthrough_source(fh)
        assert src is not None and os.pread(src[0], 100, 0) == b"new bytes"
        assert await read_all(b, fh) == b"new bytes"
        await fs.release(fh)
