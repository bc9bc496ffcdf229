"""Passthrough: which open handles the kernel may serve from a local file without the daemon.

A transport that can hand the kernel a *backing file* for an open (FUSE passthrough) asks
:meth:`Passthrough.source` right after the core's ``open``/``create``; the answer is the local
file holding every byte of that handle and a *key* naming that file's content, or None to serve
the handle through the daemon. The bytes of a handle are local when

* it is a **staged** file (written on this node, not yet committed or still open for writing):
  the staging file itself, for reads *and* writes (an ``O_RDWR`` writer does not start
  passthrough: see :meth:`Passthrough.source`). Writes then bypass the daemon, so what the
  core knows of the file (size, mtime, generation) is brought up to date from the staging
  file's ``fstat`` (:meth:`Passthrough.sync`) whenever it matters: at every ``flush``
  (``close()``), ``fsync``, ``release`` and attribute reply. The version is then journaled and
  committed exactly as a daemon-written one (so it survives kill -9 once closed);
* it is a **read-only open of an origin object complete in the block cache**: the cache file,
  pinned against eviction while any such open lives, never hole-punched afterwards (a mapping
  may outlive the open), and verified (see :mod:`airfs.cache.backing`). An uncached object
  up to ``small_max`` bytes is fetched whole first (one range read) and then passed through.

Per-inode mode (the kernel's rules: one backing file per inode across its concurrent opens,
and a passthrough open never coexists with a daemon-served open of the same inode, else the
kernel fails the open with EIO). Each inode with open handles is in one mode:

* *daemon*: every further open of it is daemon-served, even when its bytes became local; once
  its last daemon-served handle is released the next open may start passthrough (a file that
  became complete while open switches then);
* *passthrough* with key K: a further open whose content is K joins it (the transport reuses
  the same backing id); a further open whose content is *not* K (the file was truncated,
  rewritten or changed at the origin while a passthrough handle still holds the old bytes)
  cannot be served either way on that inode: the core detaches the inode from its path and
  the open fails with ESTALE, on which the kernel looks the name up again (getting a new
  inode) and retries the open once. Handles already open keep the old bytes, as if the file
  had been replaced by a rename.

Passthrough writes are not bounded by the staging limit nor by its free-disk floor (only by
the disk, whose ENOSPC the writer then gets at once): writable opens start passthrough only
while the staging area has ``write_headroom`` (1 GiB) to spare below its limit and above the
floor (:mod:`airfs.writeback.space`); otherwise (and always with a smaller
``--staging-size``) they are daemon-served, which waits for commits to free space and then
fails with ENOSPC. A staged file
with passthrough writers is never forked to a new version by the daemon (``in_place``): writes
after an ``fsync`` or a ``close()`` of another descriptor land in the same staging file and are
journaled again at the next close (an upload that raced them is followed by another).
"""

from __future__ import annotations

import collections
import errno
import logging
import os
from dataclasses import dataclass
from typing import Any

from airfs.origin.base import OriginError
from airfs.writeback.opens import Opens
from airfs.writeback.staging import Staged, StagingArea

from .handles import Handle
from .inodes import InodeTable
from .readpath import BackingStats, LocalFile, ReadPath

log = logging.getLogger(__name__)

#: uncached objects up to this size are fetched whole at open and passed through
SMALL_FILE_MAX = 8 << 20
#: writable opens start passthrough only with this much staging space to spare
WRITE_HEADROOM = 1 << 30


@dataclass(frozen=True, slots=True)
class PassthroughStats:
    """``Passthrough.statistics()``: opens passed through and served by the daemon so far,
    opens refused for holding other bytes than their inode's (ESTALE) or by the kernel,
    passthrough handles open now, and the read path's counters of its local files."""

    passthrough_opens: int
    daemon_opens: int
    passthrough_conflicts: int
    passthrough_refused: int
    passthrough_handles: int
    backing: BackingStats | None

    def to_dict(self) -> dict[str, Any]:
        """Flat, as ``airfs status --json`` shows it under ``fuse``."""
        out: dict[str, Any] = {
            "passthrough_opens": self.passthrough_opens,
            "daemon_opens": self.daemon_opens,
            "passthrough_conflicts": self.passthrough_conflicts,
            "passthrough_refused": self.passthrough_refused,
            "passthrough_handles": self.passthrough_handles,
        }
        if self.backing is not None:
            out.update(self.backing.to_dict())
        return out


@dataclass(eq=False)
class _Mode:
    """An inode's open mode: passthrough of the file named ``key``, or daemon-served."""

    passthrough: bool
    key: str | None
    opens: int = 0


@dataclass(eq=False)
class _Open:
    ino: int
    passthrough: bool
    #: the key of the file a passthrough open is served from
    key: str | None = None
    #: a passthrough writer's staged version (synced from its file)
    staged: Staged | None = None
    #: a pinned cache file
    local: LocalFile | None = None


@dataclass(eq=False)
class _Candidate:
    fd: int
    key: str
    local: LocalFile | None = None


class Passthrough:
    """Decides per handle and per inode (see the module docstring). Trio loop only."""

    def __init__(
        self,
        area: StagingArea,
        opens: Opens,
        readpath: ReadPath,
        inodes: InodeTable,
        *,
        small_max: int = SMALL_FILE_MAX,
        write_headroom: int = WRITE_HEADROOM,
    ) -> None:
        self.area = area
        self.opens = opens
        self.readpath = readpath
        self.inodes = inodes
        self.small_max = small_max
        self.write_headroom = write_headroom
        self._modes: dict[int, _Mode] = {}
        self._opens: dict[int, _Open] = {}
        #: passthrough writers per staged version, and its file's (size, mtime_ns) last seen
        self._writers: dict[Staged, int] = {}
        self._seen: dict[Staged, tuple[int, int]] = {}
        #: passthrough opens per key (what :meth:`holds` answers)
        self._keys: collections.Counter[str] = collections.Counter()
        self.counts: collections.Counter[str] = collections.Counter()

    # -- the open-time decision ----------------------------------------------------------------

    async def source(self, h: Handle, *, rdwr: bool = False) -> tuple[int, str] | None:
        """The local file (fd, key) that serves every byte of the just-opened handle ``h``,
        or None to serve it through the daemon. Raises ``OSError(ESTALE)`` when the inode's
        other opens pass through a different file (the inode was detached from its path: the
        caller releases ``h`` and answers ESTALE, and the kernel retries on a new inode).

        ``rdwr``: the open is ``O_RDWR``, so it may be mapped shared and writable, and the
        kernel's passthrough mapping outlives the open (writes made through it after the
        ``close()`` would never be journaled): such an open of a staged file is never passed
        through. On an inode whose other opens pass through, it is an open of other bytes
        than theirs (ESTALE, a new inode: above), so that it is daemon-served."""
        ino = h.node.ino
        mode = self._modes.get(ino)
        if mode is not None and not mode.passthrough:
            self._daemon(h, mode)
            return None
        cand = await self._candidate(h, starting=mode is None, rdwr=rdwr)
        mode = self._modes.get(ino)  # other opens may have decided while we waited
        if mode is None:
            if cand is None:
                self._daemon(h, None)
                return None
            mode = self._modes[ino] = _Mode(True, cand.key)
        elif not mode.passthrough or cand is None or cand.key != mode.key:
            if cand is not None and cand.local is not None:
                cand.local.release()
            if not mode.passthrough:
                self._daemon(h, mode)
                return None
            self.counts["passthrough_conflicts"] += 1
            if h.node.path is not None:
                self.inodes.detach(h.node)
            raise OSError(errno.ESTALE, f"inode {ino}: its open files hold other bytes")
        mode.opens += 1
        self._keys[cand.key] += 1
        rec = _Open(ino, True, cand.key, local=cand.local)
        if h.writable and h.opened is not None:
            st = rec.staged = self.opens.version(h.opened)
            self._writers[st] = self._writers.get(st, 0) + 1
            if st not in self._seen:
                s = os.fstat(st.fd)
                self._seen[st] = (s.st_size, s.st_mtime_ns)
        self._opens[h.fh] = rec
        # what the kernel caches for this inode now comes from the backing file: a later
        # daemon-served open must not keep the inode's own page cache
        h.node.cached_version = None
        self.counts["passthrough_opens"] += 1
        return cand.fd, cand.key

    def _daemon(self, h: Handle, mode: _Mode | None) -> None:
        if mode is None:
            mode = self._modes[h.node.ino] = _Mode(False, None)
        mode.opens += 1
        self._opens[h.fh] = _Open(h.node.ino, False)
        self.counts["daemon_opens"] += 1

    async def _candidate(self, h: Handle, *, starting: bool, rdwr: bool) -> _Candidate | None:
        st = self.opens.staged(h.opened)
        if st is not None:
            if h.writable and (rdwr or (starting and not self._room())):
                return None  # an O_RDWR open never passes through, not even by joining
            return _Candidate(st.fd, f"staged:{st.id}")
        if h.local is not None:  # held since the open: the passthrough open holds it now
            local, h.local = h.local, None
            return _Candidate(local.fd, local.key, local)
        if h.reader is None:
            return None
        ref = h.reader.ref
        try:
            lf = await self.readpath.local_file(ref, fetch_max=self.small_max if starting else 0)
        except OriginError as exc:
            log.debug("%s: not fetched whole at open (%s); served by the daemon", ref.path, exc)
            return None
        if lf is None:
            return None
        return _Candidate(lf.fd, lf.key, lf)

    def _room(self) -> bool:
        """``write_headroom`` to spare below the staging limit and above the free-disk floor
        (passthrough writes are held to neither once started)."""
        a = self.area
        if a.limit - a.bytes < self.write_headroom:
            return False
        floor = a.floor
        return floor.min_free == 0 or floor.free(a.bytes) - floor.min_free >= self.write_headroom

    def refused(self, fh: int) -> None:
        """The transport could not register the file of ``fh`` with the kernel: it is served
        by the daemon (its inode switches to daemon mode when this was its only open)."""
        rec = self._opens.get(fh)
        if rec is None or not rec.passthrough:
            return
        self._drop(rec)
        rec.passthrough = False
        mode = self._modes[rec.ino]
        if mode.opens == 1:
            mode.passthrough, mode.key = False, None
        self.counts["passthrough_refused"] += 1

    # -- keeping the core's view of passthrough-written files right ---------------------------

    def sync(self, st: Staged | None) -> None:
        """Bring ``st``'s size, mtime and generation up to date with its staging file when
        passthrough writers may have changed it (a no-op otherwise)."""
        if st is None:
            return
        seen = self._seen.get(st)
        if seen is None:
            return
        try:
            s = os.fstat(st.fd)
        except OSError:
            return
        now = (s.st_size, s.st_mtime_ns)
        if now == seen:
            return
        self._seen[st] = now
        if s.st_size > st.size:  # counted as StagingArea.write counts growth
            self.area.bytes += s.st_size - st.size
        st.size = s.st_size
        st.touch()
        st.mtime_ns = s.st_mtime_ns

    def in_place(self, st: Staged) -> bool:
        """True when ``st`` has passthrough writers, so it must be written where it is (the
        kernel keeps writing that file): a closed version becomes live again."""
        if st not in self._writers:
            return False
        self.sync(st)
        if st.closed_version:
            st.touch()
        return True

    def release(self, h: Handle) -> None:
        """``h`` is being released (before the core journals it): last sync, unpin, and the
        inode's mode count. Never raises."""
        rec = self._opens.pop(h.fh, None)
        if rec is None:
            return
        self._drop(rec)
        mode = self._modes.get(rec.ino)
        if mode is not None:
            mode.opens -= 1
            if mode.opens <= 0:
                del self._modes[rec.ino]

    def key_of(self, fh: int) -> str | None:
        """The key of the file the open ``fh`` passes through; None when it is served by the
        daemon (or not open)."""
        rec = self._opens.get(fh)
        return rec.key if rec is not None and rec.passthrough else None

    def holds(self, key: str) -> bool:
        """Whether an open handle still passes through the file named ``key``: a transport
        that registered that file with the kernel keeps it registered while this is True
        (the kernel looks it up at every open that joins it) and drops it after. The one
        count of passthrough opens is this one."""
        return self._keys[key] > 0

    def _drop(self, rec: _Open) -> None:
        if rec.key is not None:
            self._keys[rec.key] -= 1
            if self._keys[rec.key] <= 0:
                del self._keys[rec.key]
            rec.key = None
        st = rec.staged
        if st is not None:
            rec.staged = None
            self.sync(st)
            n = self._writers.get(st, 0) - 1
            if n <= 0:
                self._writers.pop(st, None)
                self._seen.pop(st, None)
            else:
                self._writers[st] = n
        if rec.local is not None:
            rec.local.release()
            rec.local = None

    def statistics(self) -> PassthroughStats:
        c = self.counts
        return PassthroughStats(
            passthrough_opens=c["passthrough_opens"],
            daemon_opens=c["daemon_opens"],
            passthrough_conflicts=c["passthrough_conflicts"],
            passthrough_refused=c["passthrough_refused"],
            passthrough_handles=sum(1 for r in self._opens.values() if r.passthrough),
            backing=self.readpath.backing_statistics(),
        )
