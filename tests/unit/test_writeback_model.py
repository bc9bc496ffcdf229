"""A reference model of the write path, run by ``hypothesis.stateful`` against the core as the
daemon builds it (:func:`airfs.daemon.build.build`), over a memory origin with injected faults.

Steps: write-and-close (with and without ``O_TRUNC``), a batch of closes at once (each
disk-queue apply mode, the stall guard tripped or not, a crash right after), create with
``O_RDONLY``, a writer kept open across other steps (partial rewrites, and writes long enough to
run in a worker thread), close, fsync, a *mapping that outlives close* (the descriptor's
``close()`` — FLUSH — while the open file lives on, then writes through it, parallel write-backs
of its pages, ``msync`` (fsync) and the unmap — RELEASE), truncate without a handle, rename
(over staged, committed and new files), unlink, origin outages, ``flush``, and **crash + restart
at any step** (all in-memory state dropped, and the disk changes not yet settled with it,
rebuilt from the journal and the staging files), also **in the middle of a commit**
(:class:`CutOrigin`: the put stops before or after its object is at the origin, the journal not
updated), once or twice in a row, with the file rewritten while the cut commit was running;
and a put that fails *without* a crash, before or after its object landed (a lost response).

What must hold: the mount shows the latest content (open writers' bytes included) at every
step; after a crash it shows exactly the last *closed* content of every file (a rewrite that
was never closed is not half-applied); after ``flush`` the origin holds exactly that, no
conflict was reported (our own half-done commit is never a conflict), and no counter went
negative. Shrunk failures are kept below as named
regression tests.
"""

from __future__ import annotations

import os
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

import hypothesis.strategies as hs
import pytest
import trio
from hypothesis import HealthCheck, settings
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from airfs.core.inodes import ROOT_INO
from airfs.daemon.build import Built
from airfs.origin.base import Transient
from airfs.origin.latency import LatencyOrigin
from airfs.testing import corehost as ch
from airfs.testing.memory import FaultyOrigin, MemoryOrigin
from airfs.writeback import applier
from airfs.writeback.staging import WRITE_HOP_MIN
from airfs.writeback.uploader import WriteBackStats

PATHS = ("a", "b", "c")
DATA = hs.binary(min_size=0, max_size=64)
#: how long a step waits at most for the commit it cut while the core still has one to make
CUT_WAIT_S = 5.0


class Cut:
    """One armed crash point: ``reached`` once a put stopped there, ``release`` to let it
    fail (the crash)."""

    def __init__(self, linked: bool) -> None:
        self.linked = linked
        self.reached = threading.Event()
        self.release = threading.Event()


class CutOrigin(FaultyOrigin):
    """The next put after :meth:`arm` stops at a crash point: with ``linked``, once its
    object is in place at the origin, else before it is; it then waits for its release and
    fails, as a put cut by the daemon's death would never return."""

    def __init__(self, inner: MemoryOrigin) -> None:
        super().__init__(inner)
        self._lock = threading.Lock()
        self._armed: Cut | None = None

    def arm(self, linked: bool) -> Cut:
        with self._lock:
            self._armed = Cut(linked)
            return self._armed

    def disarm(self) -> None:
        with self._lock:
            self._armed = None

    def put(self, path: str, source: str, if_match: str | None = None, **kw: Any) -> Any:
        with self._lock:
            cut, self._armed = self._armed, None
        put = FaultyOrigin.__getattr__(self, "put")
        if cut is None:
            return put(path, source, if_match, **kw)  # type: ignore[operator]
        if cut.linked:
            put(path, source, if_match, **kw)  # type: ignore[operator]
        cut.reached.set()
        cut.release.wait(60)
        raise Transient("cut by a crash (test)")


class WriteBackModel(RuleBasedStateMachine):
    """Model: ``closed`` = what must survive a crash and reach the origin; ``live`` = what the
    mount shows now (differs only for the file with an open writer)."""

    def __init__(self) -> None:
        super().__init__()
        self.mem = MemoryOrigin()
        self.faulty = CutOrigin(self.mem)
        self.tmp = tempfile.TemporaryDirectory()
        # a little latency, so that commits overlap the next steps (races are the point)
        origin = LatencyOrigin(self.faulty, 0.002)
        self.host = ch.CoreHost(origin, os.path.join(self.tmp.name, "cache"))
        self.closed: dict[str, bytes] = {}
        self.live: dict[str, bytes] = {}
        self.writer: tuple[str, int] | None = None
        #: the writer's descriptor was closed (FLUSH) but its open file lives on (a mapping)
        self.mapped = False
        self.down = False

    def teardown(self) -> None:
        self.host.close()
        self.tmp.cleanup()

    @initialize()
    def start(self) -> None:
        pass

    def _free(self, *paths: str) -> bool:
        return self.writer is None or self.writer[0] not in paths

    # -- steps ---------------------------------------------------------------------------

    @precondition(lambda self: self.writer is None)
    @rule(path=hs.sampled_from(PATHS), data=DATA, trunc=hs.booleans())
    def write_close(self, path: str, data: bytes, trunc: bool) -> None:
        self.host.call(lambda b: ch.write_file(b, path, data, os.O_TRUNC if trunc else 0))
        old = self.live.get(path, b"")
        new = data if trunc else data + old[len(data) :]
        self.live[path] = self.closed[path] = new

    @precondition(lambda self: self.writer is None)
    @rule(
        files=hs.dictionaries(hs.sampled_from(PATHS), DATA, min_size=1),
        mode=hs.sampled_from(applier.MODES),
        slow=hs.booleans(),
        crash=hs.booleans(),
    )
    def batch_of_closes(self, files: dict[str, bytes], mode: str, slow: bool, crash: bool) -> None:
        """Issue 22: small files written and closed at once (their closes share disk-queue
        batches), the batches applied in ``mode`` (:mod:`airfs.writeback.applier`), with
        the stall guard tripped when ``slow`` (every batch in a worker thread); with
        ``crash``, the daemon dies right after the last close returned."""

        async def go(b: Built) -> None:
            b.area.disk.applier.mode = mode
            if slow:
                b.area.disk.applier.guard.observe(1.0)
            async with trio.open_nursery() as n:
                for path, data in files.items():
                    n.start_soon(ch.write_file, b, path, data, os.O_TRUNC)

        self.host.call(go)
        for path, data in files.items():
            self.live[path] = self.closed[path] = data
        if crash:
            self.crash()

    @rule(path=hs.sampled_from(PATHS))
    def create_rdonly(self, path: str) -> None:
        if path in self.live:
            return

        async def go(b: Built) -> None:
            fh, _ = await b.fs.create(ROOT_INO, path, 0o644, os.O_RDONLY | os.O_CREAT)
            await ch.close(b, fh)

        self.host.call(go)
        self.live[path] = self.closed[path] = b""

    @precondition(lambda self: self.writer is None)
    @rule(path=hs.sampled_from(PATHS), data=DATA, trunc=hs.booleans())
    def open_writer(self, path: str, data: bytes, trunc: bool) -> None:
        if path not in self.live:
            return

        async def go(b: Built) -> int:
            fh = await ch.open_file(b, path, os.O_RDWR | (os.O_TRUNC if trunc else 0))
            if data:
                await b.fs.write(fh, 0, data)
            return fh

        fh = self.host.call(go)
        old = b"" if trunc else self.live[path]
        self.live[path] = data + old[len(data) :]
        self.writer = (path, fh)

    @precondition(lambda self: self.writer is not None)
    @rule(data=DATA)
    def write_more(self, data: bytes) -> None:
        assert self.writer is not None
        path, fh = self.writer
        off = len(self.live[path])
        self.host.call(lambda b: b.fs.write(fh, off, data))
        self.live[path] += data

    @precondition(lambda self: self.writer is not None)
    @rule(fill=hs.integers(0, 255), at=hs.integers(0, 100))
    def write_long(self, fill: int, at: int) -> None:
        """A write long enough to run in a worker thread (the in-flight path)."""
        assert self.writer is not None
        path, fh = self.writer
        data = bytes([fill]) * WRITE_HOP_MIN
        self.host.call(lambda b: b.fs.write(fh, at, data))
        old = self.live[path]
        old += b"\0" * max(0, at - len(old))
        self.live[path] = old[:at] + data + old[at + len(data) :]

    @precondition(lambda self: self.writer is not None)
    @rule()
    def close_writer(self) -> None:
        """``close()`` of the descriptor and the end of the open file (for a mapped writer:
        the unmap, which ends it; its last pages were written back before)."""
        assert self.writer is not None
        path, fh = self.writer
        if self.mapped:
            self.host.call(lambda b: b.fs.release(fh))
        else:
            self.host.call(lambda b: ch.close(b, fh))
        self.closed[path] = self.live[path]
        self.writer = None
        self.mapped = False

    @precondition(lambda self: self.writer is not None and not self.mapped)
    @rule()
    def close_keeping_a_mapping(self) -> None:
        """``close()`` of a descriptor whose file is mapped (numpy.memmap): FLUSH only."""
        assert self.writer is not None
        path, fh = self.writer
        self.host.call(lambda b: b.fs.flush(fh))
        self.closed[path] = self.live[path]  # close() returned: durable
        self.mapped = True

    @precondition(lambda self: self.writer is not None)
    @rule(
        pages=hs.lists(hs.integers(0, 12), min_size=2, max_size=4, unique=True),
        fill=hs.integers(1, 255),
    )
    def parallel_writebacks(self, pages: list[int], fill: int) -> None:
        """Writes of several disjoint pages at once (the kernel writes a mapping's dirty pages
        back in parallel WRITEs, each of which may need the closed version forked)."""
        assert self.writer is not None
        path, fh = self.writer
        page = 8

        async def go(b: Built) -> None:
            async with trio.open_nursery() as n:
                for i in pages:
                    n.start_soon(b.fs.write, fh, i * page, bytes([fill]) * page)

        self.host.call(go)
        cur = bytearray(self.live[path])
        for i in pages:
            cur += b"\0" * max(0, (i + 1) * page - len(cur))
            cur[i * page : (i + 1) * page] = bytes([fill]) * page
        self.live[path] = bytes(cur)

    @precondition(lambda self: self.writer is not None and not self.down)
    @rule()
    def fsync_writer(self) -> None:
        assert self.writer is not None
        path, fh = self.writer
        self.host.call(lambda b: b.fs.fsync(fh))
        self.closed[path] = self.live[path]  # fsync'ed content is durable
        assert self.mem.read_range(path, 0, 1 << 20) == self.live[path]

    @rule(path=hs.sampled_from(PATHS), size=hs.integers(0, 80))
    def truncate(self, path: str, size: int) -> None:
        if path not in self.live or not self._free(path):
            return

        async def go(b: Built) -> None:
            ino = await ch.lookup(b, path)
            assert ino is not None
            await b.fs.setattr(ino, size=size)

        self.host.call(go)
        old = self.live[path]
        self.live[path] = self.closed[path] = old[:size] + b"\0" * max(0, size - len(old))

    @rule(src=hs.sampled_from(PATHS), dst=hs.sampled_from(PATHS))
    def rename(self, src: str, dst: str) -> None:
        if src == dst or src not in self.live or not self._free(src, dst) or self.down:
            return
        self.host.call(lambda b: b.fs.rename(ROOT_INO, src, ROOT_INO, dst))
        self.live[dst] = self.live.pop(src)
        self.closed[dst] = self.closed.pop(src)

    @rule(path=hs.sampled_from(PATHS))
    def unlink(self, path: str) -> None:
        if path not in self.live or not self._free(path) or self.down:
            return
        self.host.call(lambda b: b.fs.unlink(ROOT_INO, path))
        del self.live[path], self.closed[path]

    @rule(down=hs.booleans())
    def origin_outage(self, down: bool) -> None:
        if down:
            self.faulty.fail["put"] = lambda: Transient("origin down (test)")
        else:
            self.faulty.fail.pop("put", None)
        self.down = down

    @precondition(lambda self: not self.down)
    @rule()
    def flush(self) -> None:
        self.host.call(lambda b: b.uploader.flush(""))
        if self.writer is not None:  # an open file is committed as it is now
            self.closed[self.writer[0]] = self.live[self.writer[0]]
        for path in PATHS:
            if path in self.closed:
                got = self.mem.read_range(path, 0, 1 << 20)
                assert got == self.closed[path], (path, got, self.closed[path])
            else:
                assert path not in {e.name for e in self.mem.list("")}, path

        async def stats_of(b: Built) -> WriteBackStats:
            return b.uploader.statistics()

        stats = self.host.call(stats_of)
        assert stats.conflicts == (), stats.conflicts

    @rule()
    def crash(self) -> None:
        self.host.crash()
        self.writer = None
        self.mapped = False
        self.live = dict(self.closed)

    @precondition(lambda self: self.writer is None and not self.down)
    @rule(
        path=hs.sampled_from(PATHS),
        data=DATA,
        rewrite=hs.none() | DATA,
        linked=hs.booleans(),
        again=hs.none() | hs.booleans(),
    )
    def crash_in_commit(
        self, path: str, data: bytes, rewrite: bytes | None, linked: bool, again: bool | None
    ) -> None:
        """Write ``path`` and crash in the middle of a commit (``linked``: after the object
        is at the origin, before the journal knows); with ``rewrite``, the file is written
        again while that commit runs; with ``again``, the restarted core's first commit is
        cut too (before or after its object is in place)."""
        cut = self.faulty.arm(linked)
        self.host.call(lambda b: ch.write_file(b, path, data, os.O_TRUNC))
        self.live[path] = self.closed[path] = data
        if not self._reached(cut):
            self.faulty.disarm()
            cut.release.set()  # a put that took the cut just now fails at once (transient)
            return
        if rewrite is not None:
            self.host.call(lambda b: ch.write_file(b, path, rewrite, os.O_TRUNC))
            self.live[path] = self.closed[path] = rewrite
        nxt: list[Cut] = []

        def arm_again() -> None:
            if again is not None:
                nxt.append(self.faulty.arm(again))  # for the restarted core's first commit

        self.host.crash(then=cut.release.set, before_restart=arm_again)
        self.writer = None
        self.live = dict(self.closed)
        if nxt:
            if self._reached(nxt[0]):
                self.host.crash(then=nxt[0].release.set)
            else:
                self.faulty.disarm()
                nxt[0].release.set()

    def _reached(self, cut: Cut) -> bool:
        """Whether a put took ``cut``: waits until one did, or the core has nothing left to
        commit (then none will until the next step: a restarted core often has nothing to
        put again), at most :data:`CUT_WAIT_S`. (A flat wait of 5 s for a cut no put would
        take was three quarters of this model's time.)"""

        async def idle(b: Built) -> bool:
            st = b.uploader.statistics()
            return st.pending_files == 0 and st.uploading == 0

        deadline = time.monotonic() + CUT_WAIT_S
        while not cut.reached.wait(0.02):
            if self.host.call(idle) and not cut.reached.is_set():
                return False
            if time.monotonic() > deadline:
                return False
        return True

    @precondition(lambda self: self.writer is None and not self.down)
    @rule(path=hs.sampled_from(PATHS), data=DATA, rewrite=hs.none() | DATA, linked=hs.booleans())
    def put_fails(self, path: str, data: bytes, rewrite: bytes | None, linked: bool) -> None:
        """A commit's put fails with a transient error, no crash: with ``linked``, after its
        object landed at the origin (its response lost: a timeout, a reset connection); with
        ``rewrite``, the file is written again before the failure is known. Later steps
        (rename, unlink, rewrites, flush) run on top of the put's leftovers."""
        cut = self.faulty.arm(linked)
        self.host.call(lambda b: ch.write_file(b, path, data, os.O_TRUNC))
        self.live[path] = self.closed[path] = data
        if not self._reached(cut):
            self.faulty.disarm()
            cut.release.set()
            return
        if rewrite is not None:
            self.host.call(lambda b: ch.write_file(b, path, rewrite, os.O_TRUNC))
            self.live[path] = self.closed[path] = rewrite
        cut.release.set()

    # -- what must hold at every step ------------------------------------------------------

    @invariant()
    def mount_shows_live_content(self) -> None:
        for path in PATHS:
            got = self.host.call(lambda b, p=path: ch.read(b, p))  # type: ignore[misc]
            assert got == self.live.get(path), (path, got, self.live.get(path))

    @invariant()
    def counters_never_negative(self) -> None:
        async def check(b: Built) -> None:
            for st in b.area.all.values():
                assert st.writers >= 0 and st.refs >= 0, st
            for node in b.fs.inodes.nodes():
                assert node.opens >= 0 and node.lookups >= 0, node

        self.host.call(check)


WriteBackModel.TestCase.settings = settings(
    max_examples=int(os.environ.get("AIRFS_MODEL_EXAMPLES", "100")),
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestWriteBackModel = WriteBackModel.TestCase


def test_parallel_writes_through_a_mapping_after_close_fork_once() -> None:
    """Regression (issue: writes through a mapping after ``close()`` lost): after the FLUSH of
    a mapped file's descriptor, the kernel's parallel write-backs of its pages each found the
    journaled version closed and forked it; every fork but the first failed with ENOENT
    ("removed while being opened"), so ``msync`` failed and those pages were lost."""
    mem = MemoryOrigin()
    with tempfile.TemporaryDirectory() as d:
        host = ch.CoreHost(LatencyOrigin(mem, 0.002), os.path.join(d, "cache"))
        try:
            host.call(lambda b: ch.write_file(b, "a", b"x" * 100))

            async def go(b: Built) -> None:
                fh = await ch.open_file(b, "a", os.O_RDWR)
                await b.fs.write(fh, 0, b"abc")
                await b.fs.flush(fh)  # close() of the descriptor; the mapping lives on
                async with trio.open_nursery() as n:
                    for i in range(3):
                        n.start_soon(b.fs.write, fh, 10 + i * 8, bytes([65 + i]) * 8)
                await b.fs.fsync(fh)  # msync(MS_SYNC)
                await b.fs.release(fh)  # munmap

            host.call(go)
            want = b"abc" + b"x" * 7 + b"A" * 8 + b"B" * 8 + b"C" * 8 + b"x" * 66
            assert host.call(lambda b: ch.read(b, "a")) == want
            host.call(lambda b: b.uploader.flush(""))
            assert mem.read_range("a", 0, 1 << 20) == want
        finally:
            host.close()


def _steps(*steps: Callable[[WriteBackModel], None]) -> None:
    """Run ``steps`` on a fresh model, checking what the mount shows after each."""
    m = WriteBackModel()
    try:
        m.start()
        for step in steps:
            step(m)
            m.mount_shows_live_content()
    finally:
        m.teardown()


def test_rewrite_during_a_commit_cut_twice_is_not_a_conflict() -> None:
    """Issue 20, item 2: a commit lands, the daemon dies before the journal knows, while a
    rewrite was closed meanwhile; after the restart the rewrite's commit (over our own older
    version) is cut before its rename: after the next restart it was a false conflict (the
    older version's record had been dropped at the first restart)."""
    _steps(
        lambda m: m.crash_in_commit("a", b"one", b"two", linked=True, again=False),
        lambda m: m.flush(),
    )


def test_a_rewrite_after_a_landed_put_reported_failed_is_not_a_conflict() -> None:
    """Found by the model with shorter waits: a put lands at the origin but reports a
    transient failure (its response lost: a timeout, a reset connection), and the file is
    rewritten and closed before the retry. The rewrite's commit, *If-Match* the version
    before both, found our own first version at the origin and was reported a conflict (its
    bytes moved to ``conflicts/``, ``flush`` failed): only versions kept from a crash were
    recognised as ours, not an older version still waiting in memory."""
    m = WriteBackModel()
    try:
        m.start()
        m.write_close("a", b"zero", trunc=True)
        m.flush()
        cut = m.faulty.arm(linked=True)  # the next put lands, then fails
        m.host.call(lambda b: ch.write_file(b, "a", b"one", os.O_TRUNC))
        assert cut.reached.wait(CUT_WAIT_S)
        m.write_close("a", b"two", trunc=True)  # closed while the first put hangs
        cut.release.set()  # ... which now reports a transient failure
        m.live["a"] = m.closed["a"] = b"two"
        m.mount_shows_live_content()
        m.flush()
    finally:
        m.teardown()


def _put_lands_then_fails(
    m: WriteBackModel, path: str, data: bytes, *, linked: bool = True
) -> None:
    """Write ``path`` and make its commit's put fail, after it landed (``linked``) or before;
    return once the failure is known (nothing uploading)."""

    async def errors(b: Built) -> int:
        return b.uploader.statistics().errors

    before = m.host.call(errors)
    cut = m.faulty.arm(linked=linked)
    m.host.call(lambda b: ch.write_file(b, path, data, os.O_TRUNC))
    m.live[path] = m.closed[path] = data
    assert cut.reached.wait(CUT_WAIT_S)
    cut.release.set()

    async def failed(b: Built) -> bool:
        st = b.uploader.statistics()
        return st.uploading == 0 and st.errors > before

    deadline = time.monotonic() + CUT_WAIT_S
    while not m.host.call(failed):
        assert time.monotonic() < deadline
        time.sleep(0.01)


def _put_lands_then_fails_then_rewrite(m: WriteBackModel, crash: bool) -> None:
    m.start()
    m.write_close("b", b"zero", trunc=True)
    m.flush()
    _put_lands_then_fails(m, "b", b"one")  # known failed before the rewrite
    m.write_close("b", b"two", trunc=True)  # the failed version is superseded and dropped
    if crash:
        m.crash()
    m.mount_shows_live_content()
    m.flush()


def test_a_rewrite_after_a_landed_put_was_reported_failed_is_not_a_conflict() -> None:
    """The model with shorter waits, again: as above, but the rewrite comes after the
    failure was known, so the failed version is dropped when the rewrite closes (a newer
    closed version supersedes it); its bytes at the origin were then no version we knew.
    A failed put's fingerprint (size, MD5) is kept until a commit lands."""
    m = WriteBackModel()
    try:
        _put_lands_then_fails_then_rewrite(m, crash=False)
    finally:
        m.teardown()


def test_a_landed_put_reported_failed_is_known_as_ours_after_a_crash() -> None:
    """The same, with a crash after the rewrite's close: the fingerprint is in the rewrite's
    journal record, so the restarted daemon recognises the origin's object as ours."""
    m = WriteBackModel()
    try:
        _put_lands_then_fails_then_rewrite(m, crash=True)
    finally:
        m.teardown()


@pytest.mark.parametrize("crash", [False, True])
@pytest.mark.parametrize("op", ["rename", "unlink"])
def test_a_new_file_whose_put_landed_but_failed_leaves_nothing_at_its_old_name(
    op: str, crash: bool
) -> None:
    """Found by the model's failed-put step: a new file (never committed: nothing at the
    origin as far as the journal knows) whose put landed but reported a failure, then renamed
    (or deleted) locally: its bytes stayed at the origin under the old name, and the mount
    showed the file at both names (or the deleted one again). The name operation removes
    such a leftover (only one with the failed put's fingerprint), after a crash too."""
    m = WriteBackModel()
    try:
        m.start()
        _put_lands_then_fails(m, "a", b"new file")
        if crash:
            m.crash()
        if op == "rename":
            m.rename("a", "c")
        else:
            m.unlink("a")
        m.mount_shows_live_content()
        m.flush()
    finally:
        m.teardown()


def test_a_name_operation_leaves_another_writers_object_alone() -> None:
    """The leftover removed by a rename or unlink is only one of ours: an object another
    writer put at the old name meanwhile (not a failed put's fingerprint) stays."""
    m = WriteBackModel()
    try:
        m.start()
        _put_lands_then_fails(m, "a", b"new file")
        m.mem.put_bytes("a", b"another writer's")
        m.unlink("a")
        assert m.mem.read_range("a", 0, 100) == b"another writer's"
    finally:
        m.teardown()


@pytest.mark.parametrize("how", ["rename", "create"])
def test_a_file_replaced_locally_keeps_what_its_failed_put_may_have_left(how: str) -> None:
    """Found by the model (steps shrunk): ``c``'s put lands but fails; before its retry, ``c``
    is replaced locally, by the rename of a file never committed (which commits to ``c``
    *If-Match* what ``c`` replaced at the origin) or by a new file created over it. The
    replacing file's commit found ``c``'s landed bytes at the origin and took them for
    another writer's (a conflict; the mount then showed the failed put's bytes): the
    replaced file's fingerprints go to the file that replaces it."""
    m = WriteBackModel()
    try:
        m.start()
        m.write_close("c", b"committed", trunc=True)
        m.flush()
        _put_lands_then_fails(m, "c", b"landed, reported failed")
        if how == "rename":
            _put_lands_then_fails(m, "b", b"never committed", linked=False)
            m.rename("b", "c")
        else:

            async def create(b: Built) -> None:
                fh, _ = await b.fs.create(ROOT_INO, "c", 0o644, os.O_WRONLY | os.O_CREAT)
                await b.fs.write(fh, 0, b"created over it")
                await ch.close(b, fh)

            m.host.call(create)
            m.live["c"] = m.closed["c"] = b"created over it"
        m.mount_shows_live_content()
        m.flush()
    finally:
        m.teardown()
