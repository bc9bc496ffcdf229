"""Regression tests of the "Nothing lost" issue, on the core as the daemon builds it (no
kernel): each names the bug it pins down. The mounted counterparts (real vim, flock(1),
kill -9, damaged journal files on disk, S3) are in ``tests/fuse/test_nothing_lost_mounted.py``."""

from __future__ import annotations

import errno
import os
import threading
from pathlib import Path
from typing import Any

import pytest
import trio

from airfs.core.inodes import ROOT_INO
from airfs.daemon.build import Built, build
from airfs.origin.base import Conflict, Entry, Transient
from airfs.testing import corehost as ch
from airfs.testing.memory import FaultyOrigin, MemoryOrigin
from airfs.writeback.journal import JournalDamaged

R, W, RW = os.O_RDONLY, os.O_WRONLY, os.O_RDWR


def origin_bytes(mem: MemoryOrigin, path: str) -> bytes:
    return mem.read_range(path, 0, 1 << 30)


@pytest.fixture
def mem() -> MemoryOrigin:
    return MemoryOrigin()


@pytest.fixture
def host(mem: MemoryOrigin, tmp_path: Path) -> Any:
    h = ch.CoreHost(FaultyOrigin(mem), str(tmp_path / "cache"))
    yield h
    h.close()


def flush(b: Built) -> Any:
    return b.uploader.flush("")


class Gate:
    """Wraps an origin; ``put`` waits (in its worker thread) while the gate is closed."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.url = inner.url
        self.open = threading.Event()
        self.open.set()
        self.waiting = threading.Event()

    def put(self, *args: Any, **kw: Any) -> Entry:
        self.waiting.set()
        self.open.wait(30)
        return self.inner.put(*args, **kw)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


# -- 1. O_CREAT|O_RDONLY ------------------------------------------------------------------


def test_file_created_rdonly_is_committed_and_counts_stay_sane(host: Any, mem: Any) -> None:
    """Bug 1: ``create`` with O_RDONLY counted no writer and ``release`` subtracted one
    (writers = -1): the lock file never reached the origin, and a later writer's file was
    committed mid-write."""

    async def go(b: Built) -> None:
        fh, _ = await b.fs.create(ROOT_INO, "lock", 0o644, R | os.O_CREAT)
        await ch.close(b, fh)
        await flush(b)
        assert origin_bytes(mem, "lock") == b""
        fh = await ch.open_file(b, "lock", W)
        await b.fs.write(fh, 0, b"half")
        st = b.area.get("lock")
        assert st is not None and st.writers == 1
        await trio.sleep(0.3)  # the uploader must not commit an open, unsynced file
        assert origin_bytes(mem, "lock") == b""
        await b.fs.write(fh, 4, b" and the rest")
        await ch.close(b, fh)
        await flush(b)
        assert origin_bytes(mem, "lock") == b"half and the rest"
        assert all(s.writers >= 0 and s.refs >= 0 for s in b.area.all.values())

    host.call(go)


# -- 3. rename of a new file over a file whose rewrite is pending --------------------------


async def test_rename_new_file_over_pending_rewrite_keeps_the_new_content(
    tmp_path: Path,
) -> None:
    """Bug 3: ``echo B > q; echo C > p; mv p q`` while the uploader is busy ended with the
    *first* content at the origin and C only in conflicts/ (the moved file kept
    base_version=None and its create-only commit conflicted)."""
    mem = MemoryOrigin()
    mem.put_bytes("q", b"A")
    gate = Gate(mem)
    async with build(gate, str(tmp_path / "c"), ttl=0.05, attempts=1) as b:
        gate.open.clear()
        await ch.write_file(b, "q", b"B", os.O_TRUNC)
        with trio.fail_after(10):
            while not gate.waiting.is_set():
                await trio.sleep(0.01)  # q's commit is in flight, held
        await ch.write_file(b, "p", b"C")
        async with trio.open_nursery() as n:
            n.start_soon(b.fs.rename, ROOT_INO, "p", ROOT_INO, "q")
            await trio.sleep(0.1)
            gate.open.set()
        with trio.fail_after(10):
            await flush(b)
        assert origin_bytes(mem, "q") == b"C"
        assert await ch.read(b, "q") == b"C"
        assert b.uploader.statistics().conflicts == ()


# -- 4. crash right after temp-then-rename over a committed file ---------------------------


def test_crash_after_temp_then_rename_over_committed_file(tmp_path: Path) -> None:
    """Bug 4: the journal record was written before base_version was set: after a restart
    the commit conflicted and the old file stayed."""
    mem = MemoryOrigin()
    mem.put_bytes("ckpt.pt", b"old weights")
    faulty = FaultyOrigin(mem)
    faulty.fail["put"] = lambda: Transient("held (test)")
    h = ch.CoreHost(faulty, str(tmp_path / "c"))
    try:
        h.call(lambda b: ch.read(b, "ckpt.pt"))
        h.call(lambda b: ch.write_file(b, ".ckpt.tmp", b"new weights"))
        h.call(lambda b: b.fs.rename(ROOT_INO, ".ckpt.tmp", ROOT_INO, "ckpt.pt"))
        h.crash()
        del faulty.fail["put"]
        h.call(flush)
        assert origin_bytes(mem, "ckpt.pt") == b"new weights"
        stats = h.call(lambda b: _value(b.uploader.statistics()))
        assert stats.conflicts == ()
    finally:
        h.close()


async def _value(v: Any) -> Any:
    return v


# -- 5. crash while a pending file is rewritten with O_TRUNC --------------------------------


def test_crash_during_truncating_rewrite_keeps_the_closed_version(tmp_path: Path) -> None:
    """Bug 5 (also found by the model, shrunk): a pending file reopened with O_TRUNC and
    half rewritten, then kill -9: the closed version was gone and a torn prefix of the
    never-closed rewrite was committed."""
    mem = MemoryOrigin()
    faulty = FaultyOrigin(mem)
    faulty.fail["put"] = lambda: Transient("held (test)")
    cache = tmp_path / "c"
    h = ch.CoreHost(faulty, str(cache))
    try:
        h.call(lambda b: ch.write_file(b, "model.pt", b"complete version 1"))
        fh = h.call(lambda b: ch.open_file(b, "model.pt", W | os.O_TRUNC))
        h.call(lambda b: b.fs.write(fh, 0, b"torn"))
        assert h.call(lambda b: ch.read(b, "model.pt")) == b"torn"  # seen at once
        h.crash()
        assert h.call(lambda b: ch.read(b, "model.pt")) == b"complete version 1"
        del faulty.fail["put"]
        h.call(flush)
        assert origin_bytes(mem, "model.pt") == b"complete version 1"
        assert (cache / "recovered" / "model.pt").read_bytes() == b"torn"
    finally:
        h.close()


# -- 6. journal missing, empty or truncated ----------------------------------------------


@pytest.mark.parametrize("damage", ["missing", "empty", "truncated"])
async def test_damaged_journal_refuses_to_start_and_rebuilds(tmp_path: Path, damage: str) -> None:
    """Bug 6: with the journal missing or zero-length, mount and flush succeeded and every
    pending file was dropped into recovered/<uuid>; half-truncated, the daemon died of
    SIGBUS. Now start is refused with the way out, which commits everything, paths kept."""
    mem = MemoryOrigin()
    faulty = FaultyOrigin(mem)
    faulty.fail["put"] = lambda: Transient("held (test)")
    cache = tmp_path / "c"
    async with build(faulty, str(cache), attempts=1) as b:
        await b.fs.mkdir(ROOT_INO, "d", 0o755)
        for i in range(10):
            await ch.write_file(b, f"f{i}", f"file {i}".encode() * 500)
        b.area.journal.sync()
    data = cache / "journal" / "data.mdb"
    if damage == "missing":
        for f in (cache / "journal").iterdir():
            f.unlink()
        (cache / "journal").rmdir()
    elif damage == "empty":
        os.truncate(data, 0)
    else:
        os.truncate(data, data.stat().st_size // 2)
    with pytest.raises(JournalDamaged) as info:
        async with build(mem, str(cache), attempts=1):
            pass
    assert "Rebuild it from the staging files" in str(info.value)
    assert len(list((cache / "staging").iterdir())) == 10  # nothing was moved or dropped
    async with build(mem, str(cache), attempts=1, rebuild_journal=True) as b:
        assert b.recovery.rebuilt == 10
        with trio.fail_after(10):
            await flush(b)
    for i in range(10):
        assert origin_bytes(mem, f"f{i}") == f"file {i}".encode() * 500


# -- 7. false conflicts after a retried PUT ----------------------------------------------


class LandsThenFails:
    """The first put lands at the origin, then its reply is lost (a timeout)."""

    def __init__(self, inner: MemoryOrigin) -> None:
        self.inner = inner
        self.url = inner.url
        self.lost = 1

    def put(self, *args: Any, **kw: Any) -> Entry:
        entry = self.inner.put(*args, **kw)
        if self.lost:
            self.lost -= 1
            raise Transient("reply lost (test)")
        return entry

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


async def test_retried_put_that_had_landed_is_not_a_conflict(tmp_path: Path) -> None:
    """Bug 7: a commit whose bytes were already at the origin (a retried PUT, a crash after
    the PUT) was reported as a conflict ("exists")."""
    mem = MemoryOrigin()
    async with build(LandsThenFails(mem), str(tmp_path / "c"), attempts=1) as b:
        await ch.write_file(b, "x", b"payload")
        with trio.fail_after(15):
            await flush(b)
        s = b.uploader.statistics()
        assert s.conflicts == () and s.already_committed == 1
        assert origin_bytes(mem, "x") == b"payload"


# -- 8. flush must fail when a write lost a conflict ------------------------------------


@pytest.mark.expect_log(r"commit lost a conflict: shared: ")
async def test_flush_fails_naming_the_file_that_lost_a_conflict(tmp_path: Path) -> None:
    """Bug 8: ``airfs flush`` exited 0 although a write lost a conflict."""
    mem = MemoryOrigin()
    mem.put_bytes("shared", b"v0")
    gate = Gate(mem)
    cache = tmp_path / "c"
    async with build(gate, str(cache), ttl=0.05, attempts=1) as b:
        gate.open.clear()
        await ch.write_file(b, "shared", b"mine", os.O_TRUNC)
        with trio.fail_after(10):
            while not gate.waiting.is_set():
                await trio.sleep(0.01)
        mem.put_bytes("shared", b"another node's")  # wins the race
        gate.open.set()
        with trio.fail_after(10), pytest.raises(OSError) as info:
            await flush(b)
        msg = str(info.value)
        assert info.value.errno == errno.EIO and "shared" in msg and "conflicts" in msg
        kept = [p for p in (cache / "conflicts").iterdir()]
        assert [p.read_bytes() for p in kept] == [b"mine"]
        assert oct(kept[0].stat().st_mode & 0o777) == oct(0o600)
        assert origin_bytes(mem, "shared") == b"another node's"


def test_conflict_is_raised_by_memory_origin_put() -> None:
    mem = MemoryOrigin()
    mem.put_bytes("a", b"1")
    with pytest.raises(Conflict):
        mem.put_bytes("a", b"2", if_match="")


# -- 10. unlinked open files ------------------------------------------------------------


def test_open_staged_file_stays_usable_after_unlink(host: Any) -> None:
    """Bug 10: after unlink, fstat/pread of the open file gave ENOENT while writes
    succeeded."""

    async def go(b: Built) -> None:
        fh = await ch.open_file(b, "scratch", RW | os.O_CREAT)
        await b.fs.write(fh, 0, b"still here")
        ino = await ch.lookup(b, "scratch")
        assert ino is not None
        await b.fs.unlink(ROOT_INO, "scratch")
        assert (await b.fs.getattr(ino)).size == 10
        assert await b.fs.read(fh, 0, 100) == b"still here"
        await b.fs.write(fh, 10, b"!")
        assert (await b.fs.getattr(ino)).size == 11
        await ch.close(b, fh)
        assert await ch.lookup(b, "scratch") is None

    host.call(go)


# -- 2. attributes do not change by themselves ------------------------------------------


def test_mtime_and_mode_survive_the_commit(host: Any, mem: MemoryOrigin) -> None:
    """Bug 2 (attributes): a closed file's mtime changed by itself after its commit; a
    mode or mtime set before the commit (``cp -p``, ``rsync -a``) was lost."""

    async def go(b: Built) -> None:
        await ch.write_file(b, "f", b"data")
        ino = await ch.lookup(b, "f")
        assert ino is not None
        before = await b.fs.getattr(ino)
        await b.fs.setattr(ino, mode=0o600, mtime_ns=1_500_000_000_000_000_000)
        await flush(b)
        await trio.sleep(0.1)  # past the TTL: attributes come from the origin again
        after = await b.fs.getattr(ino)
        assert after.mtime_ns == 1_500_000_000_000_000_000 != before.mtime_ns
        assert after.mode & 0o777 == 0o600
        e = mem.stat("f")
        assert (e.mode, e.mtime_ns) == (0o600, 1_500_000_000_000_000_000)

    host.call(go)
