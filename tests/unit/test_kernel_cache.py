"""What the kernel may keep past the TTL (issue 22, item 3: :mod:`airfs.core.kernelcache`),
without a kernel: the invalidations the core asks for are recorded. A lease is given only in a
directory the core checks once per TTL; a check that finds a change invalidates exactly the
names that changed; a late check drops everything the kernel keeps there; a directory nobody
uses stops being checked. Counted, never timed (sleeps let the TTL or a lease pass)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

from airfs.core.fs import Filesystem
from airfs.core.inodes import ROOT_INO
from airfs.core.kernelcache import IMMUTABLE_KEEP
from airfs.daemon.build import build
from airfs.testing.memory import MemoryOrigin

TTL = 0.3


class Recorder:
    """An invalidator that records what it is asked: ("entry", parent, name) and
    ("inode", ino, pages)."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, int, Any]] = []

    def entry(self, parent: int, name: str, *, expire: bool = False) -> None:
        self.sent.append(("entry", parent, name))

    def inode(self, ino: int, *, pages: bool) -> None:
        self.sent.append(("inode", ino, pages))


class Listings:
    """Wraps an origin: ``list`` of ``d`` counted and slowed by ``delay`` seconds."""

    def __init__(self, inner: MemoryOrigin) -> None:
        self.inner = inner
        self.url = inner.url
        self.delay = 0.0
        self.lists = 0

    def list(self, path: str) -> Any:
        time.sleep(self.delay)
        self.lists += path == "d"
        return self.inner.list(path)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@asynccontextmanager
async def kernel(
    tmp_path: Path, *, immutable: bool = False
) -> AsyncIterator[tuple[Filesystem, MemoryOrigin, Listings, Recorder, int]]:
    """A core over ``d/f0`` .. ``d/f9`` with a recording invalidator attached; yields it with
    the origin, its listing wrapper, the recorder and the inode of ``d``."""
    mem = MemoryOrigin()
    mem.mkdir("d")
    for i in range(10):
        mem.put_bytes(f"d/f{i}", b"x")
    wrapped = Listings(mem)
    rec = Recorder()
    cache = str(tmp_path / "cache")
    async with build(wrapped, cache, ttl=TTL, immutable=immutable, staging_size=1 << 30) as b:
        b.fs.kernel.attach(rec)
        d = (await b.fs.lookup(ROOT_INO, "d")).ino
        yield b.fs, mem, wrapped, rec, d


async def looked_up(fs: Filesystem, d: int) -> dict[str, int]:
    """List ``d`` and look every name up (as ``ls -l`` would): name -> inode."""
    fs.releasedir(await fs.opendir(d))
    return {f"f{i}": (await fs.lookup(d, f"f{i}")).ino for i in range(10)}


async def used_twice(fs: Filesystem, d: int) -> dict[str, int]:
    """:func:`looked_up` (the first use: no lease), then again after the TTL (the kernel
    came back: leases)."""
    inos = await looked_up(fs, d)
    assert {fs.kernel.keep(ino) for ino in inos.values()} == {TTL}, "a first use: no lease"
    await trio.sleep(1.1 * TTL)
    return await looked_up(fs, d)


def test_a_checked_directory_gets_leases_and_a_change_is_invalidated(tmp_path: Path) -> None:
    async def main() -> None:
        async with kernel(tmp_path) as (fs, mem, _w, rec, d):
            inos = await used_twice(fs, d)
            keeps = {fs.kernel.keep(ino) for ino in inos.values()}
            assert min(keeps) > TTL, f"no lease in a directory used again: {keeps}"
            await trio.sleep(2.5 * TTL)  # checks ran; nothing changed: nothing invalidated
            assert fs.kernel.statistics().checks >= 2
            assert rec.sent == []
            mem.put_bytes("d/f1", b"changed")
            mem.delete("d/f2")
            await trio.sleep(TTL)  # seen within the TTL
            # changed in place: its attributes and pages; gone: its entry too
            assert ("inode", inos["f1"], True) in rec.sent
            assert ("entry", d, "f2") in rec.sent and ("inode", inos["f2"], True) in rec.sent
            assert {x[2] for x in rec.sent if x[0] == "entry"} == {"f2"}
            dropped = {x[1] for x in rec.sent if x[0] == "inode"}
            assert dropped == {inos["f1"], inos["f2"]}, "only the changed names"
            # the next use of the changed name asks again and sees the change
            assert (await fs.lookup(d, "f1")).size == len(b"changed")
            assert fs.kernel.keep(inos["f0"]) > TTL

    trio.run(main)


def test_a_late_check_drops_what_the_kernel_keeps(tmp_path: Path) -> None:
    async def main() -> None:
        async with kernel(tmp_path) as (fs, _mem, w, rec, d):
            inos = await used_twice(fs, d)
            assert fs.kernel.keep(inos["f0"]) > TTL
            w.delay = 2 * TTL  # the origin becomes slow: the next check is late
            await trio.sleep(2 * TTL)
            assert fs.kernel.statistics().dropped == 1
            names = {x[2] for x in rec.sent if x[0] == "entry"}
            assert names == set(inos), f"every name the kernel holds is dropped: {names}"
            await trio.sleep(2 * TTL)  # the late check lands: its listing is slow, no lease
            assert fs.kernel.keep(inos["f0"]) == TTL

    trio.run(main)


def test_a_directory_nobody_uses_stops_being_checked(tmp_path: Path) -> None:
    async def main() -> None:
        async with kernel(tmp_path) as (fs, _mem, w, _rec, d):
            inos = await used_twice(fs, d)
            lease = fs.kernel.keep(inos["f0"])
            assert lease > TTL
            await trio.sleep(lease + 2 * TTL)  # the lease ran out, nobody came back
            before = w.lists
            await trio.sleep(4 * TTL)
            assert w.lists == before, "a directory is checked only while a lease runs"
            assert fs.kernel.statistics().watched == 0

    trio.run(main)


def test_without_an_invalidator_the_kernel_keeps_the_ttl(tmp_path: Path) -> None:
    async def main() -> None:
        async with kernel(tmp_path) as (fs, _mem, _w, _rec, d):
            fs.kernel.attach(None)
            inos = await looked_up(fs, d)
            await trio.sleep(1.1 * TTL)
            inos = await looked_up(fs, d)
            assert {fs.kernel.keep(ino) for ino in inos.values()} == {TTL}

    trio.run(main)


def test_a_daemon_taking_over_drops_every_name_the_kernel_holds(tmp_path: Path) -> None:
    async def main() -> None:
        async with kernel(tmp_path) as (fs, _mem, _w, rec, d):
            inos = await looked_up(fs, d)
            assert fs.kernel.took_over() == len(inos) + 1  # and d itself
            assert {x[2] for x in rec.sent if x[0] == "entry"} == {"d", *inos}
            assert ("inode", inos["f0"], False) in rec.sent

    trio.run(main)


def test_an_immutable_mount_keeps_names_until_a_refresh_drops_them(tmp_path: Path) -> None:
    async def main() -> None:
        async with kernel(tmp_path, immutable=True) as (fs, _mem, w, rec, d):
            inos = await looked_up(fs, d)
            assert {fs.kernel.keep(ino) for ino in inos.values()} == {IMMUTABLE_KEEP}
            lists = w.lists
            await trio.sleep(3 * TTL)
            assert w.lists == lists, "nothing is checked on an immutable mount"
            fs.refresh("d/f3")
            assert rec.sent == [("entry", d, "f3"), ("inode", inos["f3"], True)]
            rec.sent.clear()
            fs.refresh("d")
            names = {x[2] for x in rec.sent if x[0] == "entry"}
            assert names == {"d", *inos}

    trio.run(main)


def test_a_directory_used_once_is_never_checked(tmp_path: Path) -> None:
    """A walk that passes through a directory once (``find``, ``cp -r``) costs no check."""

    async def main() -> None:
        async with kernel(tmp_path) as (fs, _mem, w, _rec, d):
            inos = await looked_up(fs, d)
            assert {fs.kernel.keep(ino) for ino in inos.values()} == {TTL}
            lists = w.lists
            await trio.sleep(3 * TTL)
            assert w.lists == lists
            assert fs.kernel.statistics().checks == 0

    trio.run(main)


def test_a_directory_still_used_a_lease_on_gets_a_longer_one(tmp_path: Path) -> None:
    async def main() -> None:
        async with kernel(tmp_path) as (fs, _mem, _w, _rec, d):
            inos = await used_twice(fs, d)
            lease = fs.kernel.keep(inos["f0"])
            await trio.sleep(lease + 0.1)  # the kernel forgot f0 and asks again
            await fs.lookup(d, "f0")
            assert fs.kernel.keep(inos["f0"]) == 2 * lease

    trio.run(main)
