"""Fetch-ahead of a directory's files: a directory whose files are opened one after another in
its listing's order (``cp -r``, ``tar``, ``rsync``, a loader walking a sorted file list) gets
its next files fetched whole into the cache before they are opened.

:meth:`FetchAhead.opened` is told of every read-only open of a file (by the core, inline: one
dictionary lookup and a binary search in the directory's sorted names). When the file follows
the one opened before in that directory (the next name in its kept listing, or the one after:
a skipped directory or link does not break the walk) ``STREAK`` times running, the next
files of the listing, up to ``first`` of them and doubling to ``most`` while the walk goes on,
are handed to ``submit`` (the daemon's background prefetch: whole-file fetches within the
prefetch budget and slots, files already cached cost nothing). Only files of at most
``max_size`` bytes are fetched ahead: a big file streams with its own readahead once read.
Files are named with the version their (possibly expired) listing shows: a file changed since
costs one wasted fetch, never a stale read (its open asks the origin as always).

Opens that jump around (many processes interleaved in one directory, random access) break the
walk and fetch nothing. They still mark the directory as *being read*
(:meth:`FetchAhead.reading`: ``READING_OPENS`` opens, each within ``READING_S`` of the one
before), which tells the core to revalidate a cold small file of it by reading it whole
(:meth:`~airfs.core.revalidate.Revalidation.origin_entry`). Trio loop only.
"""

from __future__ import annotations

import bisect
import collections
import time
from collections.abc import Callable

from airfs.origin.base import Kind, join, split

from .listings import ListingCache
from .readpath import ObjectRef

__all__ = ["FetchAhead"]

#: consecutive in-order opens before the next files are fetched
STREAK = 2
#: a directory is being read after this many opens, each within ``READING_S`` seconds of
#: the one before
READING_OPENS = 8
READING_S = 5.0


class _Walk:
    __slots__ = ("at", "last", "n", "opens", "streak", "until")

    def __init__(self, i: int, first: int) -> None:
        self.last = i  # index of the last file opened
        self.streak = 0  # in-order opens running
        self.until = i  # index of the last file handed to submit
        self.n = first  # files to hand over next time
        self.opens = 1  # opens running, each within READING_S of the one before
        self.at = time.monotonic()  # when the last one was


class FetchAhead:
    """Walk detection per directory (the ``dirs`` most recent); ``submit`` receives the files
    to fetch (None: off)."""

    def __init__(
        self,
        listings: ListingCache,
        *,
        max_size: int,
        first: int = 4,
        most: int = 64,
        dirs: int = 256,
    ) -> None:
        self.listings = listings
        self.submit: Callable[[list[ObjectRef]], None] | None = None
        self.max_size = max_size
        self.first = first
        self.most = most
        self.max_dirs = dirs
        self._walks: collections.OrderedDict[str, _Walk] = collections.OrderedDict()
        #: files handed to ``submit`` so far (``airfs status``: ``fs.fetched_ahead``)
        self.submitted = 0

    def reading(self, dir_path: str) -> bool:
        """Whether files of ``dir_path`` are being opened to read, in any order (see the
        module's text); False when fetching ahead is off (no cache)."""
        walk = self._walks.get(dir_path)
        return (
            self.submit is not None
            and walk is not None
            and walk.opens >= READING_OPENS
            and time.monotonic() - walk.at < READING_S
        )

    def opened(self, path: str) -> None:
        """A file at ``path`` was opened to read: continue or break its directory's walk."""
        if self.submit is None:
            return
        parent, name = split(path)
        listing = self.listings.latest(parent)
        if listing is None:
            return
        if listing.order is None:
            listing.order = sorted(listing.entries)
        order = listing.order
        i = bisect.bisect_left(order, name)
        if i >= len(order) or order[i] != name:
            return
        walk = self._walks.get(parent)
        if walk is None:
            walk = self._walks[parent] = _Walk(i, self.first)
            while len(self._walks) > self.max_dirs:
                self._walks.popitem(last=False)
            return
        self._walks.move_to_end(parent)
        now = time.monotonic()
        walk.opens = walk.opens + 1 if now - walk.at < READING_S else 1
        walk.at = now
        if 0 < i - walk.last <= 2:
            walk.streak += 1
        elif i != walk.last:
            walk.streak, walk.until, walk.n = 0, i, self.first
        walk.last = i
        if walk.streak < STREAK or walk.until - i > walk.n // 2:
            return  # not a walk yet, or what was fetched ahead still reaches far enough
        start = max(walk.until, i) + 1
        end = min(len(order), start + walk.n)
        walk.until = end - 1
        walk.n = min(2 * walk.n, self.most)
        refs = []
        for k in range(start, end):
            e = listing.entries.get(order[k])
            if e is not None and e.kind is Kind.FILE and 0 < e.size <= self.max_size:
                refs.append(ObjectRef(join(parent, e.name), e.version, e.size))
        if refs:
            self.submitted += len(refs)
            self.submit(refs)
