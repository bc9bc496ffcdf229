"""The commit delay (:class:`airfs.writeback.uploader.Uploader`): a closed file is committed
``commit_delay`` seconds after its close, so that the rename of an atomic write (a temporary
file written, closed and renamed over its target) and the unlink of a scratch file find it not
yet uploaded and stay local; a barrier (``fsync``, ``airfs flush``, unmount) commits at once.
Before it, each such rename waited for the upload of the temporary name and then renamed (on
S3: copied) it at the origin: 27 atomic writes/s through an S3 mount. Over the memory origin,
through the core as the daemon builds it; the mounted test is in
``tests/fuse/test_writeback.py``."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio

from airfs.core.inodes import ROOT_INO
from airfs.daemon.build import Built, build
from airfs.origin.base import NotFound
from airfs.testing.memory import MemoryOrigin

W = os.O_WRONLY


@asynccontextmanager
async def core(tmp_path: Path, delay: float) -> AsyncIterator[tuple[Built, MemoryOrigin]]:
    mem = MemoryOrigin()
    async with build(mem, str(tmp_path / "cache"), ttl=0.05, commit_delay=delay) as b:
        yield b, mem


async def write_closed(b: Built, name: str, data: bytes) -> None:
    fh, _ = await b.fs.create(ROOT_INO, name, 0o644, W | os.O_CREAT)
    await b.fs.write(fh, 0, data)
    await b.fs.flush(fh)
    await b.fs.release(fh)


async def committed(mem: MemoryOrigin, name: str) -> None:
    """Wait until ``name`` is at the origin (a hang guard, not a time bound)."""
    with trio.fail_after(20):
        while True:
            try:
                mem.stat(name)
                return
            except NotFound:
                await trio.sleep(0.02)


async def test_an_atomic_write_is_committed_once_at_its_final_name(tmp_path: Path) -> None:
    async with core(tmp_path, delay=0.3) as (b, mem):
        await write_closed(b, ".model.json.tmp", b"{}")
        await b.fs.rename(ROOT_INO, ".model.json.tmp", ROOT_INO, "model.json")
        await committed(mem, "model.json")
        assert mem.calls["put"] == 1
        assert mem.calls["rename"] == 0
        with pytest.raises(NotFound):
            mem.stat(".model.json.tmp")
        assert mem.read_range("model.json", 0, 2) == b"{}"


async def test_a_scratch_file_deleted_within_the_delay_is_never_uploaded(
    tmp_path: Path,
) -> None:
    async with core(tmp_path, delay=0.3) as (b, mem):
        await write_closed(b, "scratch", b"x" * 1000)
        await b.fs.unlink(ROOT_INO, "scratch")
        await write_closed(b, "kept", b"k")  # committed after its own delay: the sign
        await committed(mem, "kept")
        assert mem.calls["put"] == 1 and mem.calls["delete"] == 0
        with pytest.raises(NotFound):
            mem.stat("scratch")


async def test_a_closed_file_is_committed_after_the_delay_without_a_barrier(
    tmp_path: Path,
) -> None:
    async with core(tmp_path, delay=0.2) as (b, mem):
        await write_closed(b, "f", b"data")
        with pytest.raises(NotFound):
            mem.stat("f")  # not at once
        await committed(mem, "f")


async def test_a_barrier_commits_at_once_whatever_the_delay(tmp_path: Path) -> None:
    async with core(tmp_path, delay=3600) as (b, mem):
        await write_closed(b, "f", b"data")
        fh, _ = await b.fs.create(ROOT_INO, "g", 0o644, W | os.O_CREAT)
        await b.fs.write(fh, 0, b"synced")
        with trio.fail_after(20):  # a commit that waited for the delay would hang here
            await b.fs.fsync(fh)
            assert mem.read_range("g", 0, 6) == b"synced"
            await b.uploader.flush("")  # airfs flush, and what unmount drains with
        await b.fs.release(fh)
        assert mem.read_range("f", 0, 4) == b"data"


async def test_the_delay_counts_from_the_release_not_the_flush(tmp_path: Path) -> None:
    """``close()`` journals the file at FLUSH and ends with RELEASE, which can come much
    later (ext4 writing a truncated file back first; a writer that flushed and still holds
    the file): a delay counted from the flush had run out by the rename that followed."""
    async with core(tmp_path, delay=0.3) as (b, mem):
        fh, _ = await b.fs.create(ROOT_INO, "ckpt.tmp", 0o644, W | os.O_CREAT)
        await b.fs.write(fh, 0, b"weights")
        await b.fs.flush(fh)  # journaled here
        await trio.sleep(0.5)  # longer than the delay
        await b.fs.release(fh)
        await b.fs.rename(ROOT_INO, "ckpt.tmp", ROOT_INO, "ckpt")
        await committed(mem, "ckpt")
        assert mem.calls["put"] == 1 and mem.calls["rename"] == 0


async def test_a_rename_starts_the_delay_of_the_files_it_moves_again(tmp_path: Path) -> None:
    """A file renamed (or a directory of files put in place) 1.2 s after its close, with a
    2 s delay: it is not committed 1 s after the rename (2.2 s after its close), and it is
    committed once, at its new name, after that."""
    async with core(tmp_path, delay=2.0) as (b, mem):
        await b.fs.mkdir(ROOT_INO, "tmp-dir", 0o755)
        d = (await b.fs.lookup(ROOT_INO, "tmp-dir")).ino
        fh, _ = await b.fs.create(d, "part.bin", 0o644, W | os.O_CREAT)
        await b.fs.write(fh, 0, b"p" * 100)
        await b.fs.flush(fh)
        await b.fs.release(fh)
        st = b.area.get("tmp-dir/part.bin")
        assert st is not None
        closed = st.closed_at
        await trio.sleep(1.2)
        await b.fs.rename(ROOT_INO, "tmp-dir", ROOT_INO, "dir")
        assert st.path == "dir/part.bin" and st.closed_at >= closed + 1.2
        await trio.sleep(1.0)
        assert mem.calls["put"] == 0
        await committed(mem, "dir/part.bin")
        assert mem.calls["put"] == 1  # (the directory itself is renamed at the origin)
        with pytest.raises(NotFound):
            mem.stat("tmp-dir/part.bin")
