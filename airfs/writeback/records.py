"""How staged versions are recorded on disk: the journal record of a closed version (in the
journal, and a copy on its staging file's :data:`~airfs.writeback.journal.RECORD_XATTR`), the
path attribute every staging file carries, and the record numbers (``seq``).

:class:`Records` only *queues* these changes on the :class:`~airfs.writeback.diskq.DiskQueue`
(in order, applied off the loop; on disk once the queue settles). Which version is recorded
when is the staging area's life cycle (:mod:`airfs.writeback.staging`)."""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterable

from .diskq import DiskQueue
from .journal import DONE_XATTR, OPEN_XATTR, PATH_XATTR, RECORD_XATTR, OpenRecord, Record
from .versions import Staged

__all__ = ["Records"]


def _record(st: Staged) -> Record:
    ps = st.ps
    assert ps is not None and ps.path is not None and st.seq is not None
    return Record(
        st.id,
        ps.path,
        ps.base,
        st.mode,
        st.mtime_ns,
        st.seq,
        st.first_pending_ns,
        st.uid,
        st.gid,
        unsure=tuple(ps.unsure),
    )


class Records:
    """The records of staged versions, queued on ``disk``. Trio loop only."""

    def __init__(self, disk: DiskQueue) -> None:
        self.disk = disk
        self._seq = itertools.count(int(time.time() * 1000))

    def seen(self, seq: int) -> None:
        """A recovered record numbered ``seq``: new records are numbered after it."""
        self._seq = itertools.count(max(next(self._seq), seq + 1))

    def name(self, st: Staged, path: str) -> None:
        """``st``'s file will be committed to ``path`` (what recovery names it by)."""
        self.disk.set_xattr(st.fd, PATH_XATTR, path.encode("utf-8", "surrogateescape"), st.id)

    def describe(self, st: Staged) -> None:
        """Record what version ``st``, open for writing (not journaled), commits with: the
        origin version it replaces, its mode, times and owner (a daemon that takes over the
        mount adopts it with them, see :mod:`airfs.writeback.recovery`). Called when such a
        version is made, and again by :meth:`rewrite` whenever one of these changes."""
        ps = st.ps
        if ps is None or ps.path is None or st.seq is not None:
            return
        rec = OpenRecord(ps.base, st.mode, st.mtime_ns, st.uid, st.gid)
        self.disk.set_xattr(st.fd, OPEN_XATTR, rec.encode(), st.id)

    def close(self, st: Staged, drop: list[Staged]) -> None:
        """Record ``st`` as closed at its generation (numbered once: a version closed again
        keeps its number and the time it first became pending), deleting the records of
        the older versions ``drop`` it supersedes in the same transaction."""
        ps = st.ps
        assert ps is not None and ps.path is not None
        seq = next(self._seq) if st.seq is None else st.seq
        first = time.time_ns() if st.seq is None else st.first_pending_ns
        rec = Record(
            st.id,
            ps.path,
            ps.base,
            st.mode,
            st.mtime_ns,
            seq,
            first,
            st.uid,
            st.gid,
            unsure=tuple(ps.unsure),
        )
        for v in drop:
            if v.seq is not None:
                self.disk.remove_xattr(v.fd, RECORD_XATTR, v.id)
        self.disk.write(puts=(rec,), deletes=[v.id for v in drop if v.seq is not None])
        if st.journaled_gen != st.gen:
            st.closed_at = time.monotonic()
        st.seq, st.first_pending_ns, st.journaled_gen = seq, first, st.gen
        if drop:
            st.first_pending_ns = min(v.first_pending_ns or first for v in [st, *drop])
        self.disk.set_xattr(st.fd, RECORD_XATTR, rec.encode(), st.id)
        for v in drop:
            v.seq = None

    def rewrite(
        self, versions: Iterable[Staged], *, forget: Iterable[Staged] = (), done: bool = False
    ) -> None:
        """Write the records of the recorded ``versions`` again (their path, base, mode,
        times or owner changed) and delete those of ``forget`` (their ``seq`` cleared), in
        one transaction; with ``done``, every one of ``forget`` is marked :meth:`done`.
        The description of those of ``versions`` still open for writing is written again
        (:meth:`describe`)."""
        forget = list(forget)
        versions = list(versions)
        if done:
            self.done(forget)  # queued first, applied after the records' deletion
        for v in versions:
            if v.seq is None:
                self.describe(v)
        gone = [v for v in forget if v.seq is not None]
        sts = [v for v in versions if v.seq is not None and v.path is not None]
        if not sts and not gone:
            return
        for v in gone:
            self.disk.remove_xattr(v.fd, RECORD_XATTR, v.id)
        recs = [_record(v) for v in sts]
        self.disk.write(puts=recs, deletes=[v.id for v in gone])
        for v, rec in zip(sts, recs, strict=True):
            self.disk.set_xattr(v.fd, RECORD_XATTR, rec.encode(), v.id)
        for v in gone:
            v.seq = None

    def done(self, versions: Iterable[Staged]) -> None:
        """``versions`` need nothing more (committed, superseded or deleted: their files
        stay only while open, or until their deletion is applied): marked so, after their
        records' deletion queued before, so that a crash before their files are gone does
        not keep them in ``recovered/`` as files open for writing."""
        for v in versions:
            self.disk.set_xattr(v.fd, DONE_XATTR, b"1", v.id)

    def drop(self, st: Staged) -> None:
        """Delete ``st``'s staging file (and close it) once the queue gets there, marked
        :meth:`done` first: recovery deletes it should a crash come before."""
        self.done((st,))
        self.disk.drop(st.file, st.fd, st.id)
