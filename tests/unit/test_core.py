"""The filesystem core driven directly (no kernel mount): inodes and lookup counts, listings,
the write path through staging and the uploader, name operations, errors and close-to-open.

Each test runs a :class:`Filesystem` over a :class:`MemoryOrigin` (counted calls), with a
direct read path, a staging area in ``tmp_path`` and an uploader in a nursery.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trio

from airfs.core.attrs import Attr
from airfs.core.fs import Filesystem
from airfs.core.inodes import ROOT_INO
from airfs.daemon.build import build
from airfs.origin.base import Kind, NotFound
from airfs.testing.memory import MemoryOrigin
from airfs.writeback.staging import StagingArea
from airfs.writeback.uploader import Uploader

R, W, RW = os.O_RDONLY, os.O_WRONLY, os.O_RDWR


class GatedOrigin:
    """Wraps an origin; ``put`` blocks (in its worker thread) while ``gate`` is clear."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.url = inner.url
        self.gate = threading.Event()
        self.gate.set()
        self.in_put = threading.Event()

    def put(self, path: str, source: str, if_match: str | None = None, **kw: Any) -> Any:
        self.in_put.set()
        self.gate.wait(30)
        return self.inner.put(path, source, if_match, **kw)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@dataclass
class Core:
    fs: Filesystem
    mem: MemoryOrigin
    area: StagingArea
    uploader: Uploader
    origin: Any

    async def flush(self, path: str = "", timeout: float = 15) -> None:
        with trio.fail_after(timeout):
            await self.uploader.flush(path)

    async def ino(self, path: str) -> int:
        parent = ROOT_INO
        attr = None
        for part in path.split("/"):
            attr = await self.fs.lookup(parent, part)
            parent = attr.ino
        assert attr is not None
        return attr.ino

    async def write_file(self, name: str, data: bytes, parent: int = ROOT_INO) -> int:
        fh, attr = await self.fs.create(parent, name, 0o644, W | os.O_CREAT)
        assert await self.fs.write(fh, 0, data) == len(data)
        await self.fs.flush(fh)
        await self.fs.release(fh)
        return attr.ino

    async def read_all(self, ino: int) -> bytes:
        fh, _ = await self.fs.open(ino, R)
        try:
            out = b""
            while chunk := await self.fs.read(fh, len(out), 1 << 20):
                out += chunk
            return out
        finally:
            await self.fs.release(fh)

    def origin_bytes(self, path: str) -> bytes:
        e = self.mem.stat(path)
        return self.mem.read_range(path, 0, e.size)


@asynccontextmanager
async def running_core(
    tmp_path: Path, *, ttl: float = 0.05, wrap: Any = None, mem: MemoryOrigin | None = None
) -> AsyncIterator[Core]:
    """The core as the daemon builds it (airfs.daemon.build), over a memory origin."""
    mem = mem or MemoryOrigin()
    sync = wrap(mem) if wrap is not None else mem
    async with build(sync, str(tmp_path / "cache"), ttl=ttl, staging_size=1 << 30, attempts=1) as b:
        yield Core(b.fs, mem, b.area, b.uploader, sync)


def errno_of(exc_info: pytest.ExceptionInfo[OSError]) -> int | None:
    return exc_info.value.errno


# -- lookups, attributes, listings --------------------------------------------------------


async def test_lookup_getattr_and_lookup_counts(tmp_path: Path) -> None:
    async with running_core(tmp_path) as c:
        c.mem.put_bytes("a", b"hello")
        c.mem.mkdir("d")
        a1 = await c.fs.lookup(ROOT_INO, "a")
        a2 = await c.fs.lookup(ROOT_INO, "a")
        assert a1.ino == a2.ino and stat.S_ISREG(a1.mode) and a1.size == 5
        d = await c.fs.lookup(ROOT_INO, "d")
        assert stat.S_ISDIR(d.mode) and d.nlink == 2
        assert (await c.fs.getattr(a1.ino)).size == 5
        node = c.fs.inodes.get(a1.ino)
        assert node.lookups == 2
        c.fs.forget([(a1.ino, 1)])
        assert c.fs.inodes.at("a") is node
        c.fs.forget([(a1.ino, 1)])
        assert c.fs.inodes.at("a") is None
        with pytest.raises(OSError) as info:
            await c.fs.getattr(a1.ino)
        assert info.value.errno == errno.ESTALE
        # a fresh lookup gives a new inode with the origin's state
        c.mem.put_bytes("a", b"hello world")
        a3 = await c.fs.lookup(ROOT_INO, "a")
        assert a3.ino != a1.ino and a3.size == 11
        # the root is never forgotten
        c.fs.forget([(ROOT_INO, 100)])
        assert stat.S_ISDIR((await c.fs.getattr(ROOT_INO)).mode)


async def test_getattr_sees_origin_change_after_ttl(tmp_path: Path) -> None:
    async with running_core(tmp_path, ttl=0.05) as c:
        c.mem.put_bytes("f", b"1")
        ino = (await c.fs.lookup(ROOT_INO, "f")).ino
        c.mem.put_bytes("f", b"1234")
        await trio.sleep(0.08)
        assert (await c.fs.getattr(ino)).size == 4
        c.mem.delete("f")
        await trio.sleep(0.08)
        with pytest.raises(OSError) as info:
            await c.fs.getattr(ino)
        assert info.value.errno == errno.ENOENT


async def test_a_listing_skips_a_staged_file_removed_or_moved_while_the_origin_lists(
    tmp_path: Path,
) -> None:
    """A staged file unlinked (or renamed into another directory) while ``opendir`` waited
    for the origin's listing was merged with no name: AssertionError, EIO to ``ls``."""
    async with running_core(tmp_path) as c:
        c.mem.mkdir("d")
        handles = []
        for name in ("gone", "moved", "kept"):  # open: staged, not committed yet
            fh, _ = await c.fs.create(ROOT_INO, name, 0o644, W | os.O_CREAT)
            await c.fs.write(fh, 0, b"x")
            handles.append(fh)
        d_ino = await c.ino("d")
        real = c.fs.core.origin.list
        started, go = trio.Event(), trio.Event()

        async def slow_list(*args: Any, **kwargs: Any) -> Any:
            started.set()
            await go.wait()
            return await real(*args, **kwargs)

        c.fs.core.origin.list = slow_list  # type: ignore[method-assign]
        out: list[int | BaseException] = []

        async def lister() -> None:
            try:
                out.append(await c.fs.opendir(ROOT_INO))
            except Exception as exc:
                out.append(exc)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(lister)
            await started.wait()
            await c.fs.unlink(ROOT_INO, "gone")
            await c.fs.rename(ROOT_INO, "moved", d_ino, "moved")
            go.set()
        (dfh,) = out
        assert isinstance(dfh, int), repr(dfh)
        got: list[str] = []

        def emit(name: str, attr: Attr, nxt: int, known: bool) -> bool:
            got.append(name)
            return True

        await c.fs.readdir(dfh, 0, emit)
        c.fs.releasedir(dfh)
        assert "gone" not in got and "moved" not in got and "kept" in got
        for fh in handles:
            await c.fs.release(fh)


async def test_an_open_for_writing_racing_an_unlink_does_not_bring_the_file_back(
    tmp_path: Path,
) -> None:
    """An open for writing of a committed file whose entry is asked again (older than the
    TTL) while the file is unlinked: the open staged it again at the removed name and its
    commit brought the file back. Now ESTALE (the kernel looks the name up again: ENOENT)."""
    async with running_core(tmp_path) as c:
        c.mem.put_bytes("f", b"committed")
        ino = await c.ino("f")
        await trio.sleep(0.08)  # its entry is older than the TTL: the open asks again
        origin = c.fs.core.origin
        real = {m: getattr(origin, m) for m in ("stat", "stat_joined", "list")}
        started, go = trio.Event(), trio.Event()

        def held(call: Any) -> Any:
            async def first_waits(*args: Any, **kwargs: Any) -> Any:
                if not started.is_set():  # the open's question (whichever way it asks)
                    started.set()
                    await go.wait()
                return await call(*args, **kwargs)

            return first_waits

        for m, call in real.items():
            setattr(origin, m, held(call))
        out: list[tuple[int, bool] | BaseException] = []

        async def writer() -> None:
            try:
                out.append(await c.fs.open(ino, W))
            except Exception as exc:
                out.append(exc)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(writer)
            await started.wait()
            nursery.start_soon(c.fs.unlink, ROOT_INO, "f")
            await trio.sleep(0.05)  # the unlink runs while the open waits for the origin
            go.set()
        (got,) = out
        if not isinstance(got, BaseException):
            await c.fs.release(got[0])
        assert isinstance(got, OSError) and got.errno == errno.ESTALE, repr(got)
        await c.flush()
        with pytest.raises(NotFound):
            c.mem.stat("f")
        with pytest.raises(OSError) as info:
            await c.fs.lookup(ROOT_INO, "f")
        assert info.value.errno == errno.ENOENT


async def test_readdir_merges_staged_and_counts_lookups(tmp_path: Path) -> None:
    async with running_core(tmp_path) as c:
        c.mem.put_bytes("b", b"bb")
        c.mem.put_bytes("a", b"a")
        c.mem.mkdir("d")
        c.mem.put_bytes("d/inner", b"x")
        fh_w, _ = await c.fs.create(ROOT_INO, "s", 0o600, W | os.O_CREAT)
        await c.fs.write(fh_w, 0, b"staged!")
        c.fs.forget([(c.fs.handles[fh_w].node.ino, 1)])  # drop create's lookup

        got: list[tuple[str, Attr, int]] = []

        def emit_some(limit: int) -> Any:
            def emit(name: str, attr: Attr, nxt: int, known: bool) -> bool:
                assert known  # an origin without bare listings
                if len(got) >= limit:
                    return False
                got.append((name, attr, nxt))
                return True

            return emit

        dfh = await c.fs.opendir(ROOT_INO)
        await c.fs.readdir(dfh, 0, emit_some(2))
        assert [g[0] for g in got] == ["a", "b"]
        await c.fs.readdir(dfh, got[-1][2], emit_some(10))
        c.fs.releasedir(dfh)
        names = [g[0] for g in got]
        assert names == ["a", "b", "d", "s"]  # sorted, staged file included, no "inner"
        attrs = {n: a for n, a, _ in got}
        assert attrs["s"].size == 7 and stat.S_ISREG(attrs["s"].mode)
        assert stat.S_IMODE(attrs["s"].mode) == 0o600
        assert stat.S_ISDIR(attrs["d"].mode) and attrs["b"].size == 2
        # each emitted entry holds one lookup reference; forget drops the node
        node_a = c.fs.inodes.at("a")
        assert node_a is not None and node_a.lookups == 1
        n_before = len(c.fs.inodes)
        c.fs.forget([(attrs["a"].ino, 1), (attrs["b"].ino, 1)])
        assert c.fs.inodes.at("a") is None and c.fs.inodes.at("b") is None
        assert len(c.fs.inodes) == n_before - 2
        # the staged file's node stays while it is open, even with no lookups
        c.fs.forget([(attrs["s"].ino, 1)])
        assert c.fs.inodes.at("s") is not None
        await c.fs.release(fh_w)
        with pytest.raises(OSError) as info:
            await c.fs.readdir(dfh, 0, emit_some(10))
        assert info.value.errno == errno.EBADF


# -- the write path ----------------------------------------------------------------------


async def test_create_write_release_commits(tmp_path: Path) -> None:
    async with running_core(tmp_path) as c:
        data = os.urandom(300_000)
        ino = await c.write_file("new.bin", data)
        # visible locally at once, with its size
        assert (await c.fs.getattr(ino)).size == len(data)
        assert await c.read_all(ino) == data
        await c.flush()
        assert c.origin_bytes("new.bin") == data
        assert c.mem.calls["put"] == 1
        stats = c.uploader.statistics().to_dict()
        assert stats["pending_files"] == 0 and stats["committed_files"] == 1
        # the staged copy is dropped once committed and closed
        assert c.area.get("new.bin") is None
        await c.area.settle(sync=True)  # (deletions: next threaded batch)
        assert set(os.listdir(c.area.dir)) == c.area.spares.ids()
        # reads now come from the origin
        before = c.mem.calls["read_range"]
        assert await c.read_all(ino) == data
        assert c.mem.calls["read_range"] > before


async def test_open_existing_for_write_copies_up(tmp_path: Path) -> None:
    async with running_core(tmp_path) as c:
        c.mem.put_bytes("p", b"0123456789")
        ino = await c.ino("p")
        # partial overwrite keeps the rest of the file
        fh, keep = await c.fs.open(ino, W)
        assert not keep
        await c.fs.write(fh, 2, b"ab")
        await c.fs.release(fh)
        assert await c.read_all(ino) == b"01ab456789"
        await c.flush()
        assert c.origin_bytes("p") == b"01ab456789"
        # append (the kernel passes the end offset for O_APPEND)
        fh, _ = await c.fs.open(ino, RW | os.O_APPEND)
        size = (await c.fs.getattr(ino)).size
        await c.fs.write(fh, size, b"XYZ")
        assert await c.fs.read(fh, 0, 100) == b"01ab456789XYZ"
        await c.fs.release(fh)
        await c.flush()
        assert c.origin_bytes("p") == b"01ab456789XYZ"
        # opening for write and closing without writing commits nothing
        puts = c.mem.calls["put"]
        fh, _ = await c.fs.open(ino, W)
        await c.fs.release(fh)
        await c.flush()
        assert c.mem.calls["put"] == puts


async def test_open_with_truncate(tmp_path: Path) -> None:
    async with running_core(tmp_path) as c:
        c.mem.put_bytes("t", b"old content that is long")
        ino = await c.ino("t")
        reads = c.mem.calls["read_range"]
        fh, _ = await c.fs.open(ino, W | os.O_TRUNC)
        assert (await c.fs.getattr(ino)).size == 0
        await c.fs.write(fh, 0, b"new")
        await c.fs.release(fh)
        assert c.mem.calls["read_range"] == reads, "O_TRUNC must not copy the old content"
        await c.flush()
        assert c.origin_bytes("t") == b"new"


async def test_setattr_size_without_handle(tmp_path: Path) -> None:
    async with running_core(tmp_path) as c:
        c.mem.put_bytes("s", b"0123456789")
        ino = await c.ino("s")
        assert (await c.fs.setattr(ino, size=4)).size == 4
        assert await c.read_all(ino) == b"0123"
        await c.flush()
        assert c.origin_bytes("s") == b"0123"
        assert (await c.fs.setattr(ino, size=6)).size == 6
        await c.flush()
        assert c.origin_bytes("s") == b"0123\0\0"
        await c.fs.setattr(ino, size=0)
        await c.flush()
        assert c.origin_bytes("s") == b""
        with pytest.raises(OSError) as info:
            await c.fs.setattr(ROOT_INO, size=0)
        assert info.value.errno == errno.EISDIR


async def test_setattr_mode_and_mtime(tmp_path: Path) -> None:
    async with running_core(tmp_path) as c:
        c.mem.put_bytes("m", b"x")
        ino = await c.ino("m")
        a = await c.fs.setattr(ino, mode=0o600, mtime_ns=1_000_000_000)
        assert stat.S_IMODE(a.mode) == 0o600 and a.mtime_ns == 1_000_000_000
        assert c.mem.stat("m").mode == 0o600


async def test_created_file_mode_reaches_origin(tmp_path: Path) -> None:
    async with running_core(tmp_path) as c:
        fh, attr = await c.fs.create(ROOT_INO, "x.sh", 0o755, W | os.O_CREAT)
        assert stat.S_IMODE(attr.mode) == 0o755
        await c.fs.write(fh, 0, b"#!/bin/sh\n")
        await c.fs.release(fh)
        await c.flush()
        assert c.mem.stat("x.sh").mode == 0o755


async def test_write_during_upload_commits_latest(tmp_path: Path) -> None:
    async with running_core(tmp_path, wrap=GatedOrigin) as c:
        g: GatedOrigin = c.origin
        g.gate.clear()
        fh, _ = await c.fs.create(ROOT_INO, "w", 0o644, RW | os.O_CREAT)
        await c.fs.write(fh, 0, b"first")
        await c.fs.flush(fh)
        st = c.area.get("w")
        assert st is not None
        done = trio.Event()

        async def fsync_then_write() -> None:
            await c.fs.fsync(fh)  # urgent: uploaded while open
            done.set()

        async with trio.open_nursery() as n:
            n.start_soon(fsync_then_write)
            await trio.to_thread.run_sync(g.in_put.wait, 10)
            assert st.uploading

            async def second_write() -> None:
                await c.fs.write(fh, 0, b"SECOND")  # waits for the upload

            n.start_soon(second_write)
            await trio.sleep(0.05)
            assert os.pread(st.fd, 10, 0) == b"first", "write did not wait for the upload"
            g.gate.set()
        await c.fs.release(fh)
        await c.flush()
        assert c.origin_bytes("w") == b"SECOND"


# -- directories and names ---------------------------------------------------------------


async def test_mkdir_rmdir_and_enotempty(tmp_path: Path) -> None:
    async with running_core(tmp_path) as c:
        d = await c.fs.mkdir(ROOT_INO, "d", 0o755)
        assert stat.S_ISDIR(d.mode) and c.mem.stat("d").kind is Kind.DIR
        with pytest.raises(OSError) as info:
            await c.fs.mkdir(ROOT_INO, "d", 0o755)
        assert info.value.errno == errno.EEXIST
        # a staged (uncommitted) child makes the directory non-empty
        fh, _ = await c.fs.create(d.ino, "child", 0o644, W | os.O_CREAT)
        await c.fs.write(fh, 0, b"c")
        with pytest.raises(OSError) as info:
            await c.fs.rmdir(ROOT_INO, "d")
        assert info.value.errno == errno.ENOTEMPTY
        assert c.mem.calls["rmdir"] == 0
        await c.fs.release(fh)
        await c.flush()
        # a committed child too (from the origin)
        with pytest.raises(OSError) as info:
            await c.fs.rmdir(ROOT_INO, "d")
        assert info.value.errno == errno.ENOTEMPTY
        await c.fs.unlink(d.ino, "child")
        await c.fs.rmdir(ROOT_INO, "d")
        with pytest.raises(NotFound):
            c.mem.stat("d")
        with pytest.raises(OSError) as info:
            await c.fs.lookup(ROOT_INO, "d")
        assert info.value.errno == errno.ENOENT
        # rmdir of a file
        await c.write_file("f", b"f")
        with pytest.raises(OSError) as info:
            await c.fs.rmdir(ROOT_INO, "f")
        assert info.value.errno == errno.ENOTDIR


async def test_unlink_staged_only_never_reaches_origin(tmp_path: Path) -> None:
    async with running_core(tmp_path) as c:
        fh, attr = await c.fs.create(ROOT_INO, "tmp", 0o644, RW | os.O_CREAT)
        await c.fs.write(fh, 0, b"scratch")
        await c.fs.unlink(ROOT_INO, "tmp")
        with pytest.raises(OSError) as info:
            await c.fs.lookup(ROOT_INO, "tmp")
        assert info.value.errno == errno.ENOENT
        # the open handle still reads its bytes (unlink while open)
        assert await c.fs.read(fh, 0, 100) == b"scratch"
        await c.fs.release(fh)
        await c.flush()
        assert c.mem.calls["put"] == 0 and c.mem.calls["delete"] == 0
        await c.area.settle(sync=True)  # (deletions: next threaded batch)
        assert set(os.listdir(c.area.dir)) == c.area.spares.ids()
        with pytest.raises(OSError) as info:
            await c.fs.getattr(attr.ino)
        assert info.value.errno in (errno.ENOENT, errno.ESTALE)


async def test_unlink_committed_and_pending_rewrite(tmp_path: Path) -> None:
    async with running_core(tmp_path) as c:
        c.mem.put_bytes("c", b"committed")
        await c.fs.lookup(ROOT_INO, "c")
        await c.fs.unlink(ROOT_INO, "c")
        assert c.mem.calls["delete"] == 1
        with pytest.raises(NotFound):
            c.mem.stat("c")
        with pytest.raises(OSError) as info:
            await c.fs.unlink(ROOT_INO, "c")
        assert info.value.errno == errno.ENOENT
        # a committed file rewritten locally (pending): unlink removes both
        c.mem.put_bytes("r", b"v1")
        ino = await c.ino("r")
        fh, _ = await c.fs.open(ino, W | os.O_TRUNC)
        await c.fs.write(fh, 0, b"v2")
        await c.fs.unlink(ROOT_INO, "r")
        await c.fs.release(fh)
        await c.flush()
        with pytest.raises(NotFound):
            c.mem.stat("r")


async def test_rename_staged_file_is_local(tmp_path: Path) -> None:
    async with running_core(tmp_path) as c:
        fh, _ = await c.fs.create(ROOT_INO, "a", 0o644, W | os.O_CREAT)
        await c.fs.write(fh, 0, b"local")
        await c.fs.rename(ROOT_INO, "a", ROOT_INO, "b")
        assert (await c.fs.lookup(ROOT_INO, "b")).size == 5
        with pytest.raises(OSError):
            await c.fs.lookup(ROOT_INO, "a")
        await c.fs.release(fh)
        await c.flush()
        assert c.mem.calls["rename"] == 0
        assert c.origin_bytes("b") == b"local"
        with pytest.raises(NotFound):
            c.mem.stat("a")


async def test_rename_committed_replace_and_noreplace(tmp_path: Path) -> None:
    async with running_core(tmp_path) as c:
        c.mem.put_bytes("c", b"C")
        c.mem.put_bytes("e", b"E")
        c_ino = await c.ino("c")
        await c.fs.rename(ROOT_INO, "c", ROOT_INO, "d")
        assert c.mem.calls["rename"] == 1 and c.origin_bytes("d") == b"C"
        assert (await c.fs.lookup(ROOT_INO, "d")).ino == c_ino  # same inode, new name
        with pytest.raises(OSError) as info:
            await c.fs.rename(ROOT_INO, "e", ROOT_INO, "d", noreplace=True)
        assert info.value.errno == errno.EEXIST
        assert c.origin_bytes("d") == b"C" and c.origin_bytes("e") == b"E"
        await c.fs.rename(ROOT_INO, "e", ROOT_INO, "d")
        assert c.origin_bytes("d") == b"E"
        with pytest.raises(NotFound):
            c.mem.stat("e")
        assert await c.read_all((await c.fs.lookup(ROOT_INO, "d")).ino) == b"E"
        # a staged file over a committed one, noreplace
        fh, _ = await c.fs.create(ROOT_INO, "n", 0o644, W | os.O_CREAT)
        await c.fs.write(fh, 0, b"N")
        with pytest.raises(OSError) as info:
            await c.fs.rename(ROOT_INO, "n", ROOT_INO, "d", noreplace=True)
        assert info.value.errno == errno.EEXIST
        # ... and replacing it
        await c.fs.rename(ROOT_INO, "n", ROOT_INO, "d")
        await c.fs.release(fh)
        await c.flush()
        assert c.origin_bytes("d") == b"N"
        with pytest.raises(OSError) as info:
            await c.fs.rename(ROOT_INO, "missing", ROOT_INO, "x")
        assert info.value.errno == errno.ENOENT
        with pytest.raises(OSError) as info:
            await c.fs.rename(ROOT_INO, "d", ROOT_INO, "x", exchange=True)
        assert info.value.errno == errno.EINVAL


async def test_rename_directory_with_staged_children(tmp_path: Path) -> None:
    async with running_core(tmp_path) as c:
        d = await c.fs.mkdir(ROOT_INO, "dir1", 0o755)
        c.mem.put_bytes("dir1/old", b"old")
        fh, attr = await c.fs.create(d.ino, "x", 0o644, W | os.O_CREAT)
        await c.fs.write(fh, 0, b"staged child")
        await c.fs.rename(ROOT_INO, "dir1", ROOT_INO, "dir2")
        # the open file follows (same inode, new path)
        assert c.fs.inodes.get(attr.ino).path == "dir2/x"
        await c.fs.write(fh, 12, b"+")
        await c.fs.release(fh)
        await c.flush()
        assert c.origin_bytes("dir2/x") == b"staged child+"
        assert c.origin_bytes("dir2/old") == b"old"
        for p in ("dir1", "dir1/x"):
            with pytest.raises(NotFound):
                c.mem.stat(p)
        # a directory onto a non-empty directory
        await c.fs.mkdir(ROOT_INO, "dir3", 0o755)
        with pytest.raises(OSError) as info:
            await c.fs.rename(ROOT_INO, "dir3", ROOT_INO, "dir2")
        assert info.value.errno == errno.ENOTEMPTY


async def test_rename_during_inflight_upload(tmp_path: Path) -> None:
    async with running_core(tmp_path, wrap=GatedOrigin) as c:
        g: GatedOrigin = c.origin
        g.gate.clear()
        await c.write_file("u", b"uploading")
        await trio.to_thread.run_sync(g.in_put.wait, 10)
        st = c.area.get("u")
        assert st is not None and st.uploading
        renamed = trio.Event()

        async def do_rename() -> None:
            await c.fs.rename(ROOT_INO, "u", ROOT_INO, "v")
            renamed.set()

        async with trio.open_nursery() as n:
            n.start_soon(do_rename)
            await trio.sleep(0.1)
            g.gate.set()
        assert renamed.is_set()
        await c.flush()
        assert c.origin_bytes("v") == b"uploading"
        with pytest.raises(NotFound):
            c.mem.stat("u")
        assert await c.read_all(await c.ino("v")) == b"uploading"
        with pytest.raises(OSError):
            await c.fs.lookup(ROOT_INO, "u")


async def test_unlink_during_inflight_upload(tmp_path: Path) -> None:
    async with running_core(tmp_path, wrap=GatedOrigin) as c:
        g: GatedOrigin = c.origin
        g.gate.clear()
        await c.write_file("gone", b"data")
        await trio.to_thread.run_sync(g.in_put.wait, 10)
        async with trio.open_nursery() as n:
            n.start_soon(c.fs.unlink, ROOT_INO, "gone")
            await trio.sleep(0.1)
            g.gate.set()
        await c.flush()
        with pytest.raises(NotFound):
            c.mem.stat("gone")
        assert c.uploader.statistics().pending_files == 0


async def test_symlink(tmp_path: Path) -> None:
    async with running_core(tmp_path) as c:
        a = await c.fs.symlink(ROOT_INO, "ln", "some/target")
        assert stat.S_ISLNK(a.mode)
        assert await c.fs.readlink(a.ino) == "some/target"
        assert stat.S_ISLNK((await c.fs.lookup(ROOT_INO, "ln")).mode)
        assert c.mem.readlink("ln") == "some/target"
        with pytest.raises(OSError) as info:
            await c.fs.symlink(ROOT_INO, "ln", "other")
        assert info.value.errno == errno.EEXIST
        await c.write_file("f", b"x")
        with pytest.raises(OSError) as info:
            await c.fs.readlink(await c.ino("f"))
        assert info.value.errno == errno.EINVAL


async def test_errors(tmp_path: Path) -> None:
    async with running_core(tmp_path) as c:
        with pytest.raises(OSError) as info:
            await c.fs.lookup(ROOT_INO, "nope")
        assert info.value.errno == errno.ENOENT
        f_ino = await c.write_file("f", b"file")
        with pytest.raises(OSError) as info:
            await c.fs.lookup(f_ino, "x")
        assert info.value.errno == errno.ENOTDIR
        with pytest.raises(OSError) as info:
            await c.fs.create(f_ino, "x", 0o644, W | os.O_CREAT)
        assert info.value.errno == errno.ENOTDIR
        with pytest.raises(OSError) as info:
            await c.fs.opendir(f_ino)
        assert info.value.errno == errno.ENOTDIR
        with pytest.raises(OSError) as info:
            await c.fs.create(ROOT_INO, "f", 0o644, W | os.O_CREAT | os.O_EXCL)
        assert info.value.errno == errno.EEXIST
        d = await c.fs.mkdir(ROOT_INO, "d", 0o755)
        with pytest.raises(OSError) as info:
            await c.fs.open(d.ino, R)
        assert info.value.errno == errno.EISDIR
        with pytest.raises(OSError) as info:
            await c.fs.unlink(ROOT_INO, "d")
        assert info.value.errno == errno.EISDIR
        long = "n" * 256
        for call in (
            c.fs.lookup(ROOT_INO, long),
            c.fs.create(ROOT_INO, long, 0o644, W | os.O_CREAT),
            c.fs.mkdir(ROOT_INO, long, 0o755),
        ):
            with pytest.raises(OSError) as info:
                await call
            assert info.value.errno == errno.ENAMETOOLONG
        ok = await c.fs.mkdir(ROOT_INO, "n" * 255, 0o755)  # NAME_MAX itself is fine
        assert stat.S_ISDIR(ok.mode)
        with pytest.raises(OSError) as info:
            await c.fs.lookup(ROOT_INO, "..")
        assert info.value.errno == errno.EINVAL
        fh, _ = await c.fs.open(f_ino, R)
        with pytest.raises(OSError) as info:
            await c.fs.write(fh, 0, b"x")
        assert info.value.errno == errno.EBADF
        await c.fs.release(fh)
        with pytest.raises(OSError) as info:
            await c.fs.read(fh, 0, 1)
        assert info.value.errno == errno.EBADF


# -- close-to-open -----------------------------------------------------------------------


async def test_close_to_open_sees_origin_change_after_ttl(tmp_path: Path) -> None:
    async with running_core(tmp_path, ttl=0.05) as c:
        c.mem.put_bytes("f", b"version one")
        ino = await c.ino("f")
        fh, keep = await c.fs.open(ino, R)
        assert not keep  # first open: the kernel holds nothing yet
        assert await c.fs.read(fh, 0, 100) == b"version one"
        await c.fs.release(fh)
        # unchanged (within and after the TTL): the kernel may keep its page cache
        fh, keep = await c.fs.open(ino, R)
        assert keep
        await c.fs.release(fh)
        await trio.sleep(0.08)
        stats_before = c.mem.calls["stat"]
        fh, keep = await c.fs.open(ino, R)
        assert keep
        assert c.mem.calls["stat"] > stats_before, "open after the TTL must revalidate"
        await c.fs.release(fh)
        # another program replaces the object at the origin
        c.mem.put_bytes("f", b"VERSION TWO!!")
        await trio.sleep(0.08)
        fh, keep = await c.fs.open(ino, R)
        assert not keep, "changed version: the page cache must be dropped"
        assert await c.fs.read(fh, 0, 100) == b"VERSION TWO!!"
        assert (await c.fs.getattr(ino)).size == 13
        await c.fs.release(fh)
        fh, keep = await c.fs.open(ino, R)
        assert keep
        await c.fs.release(fh)


async def test_open_handle_keeps_its_version(tmp_path: Path) -> None:
    """A reader opened on one version never gets bytes of another (EIO instead of a mix)."""
    async with running_core(tmp_path, ttl=0.05) as c:
        c.mem.put_bytes("f", b"A" * 100)
        ino = await c.ino("f")
        fh, _ = await c.fs.open(ino, R)
        assert await c.fs.read(fh, 0, 10) == b"A" * 10
        c.mem.put_bytes("f", b"B" * 100)
        with pytest.raises(OSError) as info:
            await c.fs.read(fh, 10, 10)
        assert info.value.errno == errno.EIO
        await c.fs.release(fh)
        await trio.sleep(0.08)
        assert await c.read_all(ino) == b"B" * 100


async def test_local_write_wins_over_origin_until_committed(tmp_path: Path) -> None:
    async with running_core(tmp_path, ttl=0.05) as c:
        c.mem.put_bytes("f", b"origin")
        ino = await c.ino("f")
        fh, _ = await c.fs.open(ino, W | os.O_TRUNC)
        await c.fs.write(fh, 0, b"local!!")
        # every other open on this node sees the staged bytes
        fh2, _ = await c.fs.open(ino, R)
        assert await c.fs.read(fh2, 0, 100) == b"local!!"
        await c.fs.release(fh2)
        assert (await c.fs.getattr(ino)).size == 7
        await c.fs.release(fh)
        await c.flush()
        await trio.sleep(0.08)
        assert await c.read_all(ino) == b"local!!"


async def test_known_entries_served_while_origin_unreachable(tmp_path: Path) -> None:
    """A transient origin failure on revalidation serves the last known entry (cached data
    stays readable when the origin is down); an unknown name is absent (ENOENT), so a new
    file can still be created, and it is committed create-only once the origin is back."""
    from airfs.origin.base import Transient
    from airfs.testing.memory import FaultyOrigin

    async with running_core(tmp_path, ttl=0.05, wrap=FaultyOrigin) as c:
        c.mem.put_bytes("k", b"known")
        ino = await c.ino("k")
        assert await c.read_all(ino) == b"known"
        c.origin.fail["stat"] = lambda: Transient("origin down")
        await trio.sleep(0.08)
        assert (await c.fs.lookup(ROOT_INO, "k")).size == 5
        assert (await c.fs.getattr(ino)).size == 5
        fh, keep = await c.fs.open(ino, R)
        assert keep
        await c.fs.release(fh)
        with pytest.raises(OSError) as info:
            await c.fs.lookup(ROOT_INO, "unknown")
        assert info.value.errno == errno.ENOENT
        c.origin.fail["put"] = lambda: Transient("origin down")
        await c.write_file("unknown", b"made while down")
        assert (await c.fs.lookup(ROOT_INO, "unknown")).size == 15
        del c.origin.fail["put"], c.origin.fail["stat"]
        await c.flush()
        assert c.origin_bytes("unknown") == b"made while down"


async def test_forgotten_names_stay_usable_while_origin_unreachable(tmp_path: Path) -> None:
    """After the kernel forgets an inode, its last entry is remembered: a lookup during an
    outage still resolves the name (and the file stays readable from the cache)."""
    from airfs.origin.base import Transient
    from airfs.testing.memory import FaultyOrigin

    async with running_core(tmp_path, ttl=0.05, wrap=FaultyOrigin) as c:
        c.mem.put_bytes("k", b"known")
        ino = await c.ino("k")
        c.fs.forget([(ino, 1)])
        with pytest.raises(OSError):
            c.fs.inodes.get(ino)  # dropped
        c.origin.fail["stat"] = lambda: Transient("origin down")
        await trio.sleep(0.08)
        attr = await c.fs.lookup(ROOT_INO, "k")
        assert attr.size == 5
        c.fs.forget([(attr.ino, 1)])


class CopyingRename:
    """Wraps a memory origin whose ``rename`` gives every file it moves a new version, as an
    S3 rename does (a copy: AWS gives a copy of a multipart object a new ETag)."""

    def __init__(self, inner: MemoryOrigin) -> None:
        self.inner = inner
        self.url = inner.url

    def rename(self, src: str, dst: str, replace: bool = True) -> None:
        self.inner.rename(src, dst, replace)
        todo = [dst]
        while todo:
            p = todo.pop()
            e = self.inner.stat(p)
            if e.kind is Kind.DIR:
                todo += [f"{p}/{c.name}" for c in self.inner.list(p)]
            else:
                self.inner.put_bytes(p, self.inner.read_range(p, 0, e.size), mode=e.mode)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


async def test_a_directory_renamed_by_copies_keeps_its_staged_rewrites_committable(
    tmp_path: Path,
) -> None:
    """A committed file rewritten (staged, replacing the committed version), then its
    directory renamed at an origin whose rename copies (new versions): the rewrite commits
    over the copy at the new name, not as a conflict."""
    async with running_core(tmp_path, wrap=CopyingRename) as c:
        await c.fs.mkdir(ROOT_INO, "d", 0o755)
        d = await c.ino("d")
        await c.write_file("f", b"one", parent=d)
        await c.flush()
        fh, _ = await c.fs.open(await c.ino("d/f"), W | os.O_TRUNC)
        await c.fs.write(fh, 0, b"two")  # staged; not committed while open for writing
        await c.fs.rename(ROOT_INO, "d", ROOT_INO, "e")
        await c.fs.release(fh)
        await c.flush()
        assert c.origin_bytes("e/f") == b"two"
        s = c.uploader.statistics()
        assert (s.conflicts, s.errors) == ((), 0)


class SlowStats(CopyingRename):
    """:class:`CopyingRename` whose ``stat`` of a path under ``e/`` takes 0.1 s while
    ``watch`` is set, counting how many such stats run at once; a path in ``fail`` fails."""

    def __init__(self, inner: MemoryOrigin) -> None:
        super().__init__(inner)
        self.watch, self.now, self.most = False, 0, 0
        self.fail: set[str] = set()
        self._lock = threading.Lock()

    def stat(self, path: str) -> Any:
        if not (self.watch and path.startswith("e/")):
            return self.inner.stat(path)
        with self._lock:
            self.now += 1
            self.most = max(self.most, self.now)
        try:
            time.sleep(0.1)
            if path in self.fail:
                raise PermissionError(errno.EACCES, "denied (injected)", path)
            return self.inner.stat(path)
        finally:
            with self._lock:
                self.now -= 1


@pytest.mark.expect_log(r"commit lost a conflict: e/d/g")
async def test_a_renamed_directory_rebases_its_staged_rewrites_at_once(tmp_path: Path) -> None:
    """The staged rewrites of a renamed directory are rebased with concurrent origin stats
    (not one after another: a directory of many rewritten files on a remote store waited a
    round trip per file); every rewrite then commits over its copy. A stat that fails is the
    rename's error as itself (not an exception group), after the other files are rebased."""
    n = 6
    async with running_core(tmp_path, wrap=SlowStats) as c:
        await c.fs.mkdir(ROOT_INO, "d", 0o755)
        d = await c.ino("d")
        for i in range(n):
            await c.write_file(f"f{i}", b"one", parent=d)
        await c.flush()
        handles = []
        for i in range(n):
            fh, _ = await c.fs.open(await c.ino(f"d/f{i}"), W | os.O_TRUNC)
            await c.fs.write(fh, 0, f"two{i}".encode())
            handles.append(fh)
        c.origin.watch = True
        await c.fs.rename(ROOT_INO, "d", ROOT_INO, "e")
        c.origin.watch = False
        assert c.origin.most > 1  # concurrent (16 at most)
        for fh in handles:
            await c.fs.release(fh)
        await c.flush()
        for i in range(n):
            assert c.origin_bytes(f"e/f{i}") == f"two{i}".encode()
        s = c.uploader.statistics()
        assert (s.conflicts, s.errors) == ((), 0)
        # a stat that fails after the origin has renamed: the rename still succeeds (the
        # name moves); the file keeps its old base, loses its commit's conflict, and its
        # bytes are kept and reported, not lost
        await c.fs.mkdir(ROOT_INO, "d", 0o755)
        d = await c.ino("d")
        await c.write_file("g", b"one", parent=d)
        await c.write_file("h", b"one", parent=d)
        await c.flush()
        handles = []
        for name in ("g", "h"):
            fh, _ = await c.fs.open(await c.ino(f"d/{name}"), W | os.O_TRUNC)
            await c.fs.write(fh, 0, b"two")
            handles.append(fh)
        c.origin.watch, c.origin.fail = True, {"e/d/g"}
        await c.fs.rename(ROOT_INO, "d", await c.ino("e"), "d")
        c.origin.watch = False
        assert (await c.fs.lookup(await c.ino("e/d"), "g")).size == 3
        for fh in handles:
            await c.fs.release(fh)
        with contextlib.suppress(OSError):
            await c.flush()
        assert c.origin_bytes("e/d/h") == b"two"
        (lost,) = c.uploader.statistics().conflicts
        assert lost["path"] == "e/d/g" and Path(lost["kept"]).read_bytes() == b"two"
