"""Revalidation by directory (issue 22, items 2 and 6): after the TTL, names in a directory
are answered from one new listing of it when that is cheap for what it answers, by name
otherwise; a change at the origin is still seen within the TTL. Counted with the memory
origin's calls (``list``, ``stat``): no timed assertions (the sleeps let the TTL pass or make
a fetch slow)."""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from airfs.core.fs import Filesystem
from airfs.core.inodes import ROOT_INO
from airfs.core.listings import FIRST_LISTING_AFTER, PAGE
from airfs.daemon.build import build
from airfs.testing.memory import MemoryOrigin


class SlowList:
    """Wraps an origin; ``list`` sleeps ``delay`` seconds first (in its worker thread).
    Counts the calls about ``d`` and its names (``lists``, ``stats``): the daemon also
    looks for its catalog file now and then."""

    def __init__(self, inner: MemoryOrigin) -> None:
        self.inner = inner
        self.url = inner.url
        self.delay = self.stat_delay = 0.0
        self.lists = self.stats = 0

    def list(self, path: str) -> Any:
        time.sleep(self.delay)
        self.lists += path == "d"
        return self.inner.list(path)

    def stat(self, path: str) -> Any:
        self.stats += path.startswith("d/")
        time.sleep(self.stat_delay)
        return self.inner.stat(path)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@asynccontextmanager
async def core(
    tmp_path: Path, ttl: float, n: int = 20
) -> AsyncIterator[tuple[Filesystem, MemoryOrigin, SlowList, int]]:
    """A core over a memory origin holding ``d/f0`` .. ``d/f{n-1}``; yields it with the
    origin, its slow-listing wrapper and the inode of ``d``."""
    mem = MemoryOrigin()
    mem.mkdir("d")
    for i in range(n):
        mem.put_bytes(f"d/f{i}", b"x")
    slow = SlowList(mem)
    async with build(slow, str(tmp_path / "cache"), ttl=ttl, staging_size=1 << 30) as b:
        d = (await b.fs.lookup(ROOT_INO, "d")).ino
        yield b.fs, mem, slow, d


async def listed(fs: Filesystem, ino: int) -> None:
    fs.releasedir(await fs.opendir(ino))


async def test_one_listing_answers_a_directory_after_the_ttl_and_sees_changes(
    tmp_path: Path,
) -> None:
    async with core(tmp_path, ttl=0.2) as (fs, mem, slow, d):
        await listed(fs, d)
        for i in range(20):
            await fs.lookup(d, f"f{i}")
        mem.put_bytes("d/f3", b"changed")  # changed, added, removed at the origin
        mem.put_bytes("d/new", b"n")
        mem.delete("d/f4")
        await trio.sleep(0.25)
        lists, stats = slow.lists, slow.stats
        sizes = {i: (await fs.lookup(d, f"f{i}")).size for i in range(20) if i != 4}
        assert (await fs.lookup(d, "new")).size == 1
        with pytest.raises(FileNotFoundError):
            await fs.lookup(d, "f4")
        assert sizes[3] == len(b"changed") and sizes[0] == 1
        assert slow.lists - lists == 1, "one listing for the directory"
        assert slow.stats == stats, "no name asked by itself"
        assert fs.statistics().relists == 1


async def test_a_listing_slower_than_the_ttl_is_not_fetched_again_per_name(
    tmp_path: Path,
) -> None:
    # the hang of `ls -l` in a 100k-entry directory: each name cost a whole listing
    async with core(tmp_path, ttl=0.2) as (fs, _mem, slow, d):
        slow.delay = 0.25
        await listed(fs, d)
        await trio.sleep(0.25)
        lists, stats = slow.lists, slow.stats
        for i in range(20):
            await fs.lookup(d, f"f{i}")
        assert slow.lists == lists, "a listing that arrives stale is not fetched per name"
        assert slow.stats - stats >= 20  # by name (and some asked ahead)


async def test_lookups_waiting_for_a_listing_are_answered_by_it(tmp_path: Path) -> None:
    # a listing that expired while it was fetched still shows the origin as of its start:
    # the lookups that waited for it use it (no stat each)
    async with core(tmp_path, ttl=0.5) as (fs, _mem, slow, d):
        await listed(fs, d)  # fast: worth fetching again
        await trio.sleep(0.55)
        slow.delay = 0.8
        lists, stats = slow.lists, slow.stats
        async with trio.open_nursery() as nursery:
            for i in range(10):
                nursery.start_soon(fs.lookup, d, f"f{i}")
        assert slow.lists - lists == 1
        assert slow.stats == stats


async def test_a_hot_name_in_a_large_directory_is_asked_by_name(tmp_path: Path) -> None:
    n = PAGE + PAGE // 2  # two pages: listed again once two names were asked since
    async with core(tmp_path, ttl=0.5, n=n) as (fs, _mem, slow, d):
        await listed(fs, d)
        got = []
        for _ in range(3):
            await trio.sleep(0.55)
            lists, stats = slow.lists, slow.stats
            await fs.lookup(d, "f7")
            got.append((slow.lists - lists, slow.stats - stats))
        assert got == [(0, 1), (0, 1), (1, 0)]


async def test_a_walk_of_a_directory_asked_by_name_asks_ahead(tmp_path: Path) -> None:
    # `ls -l` / `find` of a directory too large to list again: the names asked in its
    # listing's order are asked of the origin in growing batches (one thread job each)
    async with core(tmp_path, ttl=0.5, n=40) as (fs, mem, slow, d):
        slow.delay = 0.45
        await listed(fs, d)
        await trio.sleep(0.55)
        names = sorted(f"f{i}" for i in range(40))
        calls = fs.origin.statistics().calls
        jobs = calls.get("stat", 0) + calls.get("stat_many", 0)
        stats = slow.stats
        for n in names:
            assert (await fs.lookup(d, n)).size == 1
        assert slow.stats - stats == 40
        calls = fs.origin.statistics().calls
        jobs = calls.get("stat", 0) + calls.get("stat_many", 0) - jobs
        assert jobs <= 8, f"{jobs} origin jobs for 40 names"
        assert slow.lists == 1
        # what the origin says later is seen after the TTL, as for any stat
        mem.put_bytes("d/f1", b"changed")
        mem.delete("d/f2")
        await trio.sleep(0.55)
        assert (await fs.lookup(d, "f1")).size == len(b"changed")
        with pytest.raises(FileNotFoundError):
            await fs.lookup(d, "f2")


async def test_immutable_trusts_names_and_versions_until_refreshed(tmp_path: Path) -> None:
    mem = MemoryOrigin()
    mem.mkdir("d")
    mem.put_bytes("d/a", b"a")
    slow = SlowList(mem)
    cache = str(tmp_path / "cache")
    async with build(slow, cache, ttl=0.05, immutable=True, staging_size=1 << 30) as b:
        fs = b.fs
        d = (await fs.lookup(ROOT_INO, "d")).ino
        await listed(fs, d)
        a = (await fs.lookup(d, "a")).ino
        mem.put_bytes("d/a", b"changed")
        mem.put_bytes("d/new", b"n")
        await trio.sleep(0.1)  # past the TTL: still trusted
        calls = slow.stats, slow.lists
        assert (await fs.getattr(a)).size == 1
        assert (await fs.lookup(d, "a")).size == 1
        with pytest.raises(FileNotFoundError):
            await fs.lookup(d, "new")
        assert (slow.stats, slow.lists) == calls, "nothing asked of the origin"
        # a write through the mount is seen at once
        fh, _ = await fs.create(d, "mine", 0o644, os.O_WRONLY | os.O_CREAT)
        await fs.write(fh, 0, b"mine!")
        await fs.release(fh)
        assert (await fs.lookup(d, "mine")).size == 5
        assert fs.refresh("d") == {"names": 3, "listings": 1}  # d, a, mine; d's listing
        assert (await fs.getattr(a)).size == len(b"changed")
        assert (await fs.lookup(d, "new")).size == 1


async def test_a_walk_on_an_origin_of_slow_stats_asks_ahead_in_parallel(tmp_path: Path) -> None:
    # each stat a request (S3: a HEAD): the names ahead are asked in parallel jobs
    async with core(tmp_path, ttl=2.0, n=120) as (fs, mem, slow, d):
        slow.delay, slow.stat_delay = 2.0, 0.003
        await listed(fs, d)
        await trio.sleep(2.05)
        names = sorted(f"f{i}" for i in range(120))
        mem.delete("d/" + names[50])  # removed at the origin: asked ahead as absent
        calls = fs.origin.statistics().calls
        before = calls.get("stat", 0) + calls.get("stat_many", 0)
        for n in names:
            if n == names[50]:
                with pytest.raises(FileNotFoundError):
                    await fs.lookup(d, n)
            else:
                assert (await fs.lookup(d, n)).size == 1
        calls = fs.origin.statistics().calls
        jobs = calls.get("stat", 0) + calls.get("stat_many", 0) - before
        assert jobs < 60, f"{jobs} origin jobs for 120 names"
        assert fs.statistics().ahead_hits > 60


async def test_a_directory_never_listed_is_listed_once_a_pass_over_it_begins(
    tmp_path: Path,
) -> None:
    """The first pass of a restarted job over a directory it never listed: the names asked
    one by one (a ``stat`` each, S3: a HEAD) are FIRST_LISTING_AFTER at most; then one
    listing answers the rest, with what the origin has (a file added meanwhile is seen)."""
    n = 3 * FIRST_LISTING_AFTER
    async with core(tmp_path, ttl=60, n=n) as (fs, mem, slow, d):
        mem.put_bytes("d/late", b"late")
        for i in range(n):
            assert (await fs.lookup(d, f"f{i}")).size == 1
        assert (await fs.lookup(d, "late")).size == 4
        with pytest.raises(FileNotFoundError):
            await fs.lookup(d, "absent")
        assert slow.lists == 1
        assert slow.stats == FIRST_LISTING_AFTER - 1  # the last one asked lists instead


async def test_one_hot_file_never_lists_its_directory(tmp_path: Path) -> None:
    async with core(tmp_path, ttl=0.05, n=2 * FIRST_LISTING_AFTER) as (fs, _mem, slow, d):
        for _ in range(2 * FIRST_LISTING_AFTER):
            await fs.lookup(d, "f1")
            await trio.sleep(0.06)  # past the TTL: asked again
        assert slow.lists == 0
        assert slow.stats >= 2 * FIRST_LISTING_AFTER - 1
