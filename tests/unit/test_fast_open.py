"""The fast open (issue 22, item 1): a read-only open of a file whose version is fresh and
complete and verified in the block cache is answered inline (its coroutine ends without
yielding to trio: no lock wait, no thread, no origin pin), and its release too; a version
older than the TTL allows is never served that way. Over a POSIX origin (one that pins)."""

from __future__ import annotations

import errno
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import trio

from airfs.cache import CachedReadPath
from airfs.core.context import Caller
from airfs.core.inodes import ROOT_INO
from airfs.core.readpath import ReadPath
from airfs.daemon.build import Built, build
from airfs.origin.aio import AsyncOrigin
from airfs.origin.posix import PosixOrigin
from airfs.testing.inline import inline

R = os.O_RDONLY


@asynccontextmanager
async def core(
    tmp_path: Path, ttl: float, guard: SlowGuard | None = None
) -> AsyncIterator[tuple[Built, Path]]:
    d = tmp_path / "origin"
    d.mkdir()
    origin = PosixOrigin(str(d))

    async def cached(o: AsyncOrigin, nursery: trio.Nursery) -> ReadPath:
        return await CachedReadPath.create(nursery, o, str(tmp_path / "blocks"), cache_size=1 << 30)

    try:
        async with build(
            origin,
            str(tmp_path / "cache"),
            ttl=ttl,
            staging_size=1 << 30,
            readpath=cached,
            guard=guard,
        ) as b:
            yield b, d
    finally:
        origin.close()


class SlowGuard:
    """A guard that allows everything, but whose ``open_read`` check waits (as the catalog's
    does when it reloads the catalog) until :attr:`go` is set, once :attr:`hold` is."""

    def __init__(self) -> None:
        self.hold = False
        self.waiting = trio.Event()
        self.go = trio.Event()

    async def check(self, caller: Caller, op: str, path: str) -> None:
        if self.hold and op == "open_read":
            self.waiting.set()
            await self.go.wait()

    def visible(self, caller: Caller, dir_path: str, name: str) -> bool:
        return True

    def filters(self, dir_path: str) -> bool:
        return False

    def governs(self) -> bool:
        return False

    def immutable(self, path: str) -> bool:
        return False

    def storage(self, path: str) -> str:
        return ""


def pins(b: Built) -> int:
    return b.origin.statistics().calls.get("pin", 0)


async def cached_file(b: Built, d: Path, name: str, data: bytes) -> int:
    """Write ``name`` at the origin ``d`` and open it once through ``b`` (cached whole and
    verified: passthrough's check); its inode."""
    (d / name).write_bytes(data)
    ino = (await b.fs.lookup(ROOT_INO, name)).ino
    fh, _ = await b.fs.open(ino, R)
    assert await b.fs.passthrough_source(fh) is not None  # cached and verified
    await b.fs.release(fh)
    return ino


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
        ino = await cached_file(b, d, "f", b"old")
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


async def test_an_open_whose_file_is_renamed_over_during_its_access_check_is_stale(
    tmp_path: Path,
) -> None:
    """CI, stop 43: an open of a cached file renamed over while the guard decided (the
    catalog reloading) took the fast way with no path: AttributeError, EIO to the reader.
    ESTALE makes the kernel look the name up again and open the new file."""
    guard = SlowGuard()
    async with core(tmp_path, ttl=60, guard=guard) as (b, d):
        fs = b.fs
        ino = await cached_file(b, d, "f", b"old")
        fw, _ = await fs.create(ROOT_INO, "f.tmp", 0o644, os.O_WRONLY | os.O_CREAT)
        await fs.write(fw, 0, b"new")
        await fs.release(fw)
        guard.hold = True
        outcome: list[BaseException | int] = []

        async def opener() -> None:
            try:
                outcome.append((await fs.open(ino, R))[0])
            except Exception as exc:
                outcome.append(exc)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(opener)
            await guard.waiting.wait()
            await fs.rename(ROOT_INO, "f.tmp", ROOT_INO, "f")
            guard.go.set()
        (got,) = outcome
        assert isinstance(got, OSError) and got.errno == errno.ESTALE, repr(got)
        guard.hold = False
        new = (await fs.lookup(ROOT_INO, "f")).ino
        fh, _ = await fs.open(new, R)
        assert await read_all(b, fh) == b"new"
        await fs.release(fh)
