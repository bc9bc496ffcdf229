"""Recovery at start: rebuild the staging area from the journal and the staging files.

Contract (nothing closed is ever silently dropped):

* every journaled file becomes pending again, in its original order; of two closed versions of
  one path (a rewrite closed while the previous version was being committed) the newer is
  committed, and the older is kept until then to recognise it should it have landed: its
  record stays in the journal, marked ``prior`` (never committed itself), so that it is still
  recognised after a second crash; it goes once the newer version lands (or the path is
  deleted), and a prior whose path has no newer record left is dropped;
* a staging file with no record (open for writing when the daemon died) is moved to
  ``recovered/<its path>`` and reported; an empty one with no path (a spare staging file
  never used) is deleted, and so is one marked done (committed, superseded or deleted, its
  file still open or its deletion not applied: :data:`~airfs.writeback.journal.DONE_XATTR`);
* a staging file whose own copy of its record (:data:`~airfs.writeback.journal.RECORD_XATTR`)
  is missing from the journal means the journal was deleted, emptied or damaged: start is
  refused with :class:`~airfs.writeback.journal.JournalDamaged` naming the way out, unless
  ``rebuild`` is set, in which case the journal is rebuilt from those copies;
* a record whose staging file is gone is reported (its bytes cannot be committed).

A daemon taking over a live mount (``keep_open``: the paths that the kernel holds open for
writing) *adopts* instead the staging file with no record of each such path, described by
its :data:`~airfs.writeback.journal.OPEN_XATTR` (or, written by an older airfs, by the
path's closed version it was copied from): it becomes the path's live version again, open,
dirty, with the base, mode and owner recorded, and the take-over reopens the writers'
handles on the path's live version (:func:`airfs.core.restore.restore`). One that no handle
reopens is kept in ``recovered/`` as above (:func:`finish_take_over`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import time
from collections.abc import Collection
from dataclasses import dataclass, field, replace

from .journal import (
    DONE_XATTR,
    OPEN_XATTR,
    PATH_XATTR,
    RECORD_XATTR,
    JournalDamaged,
    OpenRecord,
    Record,
)
from .staging import PathState, Staged, StagingArea
from .versions import UNSURE_MAX

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RecoveryReport:
    """What recovery found (logged, and shown by ``airfs status``)."""

    replayed: int = 0
    recovered: tuple[str, ...] = ()
    rebuilt: int = 0
    missing: tuple[str, ...] = field(default_factory=tuple)
    #: the paths whose commit a crash may have cut short (journaled, or open for writing):
    #: where a crashed commit may have left a temporary file at the origin
    paths: tuple[str, ...] = ()
    #: staging ids of the versions open for writing adopted for a take-over (``keep_open``)
    adopted: tuple[str, ...] = ()
    #: the files held open for writing by the kernel of a mount being taken over: no commit
    #: starts there until :func:`finish_take_over` (a closed version they have not written
    #: since would be committed and leave the staging area before their handles reopen it)
    held: tuple[PathState, ...] = field(default=(), compare=False, repr=False)


def _xattr(path: str, name: str) -> bytes | None:
    try:
        return os.getxattr(path, name)
    except OSError:
        return None


def open_area(
    cache_dir: str, *, limit: int, min_free: int | None, rebuild: bool, hint: str = ""
) -> StagingArea:
    """The staging area of ``cache_dir``. A journal that cannot even be opened (truncated,
    not LMDB) is refused with the way out; with ``rebuild`` it is moved aside
    (``journal.damaged.<time>``) and :func:`recover` rebuilds a new one from the staging
    files."""
    try:
        return StagingArea(cache_dir, limit=limit, min_free=min_free)
    except JournalDamaged as exc:
        if not rebuild:
            raise JournalDamaged(
                f"{exc}; nothing was changed. Rebuild it from the staging files: "
                f"{hint or 'mount with --rebuild-journal'}"
            ) from None
        aside = os.path.join(cache_dir, f"journal.damaged.{int(time.time())}")
        os.rename(os.path.join(cache_dir, "journal"), aside)
        log.warning("damaged journal moved to %s; rebuilding it: %s", aside, exc)
        return StagingArea(cache_dir, limit=limit, min_free=min_free)


def recover(
    area: StagingArea,
    *,
    rebuild: bool = False,
    hint: str = "",
    keep_open: Collection[str] = (),
) -> RecoveryReport:
    """Rebuild ``area`` after a restart (see the module docstring). ``hint`` completes the
    refusal message with the command that rebuilds the journal; ``keep_open``: the paths
    held open for writing by the kernel of a mount being taken over (their versions open
    for writing are adopted, not moved to ``recovered/``)."""
    records = {r.id: r for r in area.journal.records()}
    names = sorted(os.listdir(area.dir))
    orphans: dict[str, Record] = {}
    for name in names:
        if name in records:
            continue
        raw = _xattr(os.path.join(area.dir, name), RECORD_XATTR)
        if raw is None:
            continue
        try:
            rec = Record.decode(raw)
        except (ValueError, TypeError):
            continue
        if rec.prior:  # a prior whose record was deleted (its file's deletion cut short)
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(area.dir, name))
            continue
        orphans[name] = rec
    if orphans and not rebuild:
        raise JournalDamaged(
            f"the journal in {area.journal_dir} has lost the records of {len(orphans)} closed "
            f"file(s) waiting for their commit (deleted, emptied or damaged); nothing was "
            f"changed. Rebuild it from the staging files: {hint or 'mount with --rebuild-journal'}"
        )
    if orphans:
        area.journal.write(puts=orphans.values())
        records.update(orphans)
        log.warning("journal rebuilt from %d staging file(s)", len(orphans))
    missing = []
    replayed: list[Staged] = []
    by_path: dict[str, list[Record]] = {}
    for rec in sorted(records.values(), key=lambda r: r.seq):
        by_path.setdefault(rec.path, []).append(rec)
    for path, recs in by_path.items():
        # the newest closed version is the file; older ones (a rewrite closed while the
        # previous version was being committed) are kept only to recognise them at the origin
        current = [r for r in recs if not r.prior]
        if not current:  # priors of a version that is gone (landed, deleted, moved)
            _drop(area, recs)
            continue
        rec = current[-1]
        ps = PathState(path, rec.base_version)
        ps.unsure = list(dict.fromkeys(u for r in recs for u in r.unsure))[-UNSURE_MAX:]
        for o in recs:
            if o is rec:
                continue
            f = os.path.join(area.dir, o.id)
            if not os.path.exists(f) or o.seq > rec.seq:
                _drop(area, [o])
                continue
            if not o.prior:
                o = replace(o, prior=True)
                area.journal.put(o)
                with contextlib.suppress(OSError):
                    os.setxattr(f, RECORD_XATTR, o.encode())
            ps.priors.append(f)
        file = os.path.join(area.dir, rec.id)
        try:
            fd = os.open(file, os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            log.error("journal names %s for %s but its staging file is gone", rec.id, rec.path)
            missing.append(rec.path)
            area.journal.delete(rec.id)
            continue
        st = Staged(
            rec.id,
            file,
            fd,
            rec.mode,
            rec.mtime_ns,
            os.fstat(fd).st_size,
            seq=rec.seq,
            first_pending_ns=rec.first_pending_ns,
            uid=rec.uid,
            gid=rec.gid,
        )
        st.journaled_gen = st.gen
        area.adopt(ps, st)
        replayed.append(st)
    keep = {st.id for st in replayed} | {
        os.path.basename(f) for ps in area.paths.values() for f in ps.priors
    }
    recovered = []
    touched = [r.path for r in records.values()]
    open_files: dict[str, list[tuple[str, OpenRecord]]] = {}
    for name in names:
        if name in keep:
            continue
        src = os.path.join(area.dir, name)
        if not os.path.exists(src):
            continue  # a prior dropped above
        raw_path = _xattr(src, PATH_XATTR)
        if (raw_path is None and os.path.getsize(src) == 0) or _xattr(src, DONE_XATTR):
            os.unlink(src)  # a spare, one never written, or one marked done
            continue
        rel = raw_path.decode("utf-8", "surrogateescape") if raw_path else name
        if raw_path:
            touched.append(rel)
        desc = _open_record(area, src, rel) if raw_path and rel in keep_open else None
        if desc is not None:
            open_files.setdefault(rel, []).append((name, desc))
            continue
        recovered.append(_keep_aside(area, src, rel, name))
    adopted = []
    for path, found in open_files.items():
        # one version of a path is open for writing at a time; should there be more, the
        # newest is the open one and the others are kept aside
        found.sort(key=lambda f: os.stat(os.path.join(area.dir, f[0])).st_mtime_ns)
        for name, _desc in found[:-1]:
            recovered.append(_keep_aside(area, os.path.join(area.dir, name), path, name))
        name, desc = found[-1]
        adopted.append(_adopt_open(area, path, name, desc).id)
    return RecoveryReport(
        len(replayed),
        tuple(recovered),
        len(orphans),
        tuple(missing),
        tuple(touched),
        tuple(adopted),
        tuple(area.hold(*keep_open)),
    )


def _open_record(area: StagingArea, file: str, path: str) -> OpenRecord | None:
    """The description of staging file ``file`` open for writing at ``path``: its own, or,
    for a file an older airfs wrote (none), its closed version's (a version open after a
    closed one is its copy: the same base, mode and owner); None without either."""
    raw = _xattr(file, OPEN_XATTR)
    if raw is not None:
        with contextlib.suppress(ValueError, TypeError):
            return OpenRecord.decode(raw)
    closed = area.get(path)
    if closed is None:
        return None
    return OpenRecord(closed.base_version, closed.mode, closed.mtime_ns, closed.uid, closed.gid)


def _adopt_open(area: StagingArea, path: str, name: str, desc: OpenRecord) -> Staged:
    """Staging file ``name`` becomes ``path``'s live version again, open for writing (no
    writer yet: the take-over reopens the handles), dirty."""
    file = os.path.join(area.dir, name)
    fd = os.open(file, os.O_RDWR | os.O_CLOEXEC)
    info = os.fstat(fd)
    st = Staged(
        name,
        file,
        fd,
        desc.mode,
        max(desc.mtime_ns, info.st_mtime_ns),
        info.st_size,
        uid=desc.uid,
        gid=desc.gid,
    )
    ps = area.paths.get(path)
    if ps is None:  # else after its closed version, from the journal (the same base)
        ps = PathState(path, desc.base_version)
    area.adopt(ps, st)
    log.info("%s was open for writing: adopted for the take-over (%d bytes)", path, st.size)
    return st


def _keep_aside(area: StagingArea, src: str, rel: str, name: str, *, link: bool = False) -> str:
    """Keep staging file ``src`` (of path ``rel``) in ``recovered/<rel>``: moved, or hard
    linked with ``link`` (its staging file is still the area's); returns where."""
    if not rel or ".." in rel.split("/"):
        rel = name
    dst = os.path.join(area.recovered_dir, rel.lstrip("/"))
    if os.path.lexists(dst):
        dst = f"{dst}.{int(time.time())}.{name[:8]}"
    os.makedirs(os.path.dirname(dst), mode=0o700, exist_ok=True)
    if link:
        os.link(src, dst)
    else:
        shutil.move(src, dst)
    log.warning(
        "%s was open for writing when the daemon stopped; its staged bytes are kept in %s",
        rel,
        dst,
    )
    return dst


def finish_take_over(area: StagingArea, report: RecoveryReport) -> list[str]:
    """After a take-over (or its refusal): commits may start at the paths held open for
    writing, and each adopted version that no handle reopened (see :func:`recover`'s
    ``keep_open``) is kept in ``recovered/`` and leaves the area, as a file open at a crash
    is. Returns where they were kept."""
    kept = []
    for sid in report.adopted:
        st = area.all.get(sid)
        if st is None or st.writers or st.seq is not None or st.path is None:
            continue  # reopened (and maybe closed since): the area's like any other
        kept.append(_keep_aside(area, st.file, st.path, sid, link=True))
        area.forget_open(st)
    area.unhold(list(report.held))
    return kept


def _drop(area: StagingArea, recs: list[Record]) -> None:
    """Delete older versions kept as priors that nothing needs any more (its record's copy,
    its record, then its file)."""
    for o in recs:
        f = os.path.join(area.dir, o.id)
        with contextlib.suppress(OSError):
            os.removexattr(f, RECORD_XATTR)
        area.journal.delete(o.id)
        with contextlib.suppress(OSError):
            os.unlink(f)
