"""Directory listings the core has seen, used to answer lookups without asking the origin.

A listing fetched at monotonic time ``at`` answers lookups of names in that directory, both
positive (the entry) and negative (ENOENT), until ``at + ttl``: the same freshness rule as an
entry from ``stat``, so the consistency contract is unchanged. One ``list`` request then
replaces a ``stat`` per file, which is what makes a pass over a large directory of small files
fast on a remote origin. Changes made through this mount update the cached listings in place
(:meth:`ListingCache.record`) and are replayed onto a listing whose fetch raced them; a
listing whose fetch raced a change of unknown outcome (:meth:`ListingCache.discard`) is not
kept.
"""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass

from airfs.origin.base import Entry, split


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
    at: float
    entries: dict[str, Entry]


class ListingCache:
    """Bounded LRU of directory listings. Trio loop only."""

    def __init__(self, ttl: float, *, max_dirs: int = 4096, relist_min: int = 0) -> None:
        self.ttl = ttl
        self.max_dirs = max_dirs
        #: an expired listing with at least this many entries is fetched again in one request
        #: rather than answering its names with one ``stat`` each (a directory that was listed
        #: or created through the mount is likely to see more lookups)
        self.relist_min = relist_min
        self._dirs: collections.OrderedDict[str, Listing] = collections.OrderedDict()
        #: when a directory last changed in a way a listing cannot be patched for
        self._changed: dict[str, float] = {}
        #: recent changes made through the mount, per directory: name -> (when, entry)
        self._changes: dict[str, dict[str, tuple[float, Entry | None]]] = {}
        self.hits = 0
        self.negative_hits = 0
        self.relists = 0

    def put(self, dir_path: str, entries: list[Entry], at: float) -> Listing:
        """Store a listing fetched at ``at`` (kept only if no change through the mount
        touched the directory since ``at``)."""
        listing = Listing(at, {e.name: e for e in entries})
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
        if listing is None or time.monotonic() - listing.at >= self.ttl:
            return None
        return listing

    def worth_relisting(self, dir_path: str) -> bool:
        listing = self._dirs.get(dir_path)
        return listing is not None and len(listing.entries) >= self.relist_min

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
        if entry is None:
            listing.entries.pop(name, None)
        else:
            listing.entries[name] = entry

    def drop(self, path: str) -> None:
        """Forget listings of ``path`` and of every directory under it."""
        prefix = path + "/" if path else ""
        for p in [p for p in self._dirs if p == path or p.startswith(prefix)]:
            del self._dirs[p]
            self._changes.pop(p, None)
        self._changed[path] = time.monotonic()

    def discard(self, dir_path: str) -> None:
        """Forget the listing of ``dir_path`` only."""
        self._dirs.pop(dir_path, None)
        self._changed[dir_path] = time.monotonic()

    def statistics(self) -> ListingStats:
        return ListingStats(len(self._dirs), self.hits, self.negative_hits, self.relists)
