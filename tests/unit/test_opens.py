"""Handles on staged versions (:mod:`airfs.writeback.opens`) and the one "this file is now
closed" rule (:func:`airfs.writeback.versions.close_due`), tested directly on a real staging
area (no core, no mount)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from airfs.writeback.opens import Opened, Opens
from airfs.writeback.staging import StagingArea
from airfs.writeback.versions import Close, PathState, Staged, close_due


def _version(*, dirty: bool = True, path: str | None = "f", journaled: bool = False) -> Staged:
    st = Staged("id", "/nonexistent", -1, 0o644, 0, 0)
    st.ps = PathState(path, None)
    st.committed_gen = 0 if dirty else st.gen
    if journaled:
        st.seq, st.journaled_gen = 1, st.gen
    return st


@pytest.mark.parametrize(
    ("other_writers", "barrier", "expected"),
    [
        (0, False, Close.NOW),  # the last descriptor's close()
        (1, False, Close.NO),  # another descriptor still writes it
        (2, True, Close.NOW),  # fsync / link / airfs flush: as it is now
        (0, True, Close.NOW),
    ],
)
def test_close_due_counts_other_writers_unless_a_barrier(
    other_writers: int, barrier: bool, expected: Close
) -> None:
    assert close_due(_version(), other_writers=other_writers, barrier=barrier) is expected


@pytest.mark.parametrize("barrier", [False, True])
def test_close_due_never_for_clean_deleted_or_closed_versions(barrier: bool) -> None:
    for st in (_version(dirty=False), _version(path=None), _version(journaled=True)):
        assert close_due(st, other_writers=0, barrier=barrier) is Close.NO


def test_close_due_defers_while_writes_are_in_flight() -> None:
    st = _version()
    st.inflight = 1
    assert close_due(st, other_writers=0, barrier=False) is Close.AFTER_WRITES
    assert close_due(st, other_writers=1, barrier=False) is Close.NO  # not due at all
    st.touch()  # the write in flight changed it
    assert close_due(st, other_writers=0, barrier=True) is Close.AFTER_WRITES


@pytest.fixture
def area(tmp_path: Path) -> Iterator[StagingArea]:
    a = StagingArea(str(tmp_path / "cache"), limit=1 << 30, min_free=0)
    try:
        yield a
    finally:
        a.close()


async def test_the_last_writer_journals_and_a_reader_does_not_hold_it_open(
    area: StagingArea,
) -> None:
    opens = Opens(area)
    st = await area.create("f", None, 0o644)
    w1 = await opens.open(st, 7, writable=True)
    w2 = await opens.open(st, 7, writable=True)
    r = await opens.open(st, 7, writable=False)
    assert (st.writers, st.refs) == (2, 3)
    await area.io.write(opens.version(w1), 0, b"abc")
    await opens.flush(w1)
    assert not st.closed_version  # w2 still writes it
    await opens.close(w1)
    assert not st.closed_version and st.writers == 1
    await opens.flush(w2)
    assert st.closed_version  # the last writer's close() journals it
    await area.settle()
    assert [rec.path for rec in area.journal.records()] == ["f"]
    await opens.close(w2)
    await opens.close(r)
    assert (st.writers, st.refs) == (0, 0)
    assert opens.of_file(7) is None


async def test_a_fork_moves_every_writer_and_no_reader(area: StagingArea) -> None:
    opens = Opens(area)
    st = await area.create("f", None, 0o644)
    w1 = await opens.open(st, 1, writable=True)
    w2 = await opens.open(st, 2, writable=True)
    r = await opens.open(st, 3, writable=False)
    await area.io.write(st, 0, b"old")
    area.close_version(st, barrier=True)  # fsync: journaled while both still write it
    assert st.closed_version

    got: list[Staged] = []

    async def write(tok: Opened) -> None:
        got.append(await opens.writable(tok, in_place=lambda v: False))

    async with trio.open_nursery() as n:  # concurrent writes: one copy
        n.start_soon(write, w1)
        n.start_soon(write, w2)
    new = got[0]
    assert got == [new, new] and new is not st
    assert opens.version(w1) is new and opens.version(w2) is new
    assert opens.version(r) is st  # a reader keeps the bytes it opened
    assert (new.writers, new.refs, st.writers, st.refs) == (2, 2, 0, 1)
    assert opens.of_file(2) is new and opens.of_file(3) is st
    await area.io.write(new, 0, b"new")
    for tok in (w1, w2, r):
        await opens.close(tok)
    assert new.closed_version
    with pytest.raises(AssertionError, match="closed twice"):
        opens.close_now(w1)


async def test_a_writer_opened_during_a_fork_follows_it(area: StagingArea) -> None:
    """A writer that joins a closed version while its fork copies (the copy runs in a worker
    thread) moves with the others: nothing writes the journaled bytes."""
    opens = Opens(area)
    st = await area.create("f", None, 0o644)
    w1 = await opens.open(st, 1, writable=True)
    await area.io.write(st, 0, b"journaled")
    area.close_version(st, barrier=True)
    late: list[Opened] = []

    async def write() -> None:
        await opens.writable(w1, in_place=lambda v: False)

    async def join() -> None:
        while st.forking is None:  # until the fork's copy runs
            await trio.sleep(0)
        late.append(await opens.open(st, 2, writable=True))
        assert st.forking is not None  # joined while it copied

    async with trio.open_nursery() as n:
        n.start_soon(write)
        n.start_soon(join)
    new = opens.version(w1)
    assert new is not st and opens.version(late[0]) is new
    assert (new.writers, new.refs, st.writers, st.refs) == (2, 2, 0, 0)
    await area.io.write(new, 0, b"rewritten")
    assert os.pread(st.fd, 100, 0) == b"journaled"
    for tok in (w1, late[0]):
        await opens.close(tok)
