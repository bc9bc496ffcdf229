"""The first pass of a restarted job (issue 22): many lookups and opens of cached files at
once, after a restart, cost one worker-thread round trip per *batch*: the origin stats asked
while one job runs go together in the next (:meth:`AsyncOrigin.stat_joined`), and so do the
block maps loaded from the cache index (:meth:`IndexKeeper.ensure_loaded`). Each answer is
the one asking alone would get: entries, absent names, errors."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
import trio

from airfs.cache import CachedReadPath
from airfs.core.inodes import ROOT_INO
from airfs.core.readpath import ReadPath
from airfs.daemon.build import build
from airfs.origin.aio import AsyncOrigin
from airfs.origin.base import Entry, NotFound, PermissionDenied
from airfs.origin.posix import PosixOrigin
from airfs.testing.inline import inline
from airfs.testing.memory import MemoryOrigin

N = 48


class Denying(MemoryOrigin):
    """A memory origin that refuses to say anything of ``d/denied``."""

    def stat(self, path: str) -> Entry:
        if path == "d/denied":
            raise PermissionDenied(f"{path}: no")
        return super().stat(path)


async def test_concurrent_stats_share_jobs_and_keep_their_own_answers() -> None:
    mem = Denying()
    mem.mkdir("d")
    for i in range(N):
        mem.put_bytes(f"d/f{i}", b"x" * i)
    a = AsyncOrigin(mem, attempts=1)
    got: dict[str, object] = {}

    async def one(path: str) -> None:
        try:
            got[path] = (await a.stat_joined(path)).size
        except (NotFound, PermissionDenied) as exc:
            got[path] = (type(exc), exc.errno)  # the errno the filesystem replies with

    async with trio.open_nursery() as nursery:
        for i in range(N):
            nursery.start_soon(one, f"d/f{i}")
        nursery.start_soon(one, "d/missing")
        nursery.start_soon(one, "d/denied")
    assert got == {
        **{f"d/f{i}": i for i in range(N)},
        "d/missing": (NotFound, errno.ENOENT),
        "d/denied": (PermissionDenied, errno.EACCES),
    }
    assert a.joined_jobs < N // 4, a.joined_jobs  # not one job each
    assert a.statistics().calls["stat"] == N + 2  # counted per path, as alone


async def test_a_restarted_core_opens_many_cached_files_in_few_jobs(tmp_path: Path) -> None:
    d = tmp_path / "origin"
    (d / "imgs").mkdir(parents=True)
    for i in range(N):
        (d / "imgs" / f"{i:03d}").write_bytes(bytes([i]) * (1000 + i))
    origin = PosixOrigin(str(d))

    async def cached(o: AsyncOrigin, nursery: trio.Nursery) -> ReadPath:
        return await CachedReadPath.create(nursery, o, str(tmp_path / "blocks"), cache_size=1 << 30)

    async def read_all(b, ino: int) -> bytes:  # type: ignore[no-untyped-def]
        fh, _ = await b.fs.open(ino, os.O_RDONLY)
        try:
            return await b.fs.read(fh, 0, 1 << 20)
        finally:
            await b.fs.release(fh)

    try:
        args = dict(ttl=60.0, staging_size=1 << 30, readpath=cached)
        async with build(origin, str(tmp_path / "cache"), **args) as b:  # fill the cache
            imgs = (await b.fs.lookup(ROOT_INO, "imgs")).ino
            for i in range(N):
                await read_all(b, (await b.fs.lookup(imgs, f"{i:03d}")).ino)
        async with build(origin, str(tmp_path / "cache"), **args) as b:  # the restart
            imgs = (await b.fs.lookup(ROOT_INO, "imgs")).ino
            jobs0 = b.origin.joined_jobs
            out: dict[int, bytes] = {}

            async def job(i: int) -> None:
                out[i] = await read_all(b, (await b.fs.lookup(imgs, f"{i:03d}")).ino)

            async with trio.open_nursery() as nursery:
                for i in range(N):
                    nursery.start_soon(job, i)
            assert out == {i: bytes([i]) * (1000 + i) for i in range(N)}
            st = b.readpath.statistics()
            assert st.miss_bytes == 0  # every byte from the cache
            assert st.index_map_loads < N // 4, st
            assert b.origin.joined_jobs - jobs0 < N // 4
    finally:
        origin.close()


async def test_a_lone_stat_is_one_job() -> None:
    mem = MemoryOrigin()
    mem.put_bytes("f", b"abc")
    a = AsyncOrigin(mem)
    assert (await a.stat_joined("f")).size == 3
    with pytest.raises(NotFound):
        await a.stat_joined("g")
    assert a.joined_jobs == 2


async def test_a_listed_directory_of_cached_files_opens_inline_after_a_restart(
    tmp_path: Path,
) -> None:
    """Listing a directory hints the cache (``ReadPath.expect``): the block maps of its
    cached files load in the background, and their first opens after a restart are answered
    inline (the fast open: no lock, no thread) instead of each waiting for its map."""
    d = tmp_path / "origin"
    (d / "imgs").mkdir(parents=True)
    for i in range(N):
        (d / "imgs" / f"{i:03d}").write_bytes(bytes([i]) * 999)
    origin = PosixOrigin(str(d))

    async def cached(o: AsyncOrigin, nursery: trio.Nursery) -> ReadPath:
        return await CachedReadPath.create(nursery, o, str(tmp_path / "blocks"), cache_size=1 << 30)

    try:
        args = dict(ttl=60.0, staging_size=1 << 30, readpath=cached)
        async with build(origin, str(tmp_path / "cache"), **args) as b:  # fill the cache
            imgs = (await b.fs.lookup(ROOT_INO, "imgs")).ino
            for i in range(N):
                fh, _ = await b.fs.open((await b.fs.lookup(imgs, f"{i:03d}")).ino, os.O_RDONLY)
                # as the kernel transport does: the cache file verified for passthrough
                assert await b.fs.passthrough_source(fh) is not None
                await b.fs.release(fh)
        async with build(origin, str(tmp_path / "cache"), **args) as b:  # the restart
            imgs = (await b.fs.lookup(ROOT_INO, "imgs")).ino
            b.fs.releasedir(await b.fs.opendir(imgs))  # a listing (os.listdir, a DataLoader)
            with trio.fail_after(10):
                while b.readpath.statistics().index_map_loads == 0:
                    await trio.sleep(0.01)
                await trio.sleep(0.05)
            for i in range(N):
                ino = (await b.fs.lookup(imgs, f"{i:03d}")).ino
                fh, _ = inline(b.fs.open(ino, os.O_RDONLY))
                assert await b.fs.read(fh, 0, 4096) == bytes([i]) * 999
                await b.fs.release(fh)
            assert b.readpath.statistics().index_map_loads == 1  # all in one job
    finally:
        origin.close()
