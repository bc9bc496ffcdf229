"""The core's side of FUSE passthrough without a kernel: the per-inode mode, writes that bypass
the daemon (done here with ``os.pwrite`` on the returned fd, as the kernel would) being synced,
journaled and committed, and the ESTALE answer when an inode's content changed under its
passthrough opens."""

from __future__ import annotations

import errno
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio

from airfs.core.inodes import ROOT_INO
from airfs.daemon.build import Built, build
from airfs.testing.memory import MemoryOrigin

R, W = os.O_RDONLY, os.O_WRONLY


@asynccontextmanager
async def core(
    tmp_path: Path, *, upload: bool = True
) -> AsyncIterator[tuple[Built, MemoryOrigin]]:
    mem = MemoryOrigin()
    cache = str(tmp_path / "cache")
    async with build(mem, cache, ttl=0.05, staging_size=4 << 30, upload=upload) as b:
        yield b, mem


async def flushed(b: Built) -> None:
    with trio.fail_after(15):
        await b.uploader.flush("")


async def test_passthrough_writes_are_synced_journaled_and_committed(tmp_path: Path) -> None:
    async with core(tmp_path) as (b, mem):
        fs = b.fs
        fh, attr = await fs.create(ROOT_INO, "ckpt.pt", 0o644, W | os.O_CREAT)
        src = await fs.passthrough_source(fh)
        assert src is not None and src[1].startswith("staged:")
        fd = src[0]
        data = os.urandom(300_000)
        os.pwrite(fd, data, 0)  # the kernel writing the backing file
        assert (await fs.getattr(attr.ino)).size == len(data)
        await fs.flush(fh)  # close(): journaled, with the staging file's size
        st = b.area.get("ckpt.pt")
        # journaled (or, since the close waited for its record, committed already)
        assert st is not None and (st.closed_version or not st.dirty) and st.size == len(data)
        assert st.mtime_ns == os.fstat(fd).st_mtime_ns
        await fs.release(fh)
        await flushed(b)
        assert mem.read_range("ckpt.pt", 0, len(data)) == data
        assert fs.ops["write"] == 0


async def test_writes_after_fsync_land_in_the_same_file_and_commit_again(tmp_path: Path) -> None:
    async with core(tmp_path) as (b, mem):
        fs = b.fs
        fh, _ = await fs.create(ROOT_INO, "log", 0o644, W | os.O_CREAT)
        src = await fs.passthrough_source(fh)
        assert src is not None
        os.pwrite(src[0], b"first ", 0)
        with trio.fail_after(15):
            await fs.fsync(fh)
        assert mem.read_range("log", 0, 100) == b"first "
        os.pwrite(src[0], b"second", 6)
        await fs.setattr((await fs.lookup(ROOT_INO, "log")).ino, size=12, fh=fh)  # no fork
        assert b.area.get("log") is not None and b.area.get("log").fd == src[0]  # type: ignore[union-attr]
        await fs.flush(fh)
        await fs.release(fh)
        await flushed(b)
        assert mem.read_range("log", 0, 100) == b"first second"


async def test_daemon_served_inode_stays_daemon_served_until_its_opens_are_gone(
    tmp_path: Path,
) -> None:
    async with core(tmp_path, upload=False) as (b, _):
        fs = b.fs
        fs.passthrough.write_headroom = 1 << 62  # writers are daemon-served here
        fh, attr = await fs.create(ROOT_INO, "f", 0o644, W | os.O_CREAT)
        assert await fs.passthrough_source(fh) is None
        await fs.write(fh, 0, b"abc")
        reader, _ = await fs.open(attr.ino, R)
        assert await fs.passthrough_source(reader) is None  # the first open's way
        await fs.flush(fh)
        await fs.release(fh)
        await fs.release(reader)
        r1, _ = await fs.open(attr.ino, R)
        r2, _ = await fs.open(attr.ino, R)
        s1 = await fs.passthrough_source(r1)
        s2 = await fs.passthrough_source(r2)
        assert s1 is not None and s1 == s2  # one backing file for the inode
        assert os.pread(s1[0], 10, 0) == b"abc"
        stats = fs.passthrough.statistics()
        assert stats.passthrough_handles == 2 and stats.daemon_opens == 2
        await fs.release(r1)
        await fs.release(r2)
        assert fs.passthrough.statistics().passthrough_handles == 0


async def test_changed_content_under_a_passthrough_open_gets_estale_and_a_new_inode(
    tmp_path: Path,
) -> None:
    async with core(tmp_path, upload=False) as (b, _):  # "old" stays staged
        fs = b.fs
        fh, attr = await fs.create(ROOT_INO, "f", 0o644, W | os.O_CREAT)
        await fs.write(fh, 0, b"old")
        await fs.flush(fh)
        await fs.release(fh)
        reader, _ = await fs.open(attr.ino, R)
        src = await fs.passthrough_source(reader)
        assert src is not None
        # a writer of a closed version gets a new version: other bytes than the reader's
        writer, _ = await fs.open(attr.ino, W | os.O_TRUNC)
        with pytest.raises(OSError) as info:
            await fs.passthrough_source(writer)
        assert info.value.errno == errno.ESTALE
        await fs.release(writer)  # what the transport does before answering ESTALE
        again = await fs.lookup(ROOT_INO, "f")
        assert again.ino != attr.ino  # the kernel's retry finds a new inode
        writer, _ = await fs.open(again.ino, W | os.O_TRUNC)
        new = await fs.passthrough_source(writer)
        assert new is not None and new[1] != src[1]
        os.pwrite(new[0], b"new", 0)
        assert os.pread(src[0], 10, 0) == b"old"  # the old reader keeps its bytes
        await fs.flush(writer)
        await fs.release(writer)
        await fs.release(reader)
        assert fs.passthrough.statistics().passthrough_conflicts == 1


async def test_the_core_counts_the_opens_of_a_backing_file_for_the_transport(
    tmp_path: Path,
) -> None:
    """The transport keeps a backing id per file key while :meth:`Passthrough.holds` says an
    open passes through it: the core's count, across joins, refusals and releases."""
    async with core(tmp_path, upload=False) as (b, _):
        fs = b.fs
        pt = fs.passthrough
        fh, attr = await fs.create(ROOT_INO, "f", 0o644, W | os.O_CREAT)
        await fs.write(fh, 0, b"abc")
        await fs.flush(fh)
        await fs.release(fh)
        r1, _ = await fs.open(attr.ino, R)
        r2, _ = await fs.open(attr.ino, R)
        r3, _ = await fs.open(attr.ino, R)
        s1 = await fs.passthrough_source(r1)
        assert s1 is not None
        key = s1[1]
        assert await fs.passthrough_source(r2) == s1  # joins the same file
        assert await fs.passthrough_source(r3) == s1
        assert pt.key_of(r1) == pt.key_of(r2) == key and pt.holds(key)
        pt.refused(r3)  # the kernel would not take it for r3: served by the daemon
        assert pt.key_of(r3) is None and pt.holds(key)
        await fs.release(r1)
        assert pt.holds(key)  # r2 still passes through it
        await fs.release(r2)
        assert not pt.holds(key) and pt.key_of(r2) is None
        await fs.release(r3)
        assert not pt.holds(key)
