"""The staging area's disk changes, in order, applied in batches in a worker thread.

Every change the staging area makes to disk besides the bytes of a file (journal records, the
record and path extended attributes of staging files, closing and deleting staging files) is
*queued* here by the trio loop, in the order the area makes it, and applied by
:meth:`DiskQueue.settle` one batch at a time: while the disk is fast, a batch of at most
:data:`LOOP_MAX_OPS` records and attributes runs on the loop itself, the deletions and closes of
files queued with it waiting (in order) for the next batch made in a worker thread (the daemon
settles every second with ``sync``, which always runs there, and a backlog of
:data:`CLEANUP_BACKLOG` forces one); anything else runs in one worker-thread job
(:mod:`airfs.writeback.applier`, which also says the stall guard). A staging file is marked
done (:data:`~airfs.writeback.journal.DONE_XATTR`) when its deletion is queued, so a crash
before the deletion lets recovery delete it.

Contracts:

* **Order.** Batches are applied one at a time, each the queue's content when it is taken.
  Within a batch the changes are grouped: first the record attributes that end removed, then
  one LMDB transaction holding the batch's net puts and deletes, then the attributes that end
  set, then the deletions and closes of files. Each staging file's own sequence (attribute
  removed before its record is deleted; record written before its attribute is set; file
  deleted after its record) is the one :mod:`airfs.writeback.recovery` relies on, and the
  records written by one call (a directory rename's) change all or nothing.
* **Durability.** A change is on disk (it survives a daemon crash) once a :meth:`settle`
  started after it was queued has returned without error; ``settle(sync=True)`` also syncs
  the journal (power loss). The filesystem core settles at the end of every operation that
  queued a durable change, so a ``close``, ``rename`` or ``unlink`` that returned is on disk,
  as before this queue.
* **Failure.** When the journal refuses a batch (disk or map full), the changes of each set
  of staging files that no change links to another are applied on their own: what the journal
  still takes is applied (a file created and deleted within the batch nets to no journal
  change, so deleting a staged file frees its space even with the journal full), and a
  refused set stays queued, in order. :meth:`settle` raises
  ``OSError(ENOSPC)`` to a caller whose own changes stayed queued; every later settle tries
  them again (the daemon settles every second), so nothing queued is dropped.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
from collections.abc import Iterable
from dataclasses import dataclass

import trio

from .applier import Applier, ApplierStats
from .journal import Journal, Record

__all__ = ["LOOP_MAX_OPS", "DiskQueue", "QueueStats"]

#: cleanup changes (closes, unlinks) queued beyond which an operation settles even if it
#: queued nothing durable (bounds the descriptors and files waiting to be dropped)
CLEANUP_BACKLOG = 256
#: batches of at most this many changes may be applied on the loop (a close queues 3 or 4)
LOOP_MAX_OPS = 64

_JOURNAL, _SETX, _RMX, _UNLINK, _DROP = range(5)


@dataclass(frozen=True, slots=True)
class QueueStats:
    """``DiskQueue.statistics()``."""

    queued: int
    batches: int
    applied: int
    failures: int
    last_error: str | None
    #: where the batches ran (:mod:`airfs.writeback.applier`)
    applier: ApplierStats


@dataclass(frozen=True, slots=True)
class _Op:
    n: int  # 1-based position in the queue
    kind: int
    #: the staging files it concerns (ids and descriptors): changes of one file keep order
    keys: frozenset[str | int]
    puts: tuple[Record, ...] = ()
    deletes: tuple[str, ...] = ()
    fd: int = -1
    name: str = ""
    value: bytes = b""
    path: str = ""


class DiskQueue:
    """Queued disk changes of one staging area (see the module docstring). Enqueue from the
    trio loop only."""

    def __init__(self, journal: Journal, applier: Applier | None = None) -> None:
        self.journal = journal
        #: where batches run (on the loop while the disk is fast, else in a worker thread)
        self.applier = applier if applier is not None else Applier()
        self._ops: list[_Op] = []
        self._queued = 0  # ops ever queued
        self._applied = 0
        self._lock = trio.Lock()
        #: one journal sync at a time, outside ``_lock`` (see :meth:`settle`)
        self._sync_lock = trio.Lock()
        self._last_durable = 0  # number of the last journal or attribute op queued
        self.batches = 0
        self.failures = 0
        self.last_error: str | None = None

    # -- queueing (loop) -------------------------------------------------------------------

    def _put(self, kind: int, keys: frozenset[str | int], durable: bool, **kw: object) -> None:
        self._queued += 1
        self._ops.append(_Op(self._queued, kind, keys, **kw))  # type: ignore[arg-type]
        if durable:
            self._last_durable = self._queued

    def write(self, puts: Iterable[Record] = (), deletes: Iterable[str] = ()) -> None:
        """Put and delete journal records (in one transaction, with the rest of its batch)."""
        p, d = tuple(puts), tuple(deletes)
        if p or d:
            keys = frozenset([*(r.id for r in p), *d])
            self._put(_JOURNAL, keys, True, puts=p, deletes=d)

    def set_xattr(self, fd: int, name: str, value: bytes, rid: str) -> None:
        """Set attribute ``name`` of staging file ``rid`` (open as ``fd``)."""
        self._put(_SETX, frozenset((fd, rid)), True, fd=fd, name=name, value=value)

    def remove_xattr(self, fd: int, name: str, rid: str) -> None:
        self._put(_RMX, frozenset((fd, rid)), True, fd=fd, name=name)

    def unlink(self, path: str, rid: str) -> None:
        """Delete the file ``path`` (staging file ``rid``'s, or a kept older copy)."""
        self._put(_UNLINK, frozenset((rid,)), False, path=path)

    def drop(self, path: str, fd: int, rid: str) -> None:
        """Delete staging file ``rid`` at ``path`` and close ``fd``, after every change
        queued before it (which may use ``fd``)."""
        self._put(_DROP, frozenset((fd, rid)), False, path=path, fd=fd)

    @property
    def mark(self) -> int:
        """A position in the queue, for :meth:`wants_settle` and :meth:`settle`."""
        return self._queued

    def wants_settle(self, since: int = 0) -> bool:
        """A durable change was queued after position ``since`` (it may not be on disk yet),
        or many cleanups are queued."""
        return self._last_durable > since or len(self._ops) > CLEANUP_BACKLOG

    # -- applying --------------------------------------------------------------------------

    async def settle(self, *, since: int = 0, sync: bool = False, files: bool = False) -> None:
        """Return once every change queued after position ``since`` and before the call is
        on disk (with ``sync``, the journal synced too; with ``files``, the deletions and
        closes of staging files queued before the call done too, which a batch on the loop
        leaves to the next one in a worker thread). Concurrent callers share batches
        (one transaction for all of them). ``OSError(ENOSPC)`` if the journal refused some
        of those changes: they stay queued (see the module docstring).

        The sync runs after the batch, outside the queue's lock, in a worker thread of its
        own: on ext4 an ``fsync`` of the journal waits for the data the kernel is writing
        back meanwhile (seconds while a big file is staged), and the operations that only
        need their changes applied (a ``close``, ``rename``, ``unlink``) must not wait for
        it."""
        await self._apply(since=since, threaded=sync or files)
        if sync:
            async with self._sync_lock:
                try:
                    await trio.to_thread.run_sync(self.journal.sync)
                except OSError as exc:
                    self.failures += 1
                    self.last_error = str(exc)
                    raise

    async def _apply(self, *, since: int, threaded: bool) -> None:
        """:meth:`settle` less the sync: the changes queued after ``since`` applied (all in
        a worker thread, the files' deletions included, when ``threaded``)."""
        target = self._queued

        def mine() -> list[_Op]:
            return [op for op in self._ops if since < op.n <= target]

        async with self._lock:
            if not mine():
                return
            batch, self._ops = self._ops, []
            files = [op for op in batch if op.kind in (_UNLINK, _DROP)]
            fast = (
                not threaded
                and len(files) <= CLEANUP_BACKLOG
                and len(batch) - len(files) <= LOOP_MAX_OPS
                and self.applier.runs_fast()
            )
            # on the loop: the records and attributes now; the files' deletions (each
            # marked done first: recovery deletes it) wait for the next threaded batch
            now, later = (
                ([op for op in batch if op.kind not in (_UNLINK, _DROP)], files)
                if fast
                else (batch, [])
            )
            try:
                with trio.CancelScope(shield=True):  # the accounting below must follow it
                    kept, exc = (
                        await self.applier.run(
                            functools.partial(apply_batch, self.journal, now, False), small=fast
                        )
                        if now
                        else ([], None)
                    )
                    applied = len(now) - len(kept)
                    failed = exc
                    if later and failed is not None:  # journal full: free space now
                        retry, later = sorted(kept + later, key=lambda op: op.n), []
                        kept, exc = await trio.to_thread.run_sync(
                            apply_batch, self.journal, retry, False
                        )
                        applied += len(retry) - len(kept)
            except BaseException:
                self._ops = batch + self._ops  # a bug: keep everything, say it
                raise
            self._ops = sorted(kept + later, key=lambda op: op.n) + self._ops
            self._applied += applied
            self.batches += 1
            exc = exc or failed
            if exc is not None:
                self.failures += 1
                self.last_error = str(exc)
            left = [op for op in kept if since < op.n <= target]
            if left or (threaded and exc is not None):
                raise OSError(
                    errno.ENOSPC,
                    f"journal: {len(left)} change(s) not recorded yet, retried every "
                    f"second ({exc})",
                )

    def settle_now(self) -> None:
        """Apply everything pending in this thread (at close, when no task runs); raises
        ``OSError`` if some changes could not be applied."""
        batch, self._ops = self._ops, []
        kept, exc = apply_batch(self.journal, batch, False)
        self._ops = kept
        self._applied += len(batch) - len(kept)
        if kept:
            raise OSError(errno.ENOSPC, f"journal: {len(kept)} change(s) not recorded ({exc})")

    def statistics(self) -> QueueStats:
        return QueueStats(
            len(self._ops),
            self.batches,
            self._applied,
            self.failures,
            self.last_error,
            self.applier.statistics(),
        )

    def close(self) -> None:
        """Stop the applier's thread (nothing is applied after; see :meth:`settle_now`)."""
        self.applier.close()


def apply_batch(journal: Journal, batch: list[_Op], sync: bool) -> tuple[list[_Op], OSError | None]:
    """Apply ``batch`` as described in the module docstring (blocking). Returns the changes
    that stayed queued, in order, and the journal's error if it refused any."""
    exc: OSError | None = None
    kept: list[_Op] = []
    try:
        _apply_grouped(journal, batch)
    except OSError as e:
        exc = e
        kept = _apply_one_by_one(journal, batch)
    if sync:
        try:
            journal.sync()
        except OSError as e:
            exc = exc or e
    return kept, exc


def _apply_grouped(journal: Journal, batch: list[_Op]) -> None:
    puts: dict[str, Record] = {}
    deletes: dict[str, None] = {}
    attrs: dict[tuple[int, str], bytes | None] = {}
    for op in batch:
        if op.kind == _JOURNAL:
            for rid in op.deletes:
                puts.pop(rid, None)
                deletes[rid] = None
            for rec in op.puts:
                deletes.pop(rec.id, None)
                puts[rec.id] = rec
        elif op.kind == _SETX:
            attrs[op.fd, op.name] = op.value
        elif op.kind == _RMX:
            attrs[op.fd, op.name] = None
    for (fd, name), value in attrs.items():
        if value is None:
            with contextlib.suppress(OSError):
                os.removexattr(fd, name)
    if puts or deletes:
        journal.write(puts=puts.values(), deletes=deletes)
    for (fd, name), value in attrs.items():
        if value is not None:
            with contextlib.suppress(OSError):  # unsupported here: the journal still is
                os.setxattr(fd, name, value)
    for op in batch:
        if op.kind in (_UNLINK, _DROP):
            _apply_file_op(op)


def _apply_one_by_one(journal: Journal, batch: list[_Op]) -> list[_Op]:
    """After the grouped transaction was refused: the changes of each set of staging files
    that no change links to another (a file, or the files of one rename) are applied on
    their own, grouped the same way. A file whose record was put and deleted within the
    batch nets to no journal change at all, so deleting a staged file frees its space even
    with the journal full. Returns the refused groups' changes, in order."""
    parent: dict[str | int, str | int] = {}

    def root(k: str | int) -> str | int:
        while parent.setdefault(k, k) != k:
            parent[k] = parent[parent[k]]
            k = parent[k]
        return k

    for op in batch:
        first, *rest = op.keys
        for k in rest:
            parent[root(k)] = root(first)
    groups: dict[str | int, list[_Op]] = {}
    for op in batch:
        groups.setdefault(root(next(iter(op.keys))), []).append(op)
    kept: list[_Op] = []
    for ops in groups.values():
        try:
            _apply_grouped(journal, ops)
        except OSError:
            kept.extend(ops)
    kept.sort(key=lambda op: op.n)
    return kept


def _apply_file_op(op: _Op) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(op.path)
    if op.kind == _DROP:
        with contextlib.suppress(OSError):
            os.close(op.fd)
