"""Directory listings the core has seen, used to answer lookups without asking the origin.

A listing fetched at monotonic time ``at`` answers lookups of names in that directory, both
positive (the entry) and negative (ENOENT), until ``at + ttl``: the same freshness rule as an
entry from ``stat``, so the consistency contract is unchanged. One ``list`` request then
replaces a ``stat`` per file, which is what makes a pass over a large directory of small files
fast on a remote origin. Changes made through this mount update the cached listings in place
(:meth:`ListingCache.record`) and are replayed onto a listing whose fetch raced them; a
listing whose fetch raced a change of unknown outcome (:meth:`ListingCache.discard`) is not
kept.

When a listing expires, the next name asked in its directory fetches the whole listing again
(one request, or one ``scandir`` in a worker thread) rather than asking the origin about that
one name, if that is cheap for what it answers (:meth:`ListingCache.worth_relisting`):

* its last fetch took less than 80% of the TTL (``RELIST_MAX_TOOK``): a listing that takes
  longer is nearly or already expired when it arrives, and fetching it again for each name
  would cost a whole listing per name (a 100k-entry directory: seconds per ``stat``); one
  that takes a little less still answers more names per request than asking each by name
  (an S3 LIST page carries 1,000 names, a HEAD one);
* it holds at most one page (``PAGE`` entries: one S3 LIST request), or at least one name
  per page was asked of the directory since it was fetched (a directory with one hot file
  among 100k is asked about that file, by name, not listed again every TTL);
* or, whatever its size and its last fetch took, the names asked of the origin one by one
  since cost more than that fetch (``name_s`` each, as measured): a listing that was slow
  once (the first S3 listing of a directory, which HEADs objects for their modes) is tried
  again, and a huge directory walked by name is listed again at most once per its
  listing's cost in names (counting names asked by name since it expired, not those it
  answered) -- unless it was itself fetched again and took the whole TTL or more: such a
  listing is stale when it arrives, and listing it again for every few names (15,000 entries,
  a second of daemon and server CPU each) starves the requests it was meant to save.

A directory with no listing kept (never listed, or evicted) is listed once
``FIRST_LISTING_AFTER`` different names were asked of it one by one
(:meth:`ListingCache.first_listing_due`): a job's first pass over a directory after a
restart costs one listing instead of a ``stat`` (S3: a HEAD) per file; one hot file asked
again and again never lists its directory.

With an adapter that can answer a name without its attributes (``Core.bare_entries``: the
kernel transport) a listing asks the attributes the origin does not know (S3: a HEAD per
object) only when there are at most ``HEADS_MAX`` of them: a bigger directory's listing is
*bare* (``Listing.bare``; its other entries ``Entry.guessed``). It answers which names exist
(and their kinds, sizes and versions, what a fetch needs) but not a name's attributes: a
guessed name is asked by name when it is looked up (walked ahead, or read whole, as below),
so that ``find`` over 15,000 objects costs 15 LIST requests, not 15,000 HEADs before its first
name. A walk over such names (``ls -l``, ``du``) asks them ahead as wide as the listing's HEADs
would have (``BARE_WALK_LANES`` jobs at once), each name asked ahead a question its own lookup
joins. After the TTL, a name a bare listing has is still asked by name (the listing fetched
again would not answer it either; fetching it again for each TTL would restart the walk)
until every name it guessed was asked by name once (``Listing.all_named``: the origin knows
their attributes then, and a new listing, still one LIST request per 1,000 names, answers
them all, as a listing of a small directory does); a name it does not have fetches it again
(bare too). A kernel-cache watch (:mod:`airfs.core.kernelcache`) checks a directory with bare
listings: a LIST, no HEAD for objects the origin has not seen (nobody holds their names).

A directory asked by name is walked ahead (:meth:`ListingCache.walk_ahead`): when the names
asked follow one another in its (expired) listing's order -- ``ls -l``, ``find``, ``du`` --
the next ones are asked of the origin with the asked one, in the same worker-thread job
(a window doubling up to ``AHEAD_MAX`` names while the walk goes on; S3's in parallel jobs:
:meth:`~airfs.origin.aio.AsyncOrigin.stat_many`). Each answer counts
from the moment the job started, as a ``stat`` would: it answers its name for the TTL.
"""

from __future__ import annotations

import bisect
import collections
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from airfs.origin.base import Entry, split

#: a listing whose fetch took this fraction of the TTL or more is not fetched again to
#: answer a name (it would be stale, or nearly, by the time it arrives)
RELIST_MAX_TOOK = 0.8
#: entries of one listing request (an S3 LIST page): a directory up to this size costs one
#: request to list, as much as one ``stat``
PAGE = 1000
#: the most names asked ahead of a walk in one origin job
AHEAD_MAX = 256
#: with ``Core.bare_entries``, a listing asks the attributes the origin does not know (S3:
#: a HEAD each) only when there are at most this many (else it is bare)
HEADS_MAX = 64
#: a walk over a bare listing's names asks them in this many parallel jobs (S3's listing
#: HEADs: 32 at once) of at most this long each
BARE_WALK_LANES = 32
BARE_WALK_BUDGET_S = 0.25
#: a directory with no listing kept is listed once this many different names were asked of
#: it one by one (a pass over it: a restarted job, ``find``; not one hot file)
FIRST_LISTING_AFTER = 16


@dataclass(frozen=True, slots=True)
class ListingStats:
    """``ListingCache.statistics()``: directories whose listing is kept, names answered from
    a listing (present, absent) and directories listed again to answer a name."""

    listings: int
    listing_hits: int
    listing_negative_hits: int
    relists: int


@dataclass
class Listing:
    """A directory's listing fetched at monotonic time ``at`` in ``took`` seconds; ``asked``:
    names asked of its directory since (answered from it, or by name once it expired)."""

    at: float
    entries: dict[str, Entry]
    took: float = 0.0
    asked: int = 0
    #: names asked ahead of a walk (see the module docstring): name -> (entry or None, at)
    ahead: dict[str, tuple[Entry | None, float]] = field(default_factory=dict)
    #: names asked of the origin one by one since it expired (what a new listing would save)
    by_name: int = 0
    #: fetched again (the directory had a listing before this one)
    again: bool = False
    #: the names in order (made at the first walk), the walk's window and where its last
    #: batch went in that order (the asked name's index, the index after the batch)
    order: list[str] | None = None
    window: int = 1
    reach: tuple[int, int] = (-1, -1)
    #: how many entries are ``guessed`` (their attributes not asked), and which of them were
    #: asked of the origin by name since it was fetched (the origin then knows their
    #: attributes: a new listing has them)
    guessed: int = 0
    named: set[str] = field(default_factory=set)

    @property
    def bare(self) -> bool:
        """Some entries are guessed: it answers which names exist, not their attributes."""
        return self.guessed > 0

    def note_named(self, name: str) -> None:
        """``name`` was asked of the origin by name (or read whole): if this listing only
        guessed its attributes, the origin knows them now."""
        e = self.entries.get(name)
        if e is not None and e.guessed:
            self.named.add(name)

    def all_named(self) -> bool:
        """Every name this listing guessed was asked by name since: listed again, it would
        answer them all (the origin remembers what it was told of each object's state)."""
        return len(self.named) >= self.guessed


def _never(dir_path: str) -> bool:
    return False


class ListingCache:
    """Bounded LRU of directory listings. Trio loop only."""

    def __init__(
        self,
        ttl: float,
        *,
        max_dirs: int = 4096,
        trusted: Callable[[str], bool] | None = None,
    ) -> None:
        self.ttl = ttl
        #: directories whose listings never expire (until :meth:`drop`): ``--immutable``, an
        #: immutable volume
        self.trusted = trusted or _never
        self.max_dirs = max_dirs
        self._dirs: collections.OrderedDict[str, Listing] = collections.OrderedDict()
        #: when a directory last changed in a way a listing cannot be patched for
        self._changed: dict[str, float] = {}
        #: recent changes made through the mount, per directory: name -> (when, entry)
        self._changes: dict[str, dict[str, tuple[float, Entry | None]]] = {}
        self.hits = 0
        self.negative_hits = 0
        self.relists = 0
        self.ahead_hits = 0
        #: directories with no listing kept -> the different names asked of them one by one
        self._unlisted: collections.OrderedDict[str, set[str]] = collections.OrderedDict()

    def put(self, dir_path: str, entries: list[Entry], at: float, took: float = 0.0) -> Listing:
        """Store a listing fetched at ``at`` in ``took`` seconds (kept only if no change
        through the mount touched the directory since ``at``)."""
        listing = Listing(at, {e.name: e for e in entries}, took, again=dir_path in self._dirs)
        listing.guessed = sum(1 for e in entries if e.guessed)
        recent = self._changes.get(dir_path)
        if recent:
            horizon = time.monotonic() - max(60.0, 10 * self.ttl)
            for name, (when, entry) in list(recent.items()):
                if when < horizon:
                    del recent[name]
                elif when >= at:  # made through the mount while the listing was fetched
                    if entry is None:
                        listing.entries.pop(name, None)
                    else:
                        listing.entries[name] = entry
        self._unlisted.pop(dir_path, None)
        if self._changed.get(dir_path, -1.0) < at:
            self._dirs[dir_path] = listing
            self._dirs.move_to_end(dir_path)
            while len(self._dirs) > self.max_dirs:
                old, _ = self._dirs.popitem(last=False)
                self._changed.pop(old, None)
                self._changes.pop(old, None)
        return listing

    def fresh(self, dir_path: str) -> Listing | None:
        listing = self._dirs.get(dir_path)
        if listing is None or (
            time.monotonic() - listing.at >= self.ttl and not self.trusted(dir_path)
        ):
            return None
        return listing

    def latest(self, dir_path: str) -> Listing | None:
        """The listing kept for ``dir_path``, fresh or not."""
        return self._dirs.get(dir_path)

    def kept(self, dir_path: str, listing: Listing) -> bool:
        """Whether ``listing`` is the one kept for ``dir_path`` (:meth:`put` may refuse it)."""
        return self._dirs.get(dir_path) is listing

    def worth_relisting(self, dir_path: str, name_s: float = 0.0) -> bool:
        """Whether the next name asked in ``dir_path`` (whose listing expired) should fetch
        its listing again rather than ask about that name (the rule in the module's text);
        ``name_s``: what asking the origin about one name costs now (seconds)."""
        listing = self._dirs.get(dir_path)
        if listing is None:
            return False
        if listing.again and listing.took >= self.ttl:
            return False  # stale when it arrived, and not the first listing's HEADs
        if name_s > 0 and listing.by_name * name_s >= listing.took:
            return True  # the names asked one by one since cost more than the listing did
        if listing.took >= self.ttl * RELIST_MAX_TOOK:
            return False
        return len(listing.entries) <= PAGE or listing.asked * PAGE >= len(listing.entries)

    def first_listing_due(self, dir_path: str, name: str) -> bool:
        """``name`` of ``dir_path``, which has no listing kept, is about to be asked of the
        origin by itself: whether to list the directory instead (``FIRST_LISTING_AFTER``
        different names asked so)."""
        if dir_path in self._dirs:
            return False
        names = self._unlisted.get(dir_path)
        if names is None:
            names = self._unlisted[dir_path] = set()
            while len(self._unlisted) > self.max_dirs:
                self._unlisted.popitem(last=False)
        else:
            self._unlisted.move_to_end(dir_path)
        if len(names) < FIRST_LISTING_AFTER:
            names.add(name)
        return len(names) >= FIRST_LISTING_AFTER

    def asked(self, dir_path: str, names: int = 1) -> None:
        """``names`` names in ``dir_path`` were asked of the origin by name (its listing
        expired and was not fetched again): they count toward fetching it again."""
        listing = self._dirs.get(dir_path)
        if listing is not None:
            listing.asked += names
            listing.by_name += names

    def walk_ahead(self, dir_path: str, name: str) -> list[str]:
        """``name`` of ``dir_path`` is about to be asked of the origin by itself: the names
        after it in the directory's listing to ask with it (none unless the names asked
        follow one another in the listing's order)."""
        listing = self._dirs.get(dir_path)
        if listing is None:
            return []
        if listing.order is None:
            listing.order = sorted(listing.entries)
        order = listing.order
        i = bisect.bisect_left(order, name)
        if i >= len(order) or order[i] != name:
            listing.window, listing.reach = 1, (-1, -1)
            return []
        # the walk goes on when the name is past the last one asked and at most the next
        # after what its batch reached (a batch cut short by its time budget included)
        low, high = listing.reach
        listing.window = min(2 * listing.window, AHEAD_MAX) if low < i <= high else 1
        end = min(i + listing.window, len(order))
        listing.reach = (i, end)
        return order[i + 1 : end]

    def put_ahead(self, dir_path: str, got: list[tuple[str, Entry | None]], at: float) -> None:
        """Keep the entries of names asked ahead at ``at`` (not those changed through the
        mount since ``at``: their change is newer)."""
        listing = self._dirs.get(dir_path)
        if listing is None:
            return
        recent = self._changes.get(dir_path, {})
        for name, entry in got:
            change = recent.get(name)
            if change is None or change[0] < at:
                listing.ahead[name] = (entry, at)

    def take_ahead(self, dir_path: str, name: str) -> tuple[Entry | None, float] | None:
        """The entry of ``name`` asked ahead and still fresh (entry or None, when it was
        asked), once; None when there is none."""
        listing = self._dirs.get(dir_path)
        if listing is None:
            return None
        got = listing.ahead.pop(name, None)
        if got is None or time.monotonic() - got[1] >= self.ttl:
            return None
        self.ahead_hits += 1
        return got

    def record(self, path: str, entry: Entry | None) -> None:
        """A change made through the mount: ``path`` now has ``entry`` (None: removed)."""
        parent, name = split(path)
        now = time.monotonic()
        recent = self._changes.setdefault(parent, {})
        recent[name] = (now, entry)
        if len(recent) > 10_000:  # only changes newer than any fetch in flight matter
            horizon = now - max(60.0, 10 * self.ttl)
            for n in [n for n, (when, _e) in recent.items() if when < horizon]:
                del recent[n]
        listing = self._dirs.get(parent)
        if listing is None:
            return
        listing.ahead.pop(name, None)
        if entry is None:
            listing.entries.pop(name, None)
        else:
            listing.entries[name] = entry

    def drop(self, path: str) -> int:
        """Forget listings of ``path`` and of every directory under it; returns how many."""
        prefix = path + "/" if path else ""
        gone = [p for p in self._dirs if p == path or p.startswith(prefix)]
        for p in gone:
            del self._dirs[p]
            self._changes.pop(p, None)
        self._changed[path] = time.monotonic()
        return len(gone)

    def discard(self, dir_path: str) -> None:
        """Forget the listing of ``dir_path`` only."""
        self._dirs.pop(dir_path, None)
        self._changed[dir_path] = time.monotonic()

    def statistics(self) -> ListingStats:
        return ListingStats(len(self._dirs), self.hits, self.negative_hits, self.relists)
