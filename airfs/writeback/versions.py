"""The records of staged files: :class:`PathState` (one path's versions and what they replace
at the origin) and :class:`Staged` (one version). Their life cycle is
:class:`~airfs.writeback.staging.StagingArea`'s (see its module docstring)."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

import trio

from airfs.origin.base import PutCancel

__all__ = ["UNSURE_MAX", "Close", "PathState", "Staged", "close_due"]

#: fingerprints of failed puts kept per file until a commit lands (the newest: a put that
#: landed is replaced at the origin by the next one that lands)
UNSURE_MAX = 64


@dataclass(eq=False)
class PathState:
    """One file's versions and what it replaces at the origin (moves with renames)."""

    path: str | None
    base: str | None
    versions: list[Staged] = field(default_factory=list)
    uploading: Staged | None = None
    #: files kept from a crash: an older closed version that may have landed at the origin
    priors: list[str] = field(default_factory=list)
    #: name operations in progress on this path at the origin: no commit starts meanwhile
    held: int = 0
    #: (size, MD5) of versions whose put failed since the last commit that landed: a put can
    #: land and still fail (its response lost to a timeout or a reset connection), and the
    #: version may be rewritten or dropped before the retry; recognised as ours at the origin
    unsure: list[tuple[int, str]] = field(default_factory=list)

    @property
    def live(self) -> Staged | None:
        return self.versions[-1] if self.versions else None

    def candidate(self) -> Staged | None:
        """The version to commit next: the newest closed one, if nothing is uploading. A
        closed version that still has writers (``close()`` of one descriptor while the open
        file lives on: a ``dup``, a child process, or a shared mapping, which keeps the open
        file until it is unmapped) waits for its last writer to go, unless a barrier
        (``fsync``, ``msync``, ``airfs flush``, unmount) asked for it: what it would commit is
        likely to be followed at once by a newer version."""
        if self.uploading is not None or self.path is None or self.held:
            return None
        for v in reversed(self.versions):
            if v.closed_version and v.dirty:
                return v if v.writers == 0 or v.urgent else None
        return None


@dataclass(eq=False)
class Staged:
    """One staged version of a file."""

    id: str
    file: str
    fd: int
    mode: int
    mtime_ns: int
    size: int
    ps: PathState | None = None
    writers: int = 0
    #: open handles (readers and writers) that use this staged content
    refs: int = 0
    gen: int = 1
    committed_gen: int = 0
    #: journaled when set; ``journaled_gen`` is the generation the record describes
    seq: int | None = None
    journaled_gen: int = 0
    first_pending_ns: int = 0
    upload_done: trio.Event = field(default_factory=trio.Event)
    #: stops the running upload of this version (where the origin can stop a put): a name
    #: operation that would otherwise wait for it (:meth:`cancel_upload`)
    put_cancel: PutCancel | None = None
    error: str | None = None
    error_transient: bool = True
    attempts: int = 0
    next_try: float = 0.0
    #: when this version was last closed (monotonic; 0: recovered from the journal): its
    #: commit waits for the uploader's commit delay from then, unless a barrier asks for it
    closed_at: float = 0.0
    #: a commit has been asked for by fsync/flush (committed before the rest)
    urgent: bool = False
    #: the newer version that made this one unnecessary (barriers follow it)
    replaced_by: Staged | None = None
    #: (path, kept copy) after this version lost a conflict at the origin
    conflict: tuple[str, str] | None = None
    #: owner given to the origin at commit (None: the origin's default / the replaced one's)
    uid: int | None = None
    gid: int | None = None
    #: access time set by the user (None: the mtime); change time of the inode's status
    atime_ns: int | None = None
    ctime_ns: int = field(default_factory=time.time_ns)
    #: changes of its bytes running in worker threads; a journal close asked for meanwhile
    #: (``close_wanted``) is made when the last one ends
    inflight: int = 0
    close_wanted: bool = False
    #: a fork of this version in progress (set while it copies), and the version it made:
    #: concurrent writes that need the fork wait for the one copy and follow it
    forking: trio.Event | None = None
    forked_to: Staged | None = None
    #: the generation whose fingerprint is in its file's ``unsure`` list (0: none)
    unsure_gen: int = 0

    @property
    def path(self) -> str | None:
        return self.ps.path if self.ps is not None else None

    @property
    def base_version(self) -> str | None:
        return self.ps.base if self.ps is not None else None

    @property
    def uploading(self) -> bool:
        return self.ps is not None and self.ps.uploading is self

    @property
    def dirty(self) -> bool:
        return self.gen != self.committed_gen

    @property
    def closed_version(self) -> bool:
        """Journaled and not written since: its bytes are what its record describes."""
        return self.seq is not None and self.journaled_gen == self.gen

    def cancel_upload(self) -> None:
        """Ask this version's running upload to stop before it publishes anything (it then
        stays pending, as if it had not started); nothing when none runs or its origin
        cannot stop a put (``put_cancel`` None)."""
        if self.uploading and self.put_cancel is not None:
            self.put_cancel.cancel()

    def failed_since(self, attempts: int) -> bool:
        """Failed, for a reason retrying will not fix, in an attempt made after the count
        was ``attempts`` (the one rule fsync, flush and unmount share)."""
        return (
            self.error is not None
            and not self.error_transient
            and self.attempts > attempts
            and not self.uploading
        )

    def touch(self) -> None:
        self.gen += 1
        self.mtime_ns = self.ctime_ns = time.time_ns()


class Close(enum.Enum):
    """What :func:`close_due` decides for a version."""

    #: nothing to journal: clean, deleted, already closed, or other writers still write it
    NO = "no"
    #: closed now: journal it (its bytes survive a daemon crash from here on)
    NOW = "now"
    #: closed, but a change of its bytes runs in a worker thread: journaled when it ends
    AFTER_WRITES = "after-writes"


def close_due(st: Staged, *, other_writers: int, barrier: bool) -> Close:
    """The one rule for "this file is now closed" (journaled as it is, so that it survives a
    daemon crash and may be committed).

    A version is closed when it has content the origin lacks (``dirty``), still has a path
    (a deleted file is never committed), is not closed already at this generation, and either
    no *other* writer has it open (``other_writers``: its writers besides the one closing:
    ``close()`` of the last descriptor, a release) or a ``barrier`` asks for it as it is now
    (``fsync``, ``link``, ``airfs flush``, the end of a close deferred by writes in flight).
    While a change of its bytes runs in a worker thread the close is deferred to its end
    (never a record of bytes still changing).

    Committing is a separate rule (:meth:`PathState.candidate`): a closed version that still
    has writers waits for the last one unless a barrier made it urgent."""
    if st.path is None or not st.dirty or st.closed_version:
        return Close.NO
    if not barrier and other_writers > 0:
        return Close.NO
    return Close.AFTER_WRITES if st.inflight else Close.NOW
