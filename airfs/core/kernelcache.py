"""What the kernel may keep past the TTL, and telling it when that changes (issue 22, item 3).

Every FUSE reply about a name says how long the kernel may keep the entry (the name) and its
attributes; within that time a ``stat`` or a path walk is answered by the kernel at local-disk
speed and never reaches the daemon. The TTL is the consistency contract: a change made at the
origin is seen within it. With plain timeouts the kernel forgets everything after one TTL and
asks again, name by name, each a round trip through the daemon.

Here the kernel keeps an entry longer than the TTL only while the daemon checks the entry's
directory itself, at least once per TTL, and drops what the kernel keeps
(``FUSE_NOTIFY_INVAL_ENTRY`` / ``INVAL_INODE``, sent by the transport's :class:`Invalidator`,
never on the loop) as soon as a check finds a change: the same contract, kept by the daemon's
checks instead of by the kernel's clock. The rules:

* **Which directories** (a *watch*): one the kernel comes back to after the TTL (its first
  use is noted, no lease: a walk that passes through a directory once costs nothing), with a
  listing kept and fresh, fetched in less than ``WATCH_MAX_TOOK`` of the TTL, of at most
  ``WATCH_MAX_ENTRIES`` names; at most ``WATCH_DIRS`` at once and ``WATCH_NAMES`` names in
  all (beyond, plain TTL timeouts). A listing is one request per page (S3) or one
  ``scandir`` (POSIX). A check lists bare (:mod:`airfs.core.listings`): S3 is asked no
  attribute of an object it has not seen in its listed state (a new object, nobody holds
  its name; or a changed one: its entry is ``guessed``, never the same as the node's, so
  the name is dropped from the kernel and asked again).
* **A lease.** A reply about a name in a watched directory lets the kernel keep it for the
  directory's lease: ``LEASE_MIN_TTLS`` TTLs at first, doubled (up to ``LEASE_MAX`` seconds)
  each time the kernel still asks about names in it a whole lease after the leases of that
  length began (a directory a job keeps using: the kernel cannot say what it answered by itself,
  so a lease is never renewed by use, only by the next, longer one); back to the first length
  when it comes back more than ``RETURN_LEASES`` leases after the last one ended. While a lease
  runs, the directory is listed again so that each check is done ``MARGIN`` of the TTL before
  the previous one is a TTL old; a check is given 2.5 times the directory's last listing time,
  within ``CHECK_BUDGET`` of the TTL (so with the defaults a directory is listed every 0.2-0.6
  TTL: about twice what revalidating it costs while a job asks its names after each TTL, and
  nothing per name). A name that changed, appeared or went away since is invalidated (entry,
  attributes and cached pages) and asked of the origin again at its next use; every other node
  counts as checked at the listing's start, so the daemon answers it without asking too. A
  directory that nobody uses costs at most one lease of checks after its last use.
* **A late check drops the lease.** A check that has not completed one TTL (less ``MARGIN``)
  after the previous one started (a slow or failing origin, a loaded machine) drops what the
  kernel may keep in the directory (every name the kernel holds is invalidated) and ends the
  watch (until a listing of it is fast again): the kernel asks again, as with plain timeouts.
* **What gets a lease**: a name whose node was checked at or after its directory's last check.
  Not a name with a staged version (its attributes change with every write: the kernel learns
  them from the replies), not a file with several names, not a governed level (the policy
  gives those 0: :mod:`airfs.fuse.policy`). Negative entries keep the TTL.

With ``--immutable`` names and versions are trusted until ``airfs refresh`` or the next mount:
the kernel keeps them ``IMMUTABLE_KEEP`` seconds, nothing is checked, and a refresh invalidates
what it forgot (:meth:`KernelCache.forgot`).

A daemon that takes over a ``--restartable`` mount does not know which leases the previous
one gave: it drops every name the kernel holds once (:meth:`KernelCache.took_over`), and its
own leases follow. Without an invalidator (the pyfuse3 transport) every timeout is the TTL.
"""

from __future__ import annotations

import collections
import logging
import time
from dataclasses import dataclass
from typing import Protocol

import trio

from airfs.origin.base import Entry, OriginError
from airfs.writeback.staging import StagingArea

from .inodes import InodeTable, Node
from .listings import Listing, ListingCache

log = logging.getLogger(__name__)

#: a directory is watched only if its listing took less than this fraction of the TTL
WATCH_MAX_TOOK = 0.35
#: ... and holds at most this many names
WATCH_MAX_ENTRIES = 20_000
#: directories watched at once
WATCH_DIRS = 64
#: names in the directories watched at once (their listings are fetched once per TTL)
WATCH_NAMES = 100_000
#: the first lease of a directory, in TTLs
LEASE_MIN_TTLS = 8
#: a directory the kernel comes back to within this many leases of the last one ending gets
#: twice that lease
RETURN_LEASES = 4
#: directories used once, remembered (to know the kernel came back to one)
SEEN_MAX = 4096
#: the longest lease (seconds; never less than the TTL)
LEASE_MAX = 60.0
#: a check must be done this fraction of the TTL before the previous one is a TTL old (the
#: notifications' way to the kernel), or the lease is dropped
MARGIN = 0.1
#: the time a check is given: 2.5 times the directory's last listing, at least the first and
#: at most the second fraction of the TTL (checks start that much before they must be done:
#: with the defaults, every 0.2-0.6 TTL)
CHECK_BUDGET = (0.3, 0.7)
#: checks in flight at once
POLLS_MAX = 8
#: how long the kernel keeps a name of an immutable mount (seconds)
IMMUTABLE_KEEP = 24 * 3600.0


class Invalidator(Protocol):
    """Tells the kernel to drop what it keeps; never blocks the caller (a notification may
    wait for a lock held by a request the daemon has yet to answer, so the transport writes
    them from a thread of its own)."""

    def entry(self, parent: int, name: str, *, expire: bool = False) -> None:
        """Drop the entry ``name`` of directory inode ``parent``; with ``expire``, only end
        its validity where the kernel can (it asks again at the next use and keeps the inode,
        so a file that did not change keeps its number; a full drop evicts an inode nobody
        holds open, and the next lookup numbers the file anew)."""

    def inode(self, ino: int, *, pages: bool) -> None:
        """Drop the attributes of ``ino`` (and its cached pages, with ``pages``)."""


class Directories(Protocol):
    """What the kernel cache uses of the core (:class:`~airfs.core.base.Core`)."""

    ttl: float
    immutable: bool
    inodes: InodeTable
    listings: ListingCache
    area: StagingArea

    def level(self, path: str) -> bool:
        """``path`` is a governed level (its names are per caller)."""

    def trusts(self, path: str) -> bool:
        """What is known of ``path`` is trusted until ``airfs refresh`` (an immutable mount
        or volume)."""

    async def relist(self, dir_path: str, since: float, *, bare: bool = False) -> Listing | None:
        """Fetch ``dir_path``'s listing again (None: gone, or not kept); ``bare``: the
        attributes of objects the origin has not seen may be left guessed."""


@dataclass(frozen=True, slots=True)
class KernelCacheStats:
    """``KernelCache.statistics()``: directories watched now, leases given, checks made,
    names found changed and invalidated, leases dropped by a late or failed check, names
    dropped from the kernel by ``airfs refresh``."""

    watched: int
    leases: int
    checks: int
    changed: int
    dropped: int
    refreshed: int


@dataclass(slots=True)
class Watch:
    """A watched directory: what the kernel keeps of it was checked at ``backed`` (monotonic:
    when the last check's listing started); a lease runs until ``until``; ``lease`` is the
    length of the next one (given since ``started``); ``gen`` moves when the watch is dropped
    (a check in flight then counts for nothing)"""

    backed: float
    lease: float
    until: float
    #: when leases of this length began to be given
    started: float = 0.0
    gen: int = 0
    polling: bool = False
    #: counted among the ``WATCH_DIRS`` (a lease runs, or ran until the last pass)
    active: bool = True
    #: its names, counted among the ``WATCH_NAMES`` while active
    names: int = 0


def same(a: Entry, b: Entry) -> bool:
    """Whether ``a`` and ``b`` describe the same object as the kernel sees it."""
    return (
        a.kind is b.kind
        and a.version == b.version
        and a.size == b.size
        and a.mode == b.mode
        and a.mtime_ns == b.mtime_ns
        and a.uid == b.uid
        and a.gid == b.gid
        and a.nlink == b.nlink
    )


class KernelCache:
    """The watches of one core (see the module's text). Trio loop only."""

    def __init__(self, core: Directories) -> None:
        self.core = core
        self.ttl = core.ttl
        self.immutable = core.immutable
        self.lease_min = min(max(LEASE_MIN_TTLS * self.ttl, self.ttl), max(LEASE_MAX, self.ttl))
        self.lease_max = max(LEASE_MAX, self.ttl)
        self._inv: Invalidator | None = None
        self._dirs: dict[str, Watch] = {}
        #: directories used once (a lease is given when the kernel comes back after the TTL)
        self._seen: collections.OrderedDict[str, float] = collections.OrderedDict()
        self._active = self._names = 0
        self._wake = trio.Event()
        self.leases = self.checks = self.changed = self.dropped = self.refreshed = 0

    # -- the transport's side --------------------------------------------------------------

    def attach(self, inv: Invalidator | None) -> None:
        """Start (``inv``) or stop (None) giving leases; stopping drops every watch (the
        kernel's connection is gone, or about to be handed over)."""
        self._inv = inv
        if inv is None:
            self._dirs.clear()
            self._seen.clear()
            self._active = self._names = 0
        self._wake.set()

    def keep(self, ino: int) -> float:
        """How long the kernel may keep the entry and attributes of inode ``ino`` it is
        about to be told (seconds): a lease, or the TTL."""
        if self._inv is None:
            return self.ttl
        node = self.core.inodes.find(ino)
        if node is None or node.path is None or node.entry is None or node.fetched <= 0.0:
            return self.ttl
        path = node.path
        core = self.core
        if core.area.get(path) is not None or core.level(path):
            return self.ttl
        if self.immutable:
            return IMMUTABLE_KEEP
        if core.trusts(path):
            # an immutable volume: the daemon answers from memory, but the declaration may
            # end (within the catalog's TTL), so the kernel keeps the TTL; never checked
            return self.ttl
        parent = path.rpartition("/")[0]
        now = time.monotonic()
        w = self._dirs.get(parent)
        if w is None or now >= w.until:
            w = self._watch(parent, now, w)
            if w is None:
                return self.ttl
        if node.fetched < w.backed:
            return self.ttl  # not checked since the directory was: the next check does
        if now >= w.started + w.lease:
            # the kernel still asks about names here a whole lease on: it uses the directory
            w.lease = min(2 * w.lease, self.lease_max)
            w.started = now
        self.leases += 1
        end = now + w.lease
        if end > w.until:
            w.until = end
        return w.lease

    def _watch(self, parent: str, now: float, w: Watch | None) -> Watch | None:
        """The watch of ``parent`` with a lease starting now, if it may have one."""
        if w is None:
            seen = self._seen.get(parent)
            if seen is None:  # its first use: noted, no lease
                self._seen[parent] = now
                if len(self._seen) > SEEN_MAX:
                    self._seen.popitem(last=False)
                return None
            if now < seen + self.ttl:
                return None  # still the first pass over it
        elif w.polling:
            return None  # its last check is still out (a dropped one, if it was late)
        listing = self.core.listings.latest(parent)
        if (
            listing is None
            or now - listing.at >= self.ttl
            or listing.took >= WATCH_MAX_TOOK * self.ttl
            or len(listing.entries) > WATCH_MAX_ENTRIES
            or self._active >= WATCH_DIRS
            or self._names + len(listing.entries) > WATCH_NAMES
        ):
            return None
        if w is None:
            del self._seen[parent]
            w = self._dirs[parent] = Watch(listing.at, self.lease_min, now, now, active=False)
        else:  # used again: a longer lease (see keep) unless long after the last one ended
            if now >= w.until + RETURN_LEASES * w.lease:
                w.lease, w.started = self.lease_min, now
            w.backed = max(w.backed, listing.at)
            w.until = now
        if not w.active:
            w.active = True
            w.names = len(listing.entries)
            self._active += 1
            self._names += w.names
        self._wake.set()
        return w

    def took_over(self) -> int:
        """This daemon took over a connection another served: the kernel may keep names
        past the TTL on leases that daemon gave and this one does not check. Drop every name
        the kernel holds (entry and attributes; an open decides about pages, as always):
        it asks again, and this daemon's leases take over. Returns how many."""
        inv = self._inv
        if inv is None:
            return 0
        return self._drop_names(inv, self.core.inodes.nodes(), pages=False)

    def _drop_names(self, inv: Invalidator, nodes: list[Node], *, pages: bool) -> int:
        """Drop from the kernel the entry and attributes (and pages, with ``pages``) of every
        node of ``nodes`` it holds; returns how many."""
        inodes = self.core.inodes
        n = 0
        for node in nodes:
            p = node.path
            if node.lookups <= 0 or not p:
                continue
            parent, _, name = p.rpartition("/")
            pnode = inodes.at(parent)
            if pnode is not None:
                inv.entry(pnode.ino, name, expire=True)  # asked again; not known changed
            inv.inode(node.ino, pages=pages)
            n += 1
        return n

    # -- changes the core knows of ---------------------------------------------------------

    def forgot(self, path: str) -> int:
        """``airfs refresh PATH`` forgot what is known at and under ``path``: the kernel
        drops it too (the entries of the nodes there, and their attributes and pages);
        returns how many names were invalidated."""
        inv = self._inv
        if inv is None:
            return 0
        prefix = f"{path}/" if path else ""
        for d in [d for d in self._dirs if d == path or d.startswith(prefix)]:
            self._end(d, self._dirs.pop(d))
        n = self._drop_names(inv, self.core.inodes.under(path), pages=True)
        self.refreshed += n
        return n

    # -- the checks ------------------------------------------------------------------------

    async def run(self) -> None:
        """Check the watched directories when due, for ever (cancel to stop)."""
        async with trio.open_nursery() as nursery:
            limit = trio.Semaphore(POLLS_MAX)
            while True:
                self._wake = trio.Event()
                wait = self._due(nursery, limit)
                with trio.move_on_after(wait):
                    await self._wake.wait()

    def _due(self, nursery: trio.Nursery, limit: trio.Semaphore) -> float:
        """Start the checks that are due, drop late ones; returns how long to sleep."""
        now = time.monotonic()
        wait = self.ttl
        margin = MARGIN * self.ttl
        for path, w in list(self._dirs.items()):
            if now >= w.until:  # no lease runs: nothing to check
                if w.active:
                    self._deactivate(w)
                if now >= w.until + RETURN_LEASES * w.lease and not w.polling:
                    del self._dirs[path]
                continue
            deadline = w.backed + self.ttl - margin
            if w.polling:
                if now >= deadline:
                    self._drop(path, w, "its check is late", now)
                else:
                    wait = min(wait, deadline - now)
                continue
            listing = self.core.listings.latest(path)
            took = listing.took if listing is not None else 0.0
            low, high = CHECK_BUDGET
            due = deadline - min(max(2.5 * took, low * self.ttl), high * self.ttl)
            if now >= due:
                w.polling = True
                nursery.start_soon(self._check, path, w, w.gen, limit)
                wait = min(wait, max(deadline - now, 0.001))
            else:
                wait = min(wait, due - now)
        return max(wait, 0.001)

    async def _check(self, path: str, w: Watch, gen: int, limit: trio.Semaphore) -> None:
        try:
            async with limit:
                t0 = time.monotonic()
                try:
                    # bare: objects the origin has not seen are not asked one by one
                    # (nobody holds their names; a changed object is one of them)
                    listing = await self.core.relist(path, t0, bare=True)
                except OriginError as exc:
                    listing = None
                    log.debug("%s: check failed: %s", path, exc)
                except Exception:  # a bug: said, and the lease dropped, never a dead daemon
                    listing = None
                    log.exception("%s: check failed", path)
            self.checks += 1
            if w.gen != gen or self._dirs.get(path) is not w:
                return  # dropped while it ran
            if listing is None:
                self._drop(path, w, "its check failed", time.monotonic())
                return
            self._compare(path, listing)
            w.backed = max(w.backed, listing.at)
        finally:
            w.polling = False
            self._wake.set()

    def _compare(self, path: str, new: Listing) -> None:
        """Invalidate what the kernel holds of the names in ``path`` whose node differs from
        ``new``; the others count as checked at its start. A name gone, or now another kind
        of object, loses its entry (the kernel looks it up again); a file or directory
        changed in place keeps it (the same node: the name still leads there) and loses its
        attributes and cached pages, so a directory whose mtime moved does not take the
        kernel's names under it along."""
        inv = self._inv
        core = self.core
        dnode = core.inodes.at(path)
        if inv is None or dnode is None:
            return
        at = new.at
        entries = new.entries
        staged = core.area.get
        for node in core.inodes.children(path):
            child = node.path
            if child is None or staged(child) is not None:
                continue
            name = child.rpartition("/")[2]
            e = entries.get(name)
            # a guessed entry is an object the origin has not seen in this state (changed,
            # or new to it): never the same
            if e is not None and not e.guessed and node.entry is not None and same(node.entry, e):
                if node.fetched < at:
                    node.fetched = at
                continue
            node.fetched = 0.0  # asked of the origin (its fresh listing) at the next use
            if node.lookups > 0:
                if e is None or e.kind is not node.kind:
                    inv.entry(dnode.ino, name)
                inv.inode(node.ino, pages=True)
                self.changed += 1

    def _drop(self, path: str, w: Watch, why: str, now: float) -> None:
        """End ``w``'s lease before its time: the kernel asks again. The directory is
        watched again once its check is back, if that listing was fast enough."""
        log.info("%s: the kernel's entries are dropped: %s", path, why)
        self.dropped += 1
        self._end(path, w)
        w.until = now

    def _deactivate(self, w: Watch) -> None:
        w.active = False
        self._active -= 1
        self._names -= w.names

    def _end(self, path: str, w: Watch) -> None:
        """The kernel forgets what it keeps of ``path`` past the TTL (every name it holds)."""
        if w.active:
            self._deactivate(w)
        w.gen += 1
        inv = self._inv
        dnode = self.core.inodes.at(path)
        if inv is None or dnode is None:
            return
        for node in self.core.inodes.children(path):
            if node.lookups > 0 and node.path is not None:
                inv.entry(dnode.ino, node.path.rpartition("/")[2], expire=True)
                inv.inode(node.ino, pages=False)

    def statistics(self) -> KernelCacheStats:
        return KernelCacheStats(
            self._active,
            self.leases,
            self.checks,
            self.changed,
            self.dropped,
            self.refreshed,
        )
