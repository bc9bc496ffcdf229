"""The write path off the trio loop: a long ``pwrite`` and the journal's transaction run in
worker threads while the loop keeps serving, a barrier waits for the writes in flight, and the
ordered disk queue (:mod:`airfs.writeback.diskq`) keeps what the journal refused.

Each test holds a blocking call in its worker thread with a ``threading.Event`` and shows that
another operation completed *before* it was let go (an order, not a time). The event is also
set by a timer after 10 s, so that code which blocks the loop fails the test instead of hanging
it."""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from airfs.core.inodes import ROOT_INO
from airfs.daemon.build import Built, build
from airfs.testing import corehost as ch
from airfs.testing.memory import MemoryOrigin
from airfs.writeback import applier, diskq, stagedio, stagefiles, staging
from airfs.writeback.journal import RECORD_XATTR, Journal, Record

BIG = b"x" * (staging.WRITE_HOP_MIN * 2)


@asynccontextmanager
async def core(tmp_path: Path, mem: MemoryOrigin) -> AsyncIterator[Built]:
    async with build(mem, str(tmp_path / "cache"), ttl=0.05, staging_size=1 << 30) as b:
        yield b


class Gate:
    """Blocks a worker thread until :meth:`open` (or 10 s: a loop that was blocked shows as
    a wrong order in ``events``, not a hang)."""

    def __init__(self) -> None:
        self.ev = threading.Event()
        self.entered = threading.Event()
        self.events: list[str] = []
        self._timer = threading.Timer(10.0, self.ev.set)
        self._timer.start()

    def hold(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def held(*args: Any, **kwargs: Any) -> Any:
            self.entered.set()
            self.ev.wait()
            self.events.append("released")
            return fn(*args, **kwargs)

        return held

    def open(self) -> None:
        self.events.append("opened by the loop")
        self.ev.set()
        self._timer.cancel()

    async def entered_thread(self) -> None:
        while not self.entered.is_set():
            await trio.sleep(0.005)


def hold_record_of(gate: Gate, journal: Journal, path: str) -> None:
    """Hold (``gate``) the journal transaction that puts ``path``'s record; let others by
    (the background commits of earlier files write the journal too)."""
    write, held = journal.write, gate.hold(journal.write)

    def maybe_held(puts: Any = (), deletes: Any = ()) -> None:
        puts = list(puts)
        fn = held if any(r.path == path for r in puts) else write
        fn(puts, deletes)

    journal.write = maybe_held  # type: ignore[method-assign]


async def test_a_long_write_runs_while_the_loop_serves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mem = MemoryOrigin()
    mem.put_bytes("other", b"hello")
    gate = Gate()
    monkeypatch.setattr(stagedio, "pwrite_all", gate.hold(stagedio.pwrite_all))
    async with core(tmp_path, mem) as b:
        fh = await ch.open_file(b, "big", os.O_WRONLY | os.O_CREAT)
        async with trio.open_nursery() as n:
            n.start_soon(b.fs.write, fh, 0, BIG)
            await gate.entered_thread()
            # the write is in its thread: the loop still answers, and a read of another file
            # completes before the write is let go
            assert await ch.read(b, "other") == b"hello"
            gate.open()
        await ch.close(b, fh)
        assert gate.events == ["opened by the loop", "released"]
        assert await ch.read(b, "big") == BIG


async def test_fsync_waits_for_a_write_in_flight_and_commits_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A barrier on another descriptor of the file while a write is in its thread: the write's
    bytes are in what is journaled and committed (never a closed version written late)."""
    mem = MemoryOrigin()
    gate = Gate()
    monkeypatch.setattr(stagedio, "pwrite_all", gate.hold(stagedio.pwrite_all))
    async with core(tmp_path, mem) as b:
        fh1 = await ch.open_file(b, "f", os.O_WRONLY | os.O_CREAT)
        await b.fs.write(fh1, 0, b"head")  # short: on the loop
        fh2 = await ch.open_file(b, "f", os.O_WRONLY)
        synced = trio.Event()

        async def fsync() -> None:
            await b.fs.fsync(fh2)
            gate.events.append("fsync returned")
            synced.set()

        async with trio.open_nursery() as n:
            n.start_soon(b.fs.write, fh1, 4, BIG)
            await gate.entered_thread()
            n.start_soon(fsync)
            await trio.sleep(0.05)
            assert not synced.is_set()  # waiting for the write, not journaling without it
            gate.open()
        assert gate.events == ["opened by the loop", "released", "fsync returned"]
        assert mem.read_range("f", 0, 1 << 30) == b"head" + BIG
        await ch.close(b, fh2)
        await ch.close(b, fh1)


async def test_a_slow_journal_stalls_the_loop_once_then_runs_while_it_serves(
    tmp_path: Path,
) -> None:
    """A small batch runs on the loop while the disk is fast; the first one that is slow
    marks the disk slow (the guard), and from then on the transaction runs in a worker thread
    while the loop serves: one slow disk stalls the loop for one batch, not every request."""
    mem = MemoryOrigin()
    mem.put_bytes("other", b"hello")
    gate = Gate()
    async with core(tmp_path, mem) as b:
        b.area.disk.applier = applier.Applier("loop", clock=lambda: 0.0)  # time stands still
        journal = b.area.journal
        fast_write = journal.write

        def slow_write(*args: Any, **kw: Any) -> None:
            threading.Event().wait(applier.SLOW_S * 5)  # a disk that takes 100 ms
            fast_write(*args, **kw)

        await ch.write_file(b, "fast", b"1")
        assert b.area.disk.applier.statistics().on_loop >= 2  # create, close
        journal.write = slow_write  # type: ignore[method-assign]
        await ch.write_file(b, "slow", b"2")  # on the loop, slow: the guard trips
        assert b.area.disk.applier.statistics().slow >= 1
        assert not b.area.disk.applier.guard.fast()
        journal.write = fast_write  # type: ignore[method-assign]
        hold_record_of(gate, journal, "f")
        fh = await ch.open_file(b, "f", os.O_WRONLY | os.O_CREAT)
        await b.fs.write(fh, 0, b"data")
        closed = trio.Event()

        async def close() -> None:
            await ch.close(b, fh)
            closed.set()

        async with trio.open_nursery() as n:
            n.start_soon(close)
            await gate.entered_thread()
            assert await ch.read(b, "other") == b"hello"
            assert not closed.is_set()  # close returns only once its record is on disk
            gate.open()
        assert gate.events == ["opened by the loop", "released"]
        assert b.area.disk.applier.statistics().threaded >= 1
        del journal.write
        assert {r.path for r in journal.records()} <= {"fast", "slow", "f"}
        await b.uploader.flush("")
        assert [mem.read_range(p, 0, 10) for p in ("fast", "slow", "f")] == [b"1", b"2", b"data"]


async def test_handoff_waits_briefly_then_serves_while_a_hung_journal_finishes(
    tmp_path: Path,
) -> None:
    """The ``handoff`` mode: the loop waits for the journal thread at most ``HANDOFF_WAIT_S``; a
    transaction that hangs is then awaited off the loop (other requests are served) and the
    close returns only once its record is on disk."""
    mem = MemoryOrigin()
    mem.put_bytes("other", b"hello")
    gate = Gate()
    async with core(tmp_path, mem) as b:
        b.area.disk.applier = applier.Applier("handoff", clock=lambda: 0.0)
        await ch.write_file(b, "fast", b"1")
        assert b.area.disk.applier.statistics().handed >= 1
        journal = b.area.journal
        hold_record_of(gate, journal, "f")
        fh = await ch.open_file(b, "f", os.O_WRONLY | os.O_CREAT)
        await b.fs.write(fh, 0, b"data")
        closed = trio.Event()

        async def close() -> None:
            await ch.close(b, fh)
            closed.set()

        async with trio.open_nursery() as n:
            n.start_soon(close)
            await gate.entered_thread()
            assert await ch.read(b, "other") == b"hello"
            assert not closed.is_set()
            gate.open()
        assert gate.events == ["opened by the loop", "released"]
        assert b.area.disk.applier.statistics().threaded >= 1  # awaited off the loop
        del journal.write
        await b.uploader.flush("")
        assert mem.read_range("f", 0, 10) == b"data"


async def test_small_closes_wait_for_no_worker_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 22, item 5: small files created, written and closed one after another cost the
    writer no worker-thread round trip per file (before: two, the create's path attribute
    and the close's journal record), only one per :data:`staging.SPARES` creates (the spare
    staging files); counted in the writer's own task. The guard's threshold is raised so that
    a busy machine's preemption cannot send a batch to a thread (its own test is above)."""
    monkeypatch.setattr(applier, "SLOW_S", 10.0)
    monkeypatch.setattr(applier, "HANDOFF_WAIT_S", 10.0)
    waits: list[str] = []
    run_sync = trio.to_thread.run_sync

    async def counting(fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
        if trio.lowlevel.current_task() is writer:
            waits.append(getattr(fn, "__name__", repr(fn)))
        return await run_sync(fn, *args, **kw)

    monkeypatch.setattr(trio.to_thread, "run_sync", counting)
    n = 4 * staging.SPARES
    writer = trio.lowlevel.current_task()
    # a TTL longer than the test: no revalidation hop (of the catalog) in the count
    async with build(MemoryOrigin(), str(tmp_path / "c"), ttl=60, staging_size=1 << 30) as b:
        waits.clear()  # the start's own
        for i in range(n):  # what the kernel sends for a new name, after its lookup
            fh, _ = await b.fs.create(ROOT_INO, f"f{i}", 0o644, os.O_WRONLY | os.O_CREAT)
            await b.fs.write(fh, 0, b"x" * 4096)
            await ch.close(b, fh)
        assert len(waits) <= n // staging.SPARES + 1, waits
        await b.uploader.flush("")


class RefusingJournal(Journal):
    """Refuses every transaction that puts a record while ``full`` (a full disk on which
    deleting records still fits), with ENOSPC."""

    full = False

    def write(self, puts: Any = (), deletes: Any = ()) -> None:
        puts = list(puts)
        if self.full and puts:
            raise OSError(errno.ENOSPC, "journal: cannot record the change (test)")
        super().write(puts, deletes)


def _rec(rid: str, path: str, seq: int) -> Record:
    return Record(rid, path, None, 0o644, 1, seq, 1)


async def test_disk_queue_applies_net_changes_in_one_batch(tmp_path: Path) -> None:
    j = Journal(str(tmp_path / "j"))
    q = diskq.DiskQueue(j, applier.Applier("thread"))  # the whole batch at once
    fd = os.open(tmp_path / "b", os.O_RDWR | os.O_CREAT, 0o600)
    gone = tmp_path / "a"
    gone.write_bytes(b"")
    gfd = os.open(gone, os.O_RDONLY)
    # a put then its delete nets to nothing; b's delete then put nets to b's put
    q.write(puts=[_rec("a", "pa", 1)])
    q.remove_xattr(gfd, RECORD_XATTR, "a")
    q.write(deletes=["a"])
    q.drop(str(gone), gfd, "a")
    q.write(deletes=["b"])
    q.write(puts=[_rec("b", "pb", 2)])
    q.set_xattr(fd, RECORD_XATTR, b"b", "b")
    assert q.wants_settle()
    await q.settle()
    assert [r.id for r in j.records()] == ["b"]
    assert os.getxattr(fd, RECORD_XATTR) == b"b"
    assert not gone.exists() and not q.wants_settle(q.mark)
    with pytest.raises(OSError):
        os.fstat(gfd)  # closed after the changes that used it
    st = q.statistics()
    assert (st.queued, st.batches, st.applied, st.failures) == (0, 1, 7, 0)
    os.close(fd)
    j.close()


async def test_a_change_is_applied_while_a_journal_sync_runs(tmp_path: Path) -> None:
    """The daemon's every-second ``settle(sync=True)``: its ``fsync`` of the journal waits,
    on ext4, for the data the kernel writes back meanwhile (7 s while a 512 MiB file was
    staged). An ``unlink`` or ``close`` settled behind it waited as long; now the sync runs
    outside the queue's lock and a change queued meanwhile is applied first."""
    j = Journal(str(tmp_path / "j"))
    gate = Gate()
    j.sync = gate.hold(j.sync)  # type: ignore[method-assign]
    q = diskq.DiskQueue(j, applier.Applier("thread"))
    q.write(puts=[_rec("a", "pa", 1)])
    async with trio.open_nursery() as nursery:
        nursery.start_soon(lambda: q.settle(sync=True))
        await gate.entered_thread()  # a's record applied; its sync held
        assert [r.id for r in j.records()] == ["a"]
        before = q.mark
        q.write(puts=[_rec("b", "pb", 2)])
        await q.settle(since=before)
        gate.events.append("b applied")
        assert [r.id for r in j.records()] == ["a", "b"]
        gate.open()
    assert gate.events == ["b applied", "opened by the loop", "released"]
    j.close()


async def test_disk_queue_keeps_what_a_full_journal_refuses(tmp_path: Path) -> None:
    """Deleting a staged file still works with the journal full (it frees the space); a
    refused record stays queued, its attribute after it, and lands once there is room."""
    j = RefusingJournal(str(tmp_path / "j"))
    j.write(puts=[_rec("a", "pa", 1)])
    q = diskq.DiskQueue(j)
    a = tmp_path / "a"
    a.write_bytes(b"aaaa")
    afd = os.open(a, os.O_RDONLY)
    bfd = os.open(tmp_path / "b", os.O_RDWR | os.O_CREAT, 0o600)
    j.full = True
    before_b = q.mark
    q.write(puts=[_rec("b", "pb", 2)])  # b closed: its record
    q.set_xattr(bfd, RECORD_XATTR, b"b", "b")
    before_a = q.mark
    q.remove_xattr(afd, RECORD_XATTR, "a")  # a deleted
    q.write(deletes=["a"])
    q.drop(str(a), afd, "a")
    await q.settle(since=before_a)  # a's changes are all applied: no error for a's caller
    assert not a.exists() and [r.id for r in j.records()] == []
    with pytest.raises(OSError) as info:
        await q.settle(since=before_b)
    assert info.value.errno == errno.ENOSPC and "not recorded yet" in str(info.value)
    with pytest.raises(OSError):
        os.getxattr(bfd, RECORD_XATTR)  # never an attribute without its record
    assert q.statistics().queued == 2 and q.statistics().failures >= 1
    j.full = False
    await q.settle(since=before_b)
    assert [r.id for r in j.records()] == ["b"]
    assert os.getxattr(bfd, RECORD_XATTR) == b"b"
    assert q.statistics().queued == 0
    os.close(bfd)
    j.close()


async def test_rewrite_opened_while_the_previous_version_commits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by the mounted fsx test: opening a closed file for writing makes a new staging
    file in a worker thread; when the closed version's commit ended meanwhile, that version
    was dropped under the open (ENOENT "removed while being opened", or EBADF from copying a
    closed descriptor). The version is now held from the start of the open."""
    mem = MemoryOrigin()
    held_put = Gate()
    mem.put = held_put.hold(mem.put)  # type: ignore[method-assign]
    gate = Gate()
    async with core(tmp_path, mem) as b:
        await ch.write_file(b, "f", b"0123456789")
        st = b.area.get("f")
        assert st is not None
        await held_put.entered_thread()  # its commit is under way, held
        b.area.spares.close()  # the next new staging file is made in a worker thread
        monkeypatch.setattr(stagefiles, "open_spares", gate.hold(stagefiles.open_spares))
        async with trio.open_nursery() as n:
            result: list[int] = []

            async def reopen() -> None:
                result.append(await ch.open_file(b, "f", os.O_WRONLY))

            n.start_soon(reopen)
            await gate.entered_thread()
            # the closed version's commit ends while the open waits for its new file
            held_put.open()
            with trio.fail_after(10):
                while st.dirty or st.uploading:
                    await trio.sleep(0.005)
            gate.open()
        fh = result[0]
        await b.fs.write(fh, 0, b"ab")
        await ch.close(b, fh)
        assert await ch.read(b, "f") == b"ab23456789"
        await b.uploader.flush("")
        assert mem.read_range("f", 0, 100) == b"ab23456789"


class PathGates(MemoryOrigin):
    """A memory origin whose put of a path waits while a gate is set for it."""

    def __init__(self) -> None:
        super().__init__()
        self.gates: dict[str, Gate] = {}

    def put(self, path: str, source: str, *args: Any, **kwargs: Any) -> Any:
        gate = self.gates.get(path)
        if gate is not None:
            gate.entered.set()
            gate.ev.wait()
        return super().put(path, source, *args, **kwargs)


async def test_a_write_waiting_for_space_never_lands_in_a_version_being_committed(
    tmp_path: Path,
) -> None:
    """A write waiting for staging space while another descriptor's fsync journals the file
    and its upload starts: when space frees, the write goes to a new version (it used to be
    made into the version being uploaded: EIO from the daemon's guard, or a torn commit)."""
    mem = PathGates()
    big, f = Gate(), Gate()
    mem.gates = {"big": big, "f": f}
    async with build(mem, str(tmp_path / "cache"), ttl=0.05, staging_size=256 << 10) as b:
        await ch.write_file(b, "big", b"B" * (200 << 10))  # its commit held: 200 KiB staged
        await big.entered_thread()
        fh1 = await ch.open_file(b, "f", os.O_WRONLY | os.O_CREAT)
        await b.fs.write(fh1, 0, b"a" * 1000)
        fh2 = await ch.open_file(b, "f", os.O_WRONLY)
        async with trio.open_nursery() as n:
            wrote: list[int] = []

            async def write_more() -> None:  # 100 KiB more does not fit until big commits
                wrote.append(await b.fs.write(fh1, 1000, b"c" * (100 << 10)))

            n.start_soon(write_more)
            await trio.sleep(0.05)
            assert not wrote  # waiting for space
            n.start_soon(b.fs.fsync, fh2)  # journals f and starts its upload
            await f.entered_thread()
            big.open()  # space frees; f's upload is still running
            with trio.fail_after(10):
                while not wrote:
                    await trio.sleep(0.005)
            f.open()
        assert wrote == [100 << 10]
        await ch.close(b, fh2)
        await ch.close(b, fh1)
        await b.uploader.flush("")
        assert mem.read_range("f", 0, 1 << 20) == b"a" * 1000 + b"c" * (100 << 10)


async def test_reopening_a_closed_sparse_file_copies_only_its_data(tmp_path: Path) -> None:
    """A closed (journaled) file is never written again: reopening it for writing copies it
    to a new version. A sparse one (``truncate -s 1T``) used to be copied byte for byte, after
    reserving its whole size: ENOSPC at once. Its holes now stay holes."""
    mem = MemoryOrigin()
    async with build(mem, str(tmp_path / "cache"), ttl=0.05, upload=False) as b:
        fh = await ch.open_file(b, "sparse", os.O_WRONLY | os.O_CREAT)
        await b.fs.write(fh, 0, b"head")
        ino = await ch.lookup(b, "sparse")
        assert ino is not None
        await b.fs.setattr(ino, size=1 << 40, fh=fh)
        await b.fs.write(fh, (1 << 40) - 4, b"tail")
        await ch.close(b, fh)  # journaled: the next writer gets a copy
        fh = await ch.open_file(b, "sparse", os.O_WRONLY)
        await b.fs.write(fh, 4, b"-more")
        await ch.close(b, fh)
        st = b.area.get("sparse")
        assert st is not None and st.size == 1 << 40
        assert os.fstat(st.fd).st_blocks * 512 < 1 << 20  # holes stayed holes
        assert os.pread(st.fd, 9, 0) == b"head-more"
        assert os.pread(st.fd, 4, (1 << 40) - 4) == b"tail"
