"""One origin question per name at a time (:meth:`Revalidation.origin_entry`): requests about
a name that arrive while it is being asked (the kernel sends one ``GETATTR`` per path walker
once a directory's attributes expire) wait for that answer instead of each asking the origin.
Counted with the origin's calls; the sleeps only make a question slow or let the TTL pass."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from airfs.core.fs import Filesystem
from airfs.core.inodes import ROOT_INO
from airfs.daemon.build import build
from airfs.origin.base import OriginError
from airfs.testing.memory import MemoryOrigin


class SlowStat:
    """Wraps an origin: ``stat`` of ``f`` sleeps ``delay`` s first (in its worker thread)
    and is counted (``stats``); ``fail``: the next such stat raises that error."""

    def __init__(self, inner: MemoryOrigin) -> None:
        self.inner = inner
        self.url = inner.url
        self.delay = 0.0
        self.stats = 0
        self.fail: OriginError | None = None

    def stat(self, path: str) -> Any:
        if path == "f":
            self.stats += 1
            time.sleep(self.delay)
            exc, self.fail = self.fail, None
            if exc is not None:
                raise exc
        return self.inner.stat(path)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@asynccontextmanager
async def core(
    tmp_path: Path, ttl: float
) -> AsyncIterator[tuple[Filesystem, MemoryOrigin, SlowStat, int]]:
    """A core over a memory origin holding the file ``f`` (looked up once); yields it with
    the origin, the counting wrapper and the inode of ``f``."""
    mem = MemoryOrigin()
    mem.put_bytes("f", b"x")
    slow = SlowStat(mem)
    async with build(slow, str(tmp_path / "cache"), ttl=ttl, staging_size=1 << 30) as b:
        ino = (await b.fs.lookup(ROOT_INO, "f")).ino
        yield b.fs, mem, slow, ino


async def getattr_many(fs: Filesystem, ino: int, n: int) -> list[int]:
    """``n`` concurrent ``getattr`` of ``ino``: the sizes they answered."""
    sizes: list[int] = []

    async def one() -> None:
        sizes.append((await fs.getattr(ino)).size)

    async with trio.open_nursery() as nursery:
        for _ in range(n):
            nursery.start_soon(one)
    return sizes


async def test_concurrent_requests_about_one_expired_name_ask_the_origin_once(
    tmp_path: Path,
) -> None:
    async with core(tmp_path, ttl=0.5) as (fs, mem, slow, ino):
        await trio.sleep(0.6)  # the TTL is over
        slow.delay = 0.2
        before, joined = slow.stats, fs.statistics().joined_asks
        mem.put_bytes("f", b"changed")  # seen: the question starts after the change
        sizes = await getattr_many(fs, ino, 20)
        assert sizes == [7] * 20
        assert slow.stats - before == 1
        assert fs.statistics().joined_asks - joined == 19


async def test_an_error_of_the_question_is_everyone_s(tmp_path: Path) -> None:
    """The question fails (an error that is not a passing one): every caller that waited for
    it gets that error, as its own question would have; the next request asks again."""
    async with core(tmp_path, ttl=0.5) as (fs, _mem, slow, ino):
        await trio.sleep(0.6)
        slow.delay = 0.2
        slow.fail = OriginError("denied for this one question")
        before = slow.stats
        got: list[str] = []

        async def one() -> None:
            try:
                await fs.getattr(ino)
            except OSError as exc:
                got.append(str(exc))

        async with trio.open_nursery() as nursery:
            for _ in range(6):
                nursery.start_soon(one)
        assert got == ["[Errno 5] denied for this one question"] * 6
        assert slow.stats - before == 1
        assert (await fs.getattr(ino)).size == 1
        assert slow.stats - before == 2


async def test_a_cancelled_question_is_asked_again_by_those_who_waited(tmp_path: Path) -> None:
    """The request that asked is interrupted: the callers that waited for its answer ask
    again (one question, together) and get the answer."""
    async with core(tmp_path, ttl=0.5) as (fs, _mem, slow, ino):
        await trio.sleep(0.6)
        slow.delay = 0.2
        before = slow.stats
        sizes: list[int] = []

        async def one() -> None:
            sizes.append((await fs.getattr(ino)).size)

        asker = trio.CancelScope()

        async def interrupted() -> None:
            with asker:
                await fs.getattr(ino)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(interrupted)
            await trio.sleep(0.05)  # its question is in flight
            for _ in range(4):
                nursery.start_soon(one)
            await trio.sleep(0.05)
            asker.cancel()
        assert asker.cancelled_caught
        assert sizes == [1] * 4
        assert slow.stats - before == 2  # the cancelled question and the one asked again


async def test_a_question_older_than_the_ttl_is_not_joined(tmp_path: Path) -> None:
    """A caller that comes more than a TTL after the question in flight began asks its own:
    that answer could miss a change older than the TTL allows."""
    async with core(tmp_path, ttl=0.2) as (fs, _mem, slow, ino):
        await trio.sleep(0.3)
        slow.delay = 0.6
        before, joined = slow.stats, fs.statistics().joined_asks
        async with trio.open_nursery() as nursery:
            nursery.start_soon(fs.getattr, ino)
            await trio.sleep(0.3)
            slow.delay = 0.0
            await fs.getattr(ino)  # the slow question is 0.3 s old: not joined
        assert slow.stats - before == 2
        assert fs.statistics().joined_asks == joined


@pytest.mark.parametrize("n", [1, 8])
async def test_lookups_join_too(tmp_path: Path, n: int) -> None:
    """``lookup`` asks through the same door: ``n`` concurrent lookups of an expired name,
    one origin question."""
    async with core(tmp_path, ttl=0.5) as (fs, _mem, slow, ino):
        await trio.sleep(0.6)
        slow.delay = 0.2
        before = slow.stats
        async with trio.open_nursery() as nursery:
            for _ in range(n):
                nursery.start_soon(fs.lookup, ROOT_INO, "f")
        assert slow.stats - before == 1
        fs.forget([(ino, n)])
