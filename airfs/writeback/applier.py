"""Where the disk queue's batches run: on the trio loop while the disk is fast, else in a
worker thread; and the stall guard that decides which.

A small-file close must be on disk before it returns (its journal record and attributes:
:mod:`airfs.writeback.diskq`), and one slow disk must never stall every request. A worker-thread
round trip costs 150-600 us on a busy 2-core VM against ~20 us for the LMDB transaction and
the ``fsetxattr`` calls of a small batch, so a batch runs, by :attr:`Applier.mode`:

* ``"loop"`` (the default): on the loop itself, when it is *small* (the caller says so: at
  most :data:`~airfs.writeback.diskq.LOOP_MAX_OPS` changes, no large file to delete, no
  ``sync``) and the guard says the disk is fast; the batch is timed, and one that took longer
  than :data:`SLOW_S` marks the disk slow for :data:`BACKOFF_S` (doubling, up to
  :data:`BACKOFF_MAX_S`, while it stays slow), during which every batch runs in a worker
  thread (and is timed there: a slow disk keeps the backoff going). The worst a disk that
  turns slow can do is stall the loop for the one batch that finds out.
* ``"handoff"``: in a dedicated journal thread (kept started), the loop *waiting* for it at
  most :data:`SLOW_S` (blocked, not spinning); one not done by then is awaited off the loop
  and marks the disk slow (a stall of the loop is bounded by :data:`SLOW_S` even for a disk
  that hangs), at the price of two thread switches per batch.
* ``"thread"``: always a trio worker thread (the code before issue 22; one round trip per
  batch).

Concurrent closes share a batch in every mode (the queue's lock: what arrives while a batch
runs is the next batch). The three were measured side by side (``scripts/bench/write_loop.py``,
docs/benchmarks.md "Issue 22: small writes").
"""

from __future__ import annotations

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
#: a batch that takes longer than this marks the disk slow (it cost the loop more than the
#: worker-thread round trip it saved)
SLOW_S = 0.002
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


class _Job(Generic[T]):
    def __init__(self, fn: Callable[[], T]) -> None:
        self.fn = fn
        self.done = threading.Event()
        self.result: T | None = None
        self.exc: BaseException | None = None
        self.seconds = 0.0

    def run(self) -> None:
        t = time.perf_counter()
        try:
            self.result = self.fn()
        except BaseException as exc:  # handed back to the loop
            self.exc = exc
        finally:
            self.seconds = time.perf_counter() - t
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

    def __init__(self, mode: str = "loop", clock: Callable[[], float] = time.monotonic) -> None:
        if mode not in MODES:
            raise ValueError(f"journal apply mode {mode!r}: one of {', '.join(MODES)}")
        self.mode = mode
        self.guard = StallGuard(clock)
        self._thread = _JournalThread()
        self._on_loop = 0
        self._handed = 0
        self._threaded = 0

    async def run(self, fn: Callable[[], T], *, small: bool) -> T:
        """``fn()``'s result (or exception); on the loop only when ``small`` and the disk is
        fast. The caller shields it from cancellation (its accounting must follow it)."""
        fast = small and self.guard.fast()
        if fast and self.mode == "loop":
            t = time.perf_counter()
            try:
                return fn()
            finally:
                self._on_loop += 1
                self.guard.observe(time.perf_counter() - t)
        job: _Job[T] = _Job(fn)
        if fast and self.mode == "handoff":
            self._thread.submit(job)  # type: ignore[arg-type]
            if job.done.wait(SLOW_S):
                self._handed += 1
                self.guard.observe(job.seconds)
                return job.outcome()
            self.guard.observe(float("inf"))  # not done in time: the disk (or CPU) is slow
            await trio.to_thread.run_sync(job.done.wait)
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
