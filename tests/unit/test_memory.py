"""What the daemon keeps in memory per file must go when the file goes (issue 11, "Memory").

A core built by :func:`airfs.daemon.build.build` over a POSIX origin with the real block cache
(:class:`~airfs.cache.CachedReadPath`), driven without a kernel. A committed file is adopted
into the cache (its object stays in the cache's table); the tests check that unlinking it,
renaming it away or committing a new version takes the stale versions out of the table (and
their cache files off the disk), and that a file unlinked while open keeps being readable until
its last close, after which it is gone too.
"""

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

W = os.O_WRONLY | os.O_CREAT


@asynccontextmanager
async def core(tmp_path: Path) -> AsyncIterator[Built]:
    (tmp_path / "origin").mkdir(exist_ok=True)
    origin = PosixOrigin(str(tmp_path / "origin"))

    async def cached(o: AsyncOrigin, nursery: trio.Nursery) -> ReadPath:
        return await CachedReadPath.create(nursery, o, str(tmp_path / "blocks"), cache_size=1 << 30)

    try:
        async with build(origin, str(tmp_path / "cache"), ttl=0.05, readpath=cached) as b:
            yield b
    finally:
        origin.close()


def objects(b: Built) -> int:
    return int(b.readpath.statistics().to_dict()["cache_objects"])


def cache_files(tmp_path: Path) -> int:
    return sum(len(files) for _, _, files in os.walk(tmp_path / "blocks" / "data"))


async def settle(b: Built) -> None:
    """Every write is committed and every commit's bookkeeping (the adopt into the cache,
    which runs after ``flush`` returns) is done."""
    await b.uploader.flush("")
    with trio.fail_after(30):
        while b.uploader.active:
            await trio.sleep(0.01)


async def write_file(b: Built, parent: int, name: str, data: bytes) -> None:
    fh, _ = await b.fs.create(parent, name, 0o644, W)
    await b.fs.write(fh, 0, data)
    await b.fs.release(fh)


async def rewrite_file(b: Built, parent: int, name: str, data: bytes) -> None:
    """What the kernel does for ``open(O_WRONLY|O_TRUNC)`` of an existing file."""
    attr = await b.fs.lookup(parent, name)
    fh, _ = await b.fs.open(attr.ino, os.O_WRONLY | os.O_TRUNC)
    await b.fs.write(fh, 0, data)
    await b.fs.release(fh)


async def make_tree(b: Built, n: int) -> int:
    d = (await b.fs.mkdir(ROOT_INO, "tree", 0o755)).ino
    for i in range(n):
        await write_file(b, d, f"f{i:03d}", b"x" * (1000 + i))
    await settle(b)
    return d


def test_unlinked_files_leave_the_cache_table(tmp_path: Path) -> None:
    async def main() -> None:
        async with core(tmp_path) as b:
            before = objects(b)
            d = await make_tree(b, 40)
            assert objects(b) == before + 40  # adopted at commit
            for i in range(40):
                await b.fs.unlink(d, f"f{i:03d}")
            await b.fs.rmdir(ROOT_INO, "tree")
            await settle(b)
            assert objects(b) == before
            await b.readpath.aclose()
        assert cache_files(tmp_path) == 0

    trio.run(main)


def test_rounds_of_create_and_delete_do_not_grow_the_table(tmp_path: Path) -> None:
    async def main() -> None:
        async with core(tmp_path) as b:
            sizes = []
            for _ in range(3):
                d = await make_tree(b, 20)
                for i in range(20):
                    await b.fs.unlink(d, f"f{i:03d}")
                await b.fs.rmdir(ROOT_INO, "tree")
                await settle(b)
                sizes.append(objects(b))
            assert sizes == [0, 0, 0]

    trio.run(main)


def test_a_new_version_replaces_the_old_one_in_the_table(tmp_path: Path) -> None:
    async def main() -> None:
        async with core(tmp_path) as b:
            await write_file(b, ROOT_INO, "f", b"one" * 100)
            await settle(b)
            assert objects(b) == 1
            for k in range(3):
                await rewrite_file(b, ROOT_INO, "f", b"two%d" % k * 100)
                await settle(b)
                assert objects(b) == 1

    trio.run(main)


def test_rename_forgets_the_old_name(tmp_path: Path) -> None:
    async def main() -> None:
        async with core(tmp_path) as b:
            await write_file(b, ROOT_INO, "a", b"a" * 5000)
            await write_file(b, ROOT_INO, "b", b"b" * 6000)
            await settle(b)
            assert objects(b) == 2
            await b.fs.rename(ROOT_INO, "a", ROOT_INO, "b")  # replaces b; a's name is gone
            assert objects(b) == 0  # both old names are gone; b is cached again when read
            attr = await b.fs.lookup(ROOT_INO, "b")
            fh, _ = await b.fs.open(attr.ino, os.O_RDONLY)
            assert await b.fs.read(fh, 0, 10000) == b"a" * 5000
            await b.fs.release(fh)

    trio.run(main)


def test_unlinked_while_open_stays_readable_then_goes(tmp_path: Path) -> None:
    async def main() -> None:
        async with core(tmp_path) as b:
            data = os.urandom(300_000)
            await write_file(b, ROOT_INO, "f", data)
            await settle(b)
            attr = await b.fs.lookup(ROOT_INO, "f")
            fh, _ = await b.fs.open(attr.ino, os.O_RDONLY)
            assert await b.fs.read(fh, 0, 1000) == data[:1000]
            await b.fs.unlink(ROOT_INO, "f")
            assert await b.fs.read(fh, 1000, len(data)) == data[1000:]
            await b.fs.release(fh)
            assert objects(b) == 0

    trio.run(main)
