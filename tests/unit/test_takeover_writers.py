"""Writers carried over a take-over, without a kernel: a version open for writing when the
daemon died is adopted by the recovery of the daemon taking over the mount (``keep_open``),
with the base, mode and owner it had; the take-over's :func:`~airfs.core.restore.restore`
reopens the writer's handle on it, and its later writes and close commit the whole file.
An adopted version that no handle reopens is kept in ``recovered/`` as before."""

from __future__ import annotations

import os
from pathlib import Path

import trio

from airfs.core.inodes import ROOT_INO
from airfs.core.restore import SavedNode, SavedOpen, restore
from airfs.daemon.build import build
from airfs.origin.base import Kind
from airfs.testing.memory import MemoryOrigin
from airfs.writeback.recovery import finish_take_over, recover
from airfs.writeback.staging import StagingArea

W = os.O_WRONLY


def origin_bytes(mem: MemoryOrigin, path: str) -> bytes:
    e = mem.stat(path)
    return mem.read_range(path, 0, e.size)


async def _first_daemon(cache: Path, mem: MemoryOrigin) -> tuple[int, int]:
    """Commit ``old`` (mode 600); then open ``new`` (created, mode 640) and ``old`` for
    writing, write into both, and "die" with both open. Returns their inode numbers."""
    async with build(mem, str(cache), ttl=60, staging_size=1 << 30, attempts=1) as b:
        fh, _ = await b.fs.create(ROOT_INO, "old", 0o600, W | os.O_CREAT)
        await b.fs.write(fh, 0, b"o" * 1000)
        await b.fs.release(fh)
        with trio.fail_after(10):
            await b.uploader.flush("")
        fh_new, attr = await b.fs.create(ROOT_INO, "new", 0o640, W | os.O_CREAT)
        await b.fs.write(fh_new, 0, b"unfinished")
        old_ino = (await b.fs.lookup(ROOT_INO, "old")).ino
        fh_old, _ = await b.fs.open(old_ino, os.O_RDWR)
        await b.fs.write(fh_old, 10, b"rewritten")
        await b.area.settle()  # what the operations settled before answering
        b.area.crashed()  # no release ever comes
        return attr.ino, old_ino


async def test_recovery_adopts_open_versions_only_for_a_take_over(tmp_path: Path) -> None:
    mem = MemoryOrigin()
    cache = tmp_path / "cache"
    await _first_daemon(cache, mem)
    old_version = mem.stat("old").version
    area = StagingArea(str(cache), limit=1 << 30, min_free=0)
    try:
        report = recover(area, keep_open={"new", "old", "elsewhere"})
        assert report.recovered == () and len(report.adopted) == 2
        new, old = area.get("new"), area.get("old")
        assert new is not None and old is not None
        assert (new.seq, new.dirty, new.writers) == (None, True, 0)
        assert os.pread(new.fd, 100, 0) == b"unfinished" and new.mode & 0o777 == 0o640
        assert os.pread(old.fd, 2000, 0) == b"o" * 10 + b"rewritten" + b"o" * 981
        assert old.mode & 0o777 == 0o600 and old.base_version == old_version
        assert new.base_version is None  # a new file: its commit creates it
        # no handle reopened them (a take-over refused): kept aside as at any crash
        kept = finish_take_over(area, report)
        assert sorted(Path(k).name for k in kept) == ["new", "old"]
        assert area.get("new") is None and area.get("old") is None
    finally:
        area.close()
    assert os.listdir(cache / "staging") == []  # their staging files went
    assert (cache / "recovered" / "new").read_bytes() == b"unfinished"
    assert origin_bytes(mem, "old") == b"o" * 1000  # never committed half-written


async def test_without_a_take_over_open_versions_are_kept_aside(tmp_path: Path) -> None:
    mem = MemoryOrigin()
    cache = tmp_path / "cache"
    await _first_daemon(cache, mem)
    area = StagingArea(str(cache), limit=1 << 30, min_free=0)
    try:
        report = recover(area)
        assert report.adopted == () and len(report.recovered) == 2
        assert area.get("new") is None
    finally:
        area.close()


async def test_a_reopened_writer_goes_on_and_its_file_commits_whole(tmp_path: Path) -> None:
    mem = MemoryOrigin()
    cache = tmp_path / "cache"
    new_ino, old_ino = await _first_daemon(cache, mem)
    async with build(
        mem, str(cache), ttl=60, staging_size=1 << 30, attempts=1, keep_open=frozenset({"new"})
    ) as b:
        assert len(b.recovery.adopted) == 1  # "old" is not held open by this "kernel"
        done = await restore(
            b.fs,
            [SavedNode(new_ino, "new", Kind.FILE, 1), SavedNode(old_ino, "old", Kind.FILE, 1)],
            [SavedOpen(7, new_ino, W), SavedOpen(8, old_ino, os.O_RDWR)],
        )
        assert (done.files, done.lost) == (1, (8,))  # old's version was not adopted
        assert finish_take_over(b.area, b.recovery) == []
        await b.fs.write(7, 10, b", now finished")
        await b.fs.flush(7)
        await b.fs.release(7)
        with trio.fail_after(10):
            await b.uploader.flush("")
        assert origin_bytes(mem, "new") == b"unfinished, now finished"
        assert mem.stat("new").mode & 0o777 == 0o640
        assert origin_bytes(mem, "old") == b"o" * 1000
    assert (cache / "recovered" / "old").read_bytes() == b"o" * 10 + b"rewritten" + b"o" * 981
    assert not (cache / "recovered" / "new").exists()
