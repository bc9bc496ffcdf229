"""Bare listings in the core (:mod:`airfs.core.listings`): with an adapter that answers names
alone (``Core.bare_entries``), a directory of more than ``HEADS_MAX`` entries is listed
without asking each one's attributes; ``readdir`` emits those names with ``known`` False
(the inode number a lookup answers, no lookup reference), a guessed entry never answers a
lookup (the name is asked by itself), while an absent name is still answered by the
listing. A memory origin with ``bare_lists``; its ``list_heads`` count stands for S3's
HEADs. Through the kernel: ``tests/fuse/test_bare_listing_mounted.py``."""

from __future__ import annotations

import collections
import errno
import stat
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio

from airfs.core.attrs import Attr
from airfs.core.fs import Filesystem
from airfs.core.inodes import ROOT_INO
from airfs.core.listings import HEADS_MAX
from airfs.daemon.build import build
from airfs.origin.base import Entry
from airfs.testing.memory import MemoryOrigin

N = HEADS_MAX + 10


@asynccontextmanager
async def core(
    tmp_path: Path, *, bare: bool, ttl: float = 30.0
) -> AsyncIterator[tuple[Filesystem, MemoryOrigin, int]]:
    """A core over a memory origin with bare listings holding ``d/f000``... (mode 0o600)
    and ``d/sub``; ``bare``: the adapter answers names alone. Yields the core, the origin
    and the inode of ``d``."""
    mem = MemoryOrigin().with_bare_lists()
    mem.mkdir("d", 0o755)
    for i in range(N):
        mem.put_bytes(f"d/f{i:03}", b"x" * i, mode=0o600)
    mem.mkdir("d/sub", 0o700)
    async with build(mem, str(tmp_path / "cache"), ttl=ttl, staging_size=1 << 30) as b:
        b.fs.core.bare_entries = bare
        yield b.fs, mem, (await b.fs.lookup(ROOT_INO, "d")).ino


def count_stats(mem: MemoryOrigin) -> collections.Counter[str]:
    """From now on, how many times each path is asked of ``mem`` by ``stat``."""
    asked: collections.Counter[str] = collections.Counter()
    inner = mem.stat

    def counted(path: str) -> Entry:
        asked[path] += 1
        return inner(path)

    mem.stat = counted  # type: ignore[method-assign]
    return asked


async def listed(fs: Filesystem, ino: int) -> dict[str, tuple[Attr, bool]]:
    got: dict[str, tuple[Attr, bool]] = {}

    def emit(name: str, attr: Attr, nxt: int, known: bool) -> bool:
        got[name] = (attr, known)
        return True

    fh = await fs.opendir(ino)
    await fs.readdir(fh, 0, emit)
    fs.releasedir(fh)
    return got


async def test_a_big_directory_is_listed_by_name(tmp_path: Path) -> None:
    async with core(tmp_path, bare=True) as (fs, mem, d):
        got = await listed(fs, d)
        assert len(got) == N + 1 and mem.calls["list_heads"] == 0
        assert not any(known for _, known in got.values())
        assert stat.S_ISDIR(got["sub"][0].mode) and stat.S_ISREG(got["f005"][0].mode)
        node = fs.inodes.at("d/f005")
        assert node is not None and node.lookups == 0  # no reference taken for a bare name
        stats = mem.calls["stat"]
        a = await fs.lookup(d, "f005")
        assert a.ino == got["f005"][0].ino  # the number getdents reported
        assert stat.S_IMODE(a.mode) == 0o600 and a.size == 5  # asked by name, not guessed
        assert mem.calls["stat"] > stats
        sub = await fs.lookup(d, "sub")
        assert stat.S_IMODE(sub.mode) == 0o700 and sub.ino == got["sub"][0].ino
        # an absent name is answered by the listing
        stats = mem.calls["stat"]
        with pytest.raises(OSError) as info:
            await fs.lookup(d, "nothing")
        assert info.value.errno == errno.ENOENT and mem.calls["stat"] == stats
        # a name looked up (fresh) comes with its attributes at the next listing
        again = await listed(fs, d)
        assert again["f005"][1] and stat.S_IMODE(again["f005"][0].mode) == 0o600
        assert not again["f006"][1]


async def test_without_bare_entries_every_name_comes_with_its_attributes(
    tmp_path: Path,
) -> None:
    async with core(tmp_path, bare=False) as (fs, mem, d):
        got = await listed(fs, d)
        assert all(known for _, known in got.values())
        assert mem.calls["list_heads"] == N + 1
        assert stat.S_IMODE(got["f005"][0].mode) == 0o600


async def test_after_the_ttl_names_are_asked_by_name_and_a_new_one_relists_bare(
    tmp_path: Path,
) -> None:
    """After the TTL, a name the bare listing has is asked by name (a listing fetched again
    would not answer it either): a mode changed at the origin is seen, and a walk over the
    names asks them ahead, each once. A name the listing does not have lists the directory
    again, bare too when more than HEADS_MAX objects are new to the origin (no attribute
    asked for them); the names asked since come with their attributes."""
    async with core(tmp_path, bare=True, ttl=0.3) as (fs, mem, d):
        await listed(fs, d)
        await trio.sleep(0.4)
        mem.set_attrs("d/f007", mode=0o640)
        lists = mem.calls["list"]
        asked = count_stats(mem)
        modes = {}
        for i in range(N):  # ``ls -l``: each name in the listing's order
            modes[i] = stat.S_IMODE((await fs.lookup(d, f"f{i:03}")).mode)
        assert modes.pop(7) == 0o640 and set(modes.values()) == {0o600}
        assert mem.calls["list"] == lists  # not listed again
        assert {p: n for p, n in asked.items() if p.startswith("d/f")} == {
            f"d/f{i:03}": 1 for i in range(N)
        }  # each name asked once (walked ahead)
        for i in range(HEADS_MAX + 1):
            mem.put_bytes(f"d/new{i:03}", b"n", mode=0o604)
        a = await fs.lookup(d, "new000")
        assert stat.S_IMODE(a.mode) == 0o604
        assert mem.calls["list"] == lists + 1 and mem.calls["list_heads"] == 0
        kept = fs.listings.latest("d")
        assert kept is not None and kept.bare and kept.entries["new001"].guessed
        assert kept.guessed == HEADS_MAX + 1  # f000... were asked: the origin knows them
        f7 = kept.entries["f007"]
        assert not f7.guessed and stat.S_IMODE(f7.mode) == 0o640


async def test_once_every_guessed_name_was_asked_the_next_listing_answers_them(
    tmp_path: Path,
) -> None:
    """A bare listing's names asked by name once each (a job reading a directory of cached
    files): the origin knows their attributes, so after the TTL the directory is listed
    again (one listing, no attribute asked) and that listing answers every name, as a small
    directory's does; before, every name was asked again by itself after each TTL. A name
    changed at the origin meanwhile is still seen (its state is new to the origin: the
    listing asks it, S3's HEAD, as for a small directory)."""
    async with core(tmp_path, bare=True, ttl=0.3) as (fs, mem, d):
        await listed(fs, d)
        for i in range(N):
            await fs.lookup(d, f"f{i:03}")
        await fs.lookup(d, "sub")
        first = fs.listings.latest("d")
        assert first is not None and first.bare and first.all_named()
        await trio.sleep(0.4)
        mem.set_attrs("d/f007", mode=0o640)
        lists = mem.calls["list"]
        asked = count_stats(mem)
        modes = {i: stat.S_IMODE((await fs.lookup(d, f"f{i:03}")).mode) for i in range(N)}
        assert modes.pop(7) == 0o640 and set(modes.values()) == {0o600}
        assert mem.calls["list"] == lists + 1  # listed once again
        assert not [p for p in asked if p.startswith("d/")]  # no name asked by itself
        assert mem.calls["list_heads"] == 1  # the listing asked f007's (new to the origin)
        again = fs.listings.latest("d")
        assert again is not None and again is not first and not again.bare


def test_named_nodes_are_kept_up_to_a_bound() -> None:
    """Nodes of names answered bare stay (their numbers with them) while among the
    ``NAMED_MAX`` most recent; the oldest beyond is dropped when nothing holds it."""
    from airfs.core import inodes as mod
    from airfs.origin.base import Entry, Kind

    t = mod.InodeTable(Entry("", Kind.DIR, 0, 0, 0o755, ""))
    old = mod.NAMED_MAX
    mod.NAMED_MAX = 3
    try:
        a = t.named("a", Kind.FILE)
        t.maybe_drop(a)
        assert t.at("a") is a  # kept though nothing references it
        t.forget(a.ino, 0)
        held = t.named("b", Kind.FILE)
        held.lookups = 1
        t.named("c", Kind.FILE)
        t.named("d", Kind.FILE)  # a is the oldest of four: dropped
        assert t.at("a") is None and t.at("d") is not None
        t.named("e", Kind.FILE)  # b is the oldest now, but referenced: kept
        assert t.at("b") is held
    finally:
        mod.NAMED_MAX = old
