"""Where the disk queue's batches run while the disk is fast (handed to a journal thread the
trio loop waits on briefly, or on the loop itself), else in a worker thread; and the stall
guard that decides which.

A small-file close must be on disk before it returns (its journal record and attributes:
:mod:`airfs.writeback.diskq`), and one slow disk must never stall every request. A worker-thread
round trip costs 150-600 us on a busy 2-core VM against ~20 us for the LMDB transaction and
the ``fsetxattr`` calls of a small batch, so a batch runs, by :attr:`Applier.mode`:

* ``"loop"``: on the loop itself, when it is *small* (the caller says so: at
  most :data:`~airfs.writeback.diskq.LOOP_MAX_OPS` records and attributes, no file deletion,
  no ``sync``) and the guard says the disk is fast; the batch is timed, and one that took longer
  than :data:`SLOW_S` marks the disk slow for :data:`BACKOFF_S` (doubling, up to
  :data:`BACKOFF_MAX_S`, while it stays slow), during which every batch runs in a worker
  thread (and is timed there: a slow disk keeps the backoff going). A batch's time leaves out
  what its thread waited for a CPU (``/proc/thread-self/schedstat``): a busy machine is not a
  slow disk. The worst a disk that turns slow can do is stall the loop for the one batch that
  finds out.
* ``"handoff"`` (the default): in a dedicated journal thread (kept started, waiting on a
  queue), the loop *waiting* for it at most :data:`HANDOFF_WAIT_S` (blocked, not spinning: no trio
  machinery, one futex wake each way); one not done by then is awaited off the loop (a stall
  of the loop is bounded by :data:`HANDOFF_WAIT_S` even for a disk that hangs), and marks the
  disk slow as above if its own time in the journal thread was over :data:`SLOW_S` (a wait
  for the GIL or a CPU before it ran is not the disk's).
* ``"thread"``: always a trio worker thread (the code before issue 22; one round trip per
  batch).

Concurrent closes share a batch in every mode (the queue's lock: what arrives while a batch
runs is the next batch). The three were measured side by side (``scripts/bench/small_close.py``,
docs/benchmarks.md "Issue 22: small writes"): ``handoff`` was the fastest on the busy 2-core
VM, and ``loop`` stalled the loop for up to 0.7 s on the batch that found the disk slow, so
``handoff`` is the default.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

import trio

__all__ = ["MODES", "Applier", "ApplierStats", "StallGuard"]

T = TypeVar("T")

MODES = ("loop", "handoff", "thread")
#: how long the loop waits for a batch handed to the journal thread before it awaits it off
#: the loop (about what the worker-thread round trip it saves would cost)
HANDOFF_WAIT_S = 0.002
#: a batch whose own time is longer than this marks the disk slow (on the loop: what it may
#: have stalled every request for; handed over: a disk this slow would time out every wait)
SLOW_S = 0.02
#: how long the disk stays marked slow after a slow batch (doubled at each slow batch in a
#: row, up to BACKOFF_MAX_S; back to BACKOFF_S once a batch is fast again)
BACKOFF_S = 1.0
BACKOFF_MAX_S = 60.0


@dataclass(frozen=True, slots=True)
class ApplierStats:
    """``Applier.statistics()``: batches run on the loop, handed to the journal thread (and
    done within the wait), in worker threads, and the slow batches the guard saw."""

    mode: str
    on_loop: int
    handed: int
    threaded: int
    slow: int


class StallGuard:
    """Whether the disk is fast now: false for a while after a slow batch."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._until = 0.0
        self._backoff = BACKOFF_S
        self.slow = 0

    def fast(self) -> bool:
        return self._clock() >= self._until

    def observe(self, seconds: float) -> None:
        """A batch took ``seconds`` (on the loop or in a thread)."""
        now = self._clock()
        if seconds > SLOW_S:
            self.slow += 1
            if now < self._until:  # slow again while backing off: back off longer
                self._backoff = min(self._backoff * 2, BACKOFF_MAX_S)
            self._until = now + self._backoff
        elif now >= self._until:
            self._backoff = BACKOFF_S


#: this thread's scheduler statistics: the second field is the time it waited for a CPU (ns)
SCHEDSTAT = "/proc/thread-self/schedstat"


def open_schedstat() -> int:
    """A descriptor on the calling thread's :data:`SCHEDSTAT` (-1 where there is none)."""
    try:
        return os.open(SCHEDSTAT, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return -1


def cpu_wait_s(fd: int) -> float:
    """How long the thread of ``fd`` (:func:`open_schedstat`) has waited for a CPU, in
    seconds: time a busy machine took from a batch, not the disk (0 without the file)."""
    if fd < 0:
        return 0.0
    try:
        return int(os.pread(fd, 64, 0).split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


def timed(fn: Callable[[], T], fd: int) -> tuple[T, float]:
    """``fn()`` and how long it took, less the time its thread waited for a CPU meanwhile
    (read only when it took longer than :data:`SLOW_S`: a batch is slow by the disk, a
    preempted one is not)."""
    t, w = time.perf_counter(), cpu_wait_s(fd)
    try:
        out = fn()
    finally:
        took = time.perf_counter() - t
        if took > SLOW_S:
            took -= cpu_wait_s(fd) - w
    return out, took


class _Job(Generic[T]):
    def __init__(self, fn: Callable[[], T]) -> None:
        self.fn = fn
        self.done = threading.Event()
        self.result: T | None = None
        self.exc: BaseException | None = None
        self.seconds = 0.0

    def run(self) -> None:
        fd = open_schedstat()
        t = time.perf_counter()
        try:
            self.result, self.seconds = timed(self.fn, fd)
        except BaseException as exc:  # handed back to the loop
            self.exc = exc
            self.seconds = time.perf_counter() - t
        finally:
            if fd >= 0:
                os.close(fd)
            self.done.set()

    def outcome(self) -> T:
        if self.exc is not None:
            raise self.exc
        return self.result  # type: ignore[return-value]


class _JournalThread:
    """One thread running jobs in order, started on first use, stopped by :meth:`close`."""

    def __init__(self) -> None:
        self._q: queue.SimpleQueue[_Job[object] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def submit(self, job: _Job[object]) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="airfs-journal", daemon=True)
            self._thread.start()
        self._q.put(job)

    def _run(self) -> None:
        while (job := self._q.get()) is not None:
            job.run()

    def close(self) -> None:
        if self._thread is not None:
            self._q.put(None)
            self._thread.join()
            self._thread = None


class Applier:
    """Runs a blocking batch function where :attr:`mode` says (see the module docstring).
    Trio loop only, one batch at a time (the disk queue's lock)."""

    def __init__(self, mode: str = "handoff", clock: Callable[[], float] = time.monotonic) -> None:
        if mode not in MODES:
            raise ValueError(f"journal apply mode {mode!r}: one of {', '.join(MODES)}")
        self.mode = mode
        self.guard = StallGuard(clock)
        self._thread = _JournalThread()
        self._on_loop = 0
        self._loop_fd = -2  # the loop thread's schedstat, opened on first use
        self._handed = 0
        self._threaded = 0

    def runs_fast(self) -> bool:
        """Whether a small batch would run fast now (on the loop, or handed over and waited
        for), not in a worker thread."""
        return self.mode != "thread" and self.guard.fast()

    async def run(self, fn: Callable[[], T], *, small: bool) -> T:
        """``fn()``'s result (or exception); on the loop only when ``small`` and the disk is
        fast. The caller shields it from cancellation (its accounting must follow it)."""
        fast = small and self.guard.fast()
        if fast and self.mode == "loop":
            if self._loop_fd == -2:
                self._loop_fd = open_schedstat()  # the loop's thread: open it there
            t = time.perf_counter()
            self._on_loop += 1
            try:
                out, took = timed(fn, self._loop_fd)
            except BaseException:
                self.guard.observe(time.perf_counter() - t)
                raise
            self.guard.observe(took)
            return out
        job: _Job[T] = _Job(fn)
        if fast and self.mode == "handoff":
            self._thread.submit(job)  # type: ignore[arg-type]
            if job.done.wait(HANDOFF_WAIT_S):
                self._handed += 1
                self.guard.observe(job.seconds)
                return job.outcome()
            # not done in time: awaited off the loop; slow or not by its own time (a wait for
            # the GIL or a CPU before it ran is the machine's, not the disk's)
            await trio.to_thread.run_sync(job.done.wait)
            self.guard.observe(job.seconds)
        else:
            await trio.to_thread.run_sync(job.run)
            self.guard.observe(job.seconds)
        self._threaded += 1
        return job.outcome()

    def statistics(self) -> ApplierStats:
        return ApplierStats(self.mode, self._on_loop, self._handed, self._threaded, self.guard.slow)

    def close(self) -> None:
        """Stop the journal thread (after the jobs handed to it)."""
        self._thread.close()
        if self._loop_fd >= 0:
            os.close(self._loop_fd)
        self._loop_fd = -2
