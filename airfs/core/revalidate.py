"""How the core asks the origin about names (a mixin of :class:`~airfs.core.base.Core`):
one name by ``stat``, or a whole directory by listing it when that is worth it (the rules in
:mod:`airfs.core.listings`), or -- a cold file of at most ``WHOLE_READ_MAX`` bytes in a
directory being read (:meth:`~airfs.core.ahead.FetchAhead.reading`), on an origin with
``whole_reads`` -- by reading it whole, which fills the cache for its open; and an entry
refreshed once its TTL is over. One question per name at a time: a caller that finds the same
name being asked (:meth:`Revalidation.origin_entry`) waits for that answer instead of asking
again. Trio loop only; the origin calls go to worker threads (:mod:`airfs.origin.aio`)."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import trio

from airfs.origin.base import Entry, Kind, NotADir, NotFound, OriginError, join, split

from .inodes import Node
from .listings import BARE_WALK_BUDGET_S, BARE_WALK_LANES, HEADS_MAX, Listing
from .readpath import ObjectRef, files_listed

if TYPE_CHECKING:
    from airfs.origin.aio import AsyncOrigin

    from .ahead import FetchAhead
    from .listings import ListingCache
    from .readpath import ReadPath

log = logging.getLogger("airfs.core.base")

#: a cold file of at most this many bytes, in a directory being read, is revalidated by
#: reading it whole (``Capabilities.whole_reads``): the request that checks its name also
#: fetches what its open is about to read
WHOLE_READ_MAX = 1 << 20


@dataclass(eq=False, slots=True)
class Question:
    """One name being asked of the origin (:meth:`Revalidation.origin_entry`): since ``t0``
    (monotonic); ``done`` once it ended with its ``answer`` or origin ``error`` (neither:
    cancelled)."""

    t0: float
    done: trio.Event = field(default_factory=trio.Event)
    answer: tuple[Entry | None, float] | None = None
    error: OriginError | None = None


class Revalidation:
    """The core's origin lookups (mixed into :class:`~airfs.core.base.Core`, whose state
    they use: declared here, set by ``Core.__init__``)."""

    origin: AsyncOrigin
    listings: ListingCache
    readpath: ReadPath
    ahead: FetchAhead
    relisting: dict[tuple[str, bool], trio.Event]
    #: the adapter answers names without attributes (``Core``'s; see there)
    bare_entries: bool
    #: the names being asked of the origin now
    asking: dict[str, Question]
    #: questions answered by one already in flight (:meth:`origin_entry`)
    joined_asks: int
    ttl: float
    #: what asking the origin about one name costs (seconds, a moving mean)
    name_s: float

    def fresh(self, node: Node) -> bool:
        raise NotImplementedError  # Core's

    def path_of(self, node: Node) -> str:
        raise NotImplementedError  # Core's

    async def stat(self, path: str, *, fast: bool = False) -> Entry | None:
        """The origin's entry of ``path`` (None: it does not exist); ``fast`` ones (what the
        core revalidates) are asked together with those asked meanwhile."""
        try:
            if fast:
                return await self.origin.stat_joined(path)
            return await self.origin.stat(path)
        except NotFound:
            return None

    async def origin_entry(self, path: str) -> tuple[Entry | None, float]:
        """The origin's entry for ``path`` (None: it does not exist) and the monotonic time it
        is valid from: from a fresh listing of its directory when there is one (an expired
        listing is fetched again when that is worth it: :mod:`airfs.core.listings`), else
        from ``stat``.

        One question per name at a time: a caller that comes while ``path`` is being asked,
        by a question that started less than a TTL before it came, waits for that answer and
        takes it: every change made at the origin more than a TTL before the caller came is
        in it (the TTL contract). An origin error of that question is the waiting callers'
        too; when it was cancelled (its request interrupted) they ask again. Without this,
        the kernel's requests for one name that arrive while it is asked (a directory every
        path walk goes through, whose attributes expired: one ``GETATTR`` per walker) each
        cost an origin request."""
        came = time.monotonic()
        while (busy := self.asking.get(path)) is not None and busy.t0 > came - self.ttl:
            await busy.done.wait()
            if busy.error is not None:
                self.joined_asks += 1
                raise busy.error
            if busy.answer is not None:
                self.joined_asks += 1
                return busy.answer
            # that question was cancelled: ask (or join the next one)
        q = Question(time.monotonic())
        self.asking[path] = q
        try:
            q.answer = await self._ask_entry(path)
            self._named(path)
            return q.answer
        except OriginError as exc:
            q.error = exc
            raise
        finally:
            self._ended(path, q)

    def _named(self, path: str) -> None:
        """``path`` was answered by the origin: a bare listing of its directory that guessed
        it counts it as asked by name (:meth:`Listing.note_named`)."""
        parent, name = split(path)
        latest = self.listings.latest(parent) if path else None
        if latest is not None and latest.bare:
            latest.note_named(name)

    def _ended(self, path: str, q: Question) -> None:
        """``q``, the question about ``path``, is over (answered, failed or not answered):
        later callers ask anew, those waiting take what it has."""
        if self.asking.get(path) is q:
            del self.asking[path]
        q.done.set()

    async def _ask_entry(self, path: str) -> tuple[Entry | None, float]:
        """:meth:`origin_entry`'s question, asked once. A name a bare listing has (fresh
        or not: :mod:`airfs.core.listings`) with its attributes guessed is asked by name:
        that listing fetched again would not answer it either."""
        if path:
            parent, name = split(path)
            listing = self._answering(self.listings.fresh(parent), name)
            latest = self.listings.latest(parent)
            by_name = (
                latest is not None
                and self._answering(latest, name) is None
                and not latest.all_named()
            )
            if listing is None and self.ahead.reading(parent):
                whole = await self._read_whole(parent, name, path)
                if whole is not None:
                    return whole
            if listing is None and latest is not None and latest.bare:
                # a walk over a bare listing answered it ahead (its last names, once every
                # name was asked, are still taken before listing it again)
                ahead = self.listings.take_ahead(parent, name)
                if ahead is not None:
                    self.listings.asked(parent)
                    return ahead
            if (
                listing is None
                and not by_name
                and (
                    self.listings.worth_relisting(parent, self.name_s)
                    or self.listings.first_listing_due(parent, name)
                )
            ):
                relisted = await self.relist(parent, time.monotonic(), bare=True)
                listing = self._answering(relisted, name)
            if listing is not None:
                listing.asked += 1
                entry = listing.entries.get(name)
                if entry is None:
                    self.listings.negative_hits += 1
                else:
                    self.listings.hits += 1
                return entry, listing.at
            self.listings.asked(parent)
            ahead = self.listings.take_ahead(parent, name)
            if ahead is not None:
                return ahead
            more = self.listings.walk_ahead(parent, name)
            if more:
                return await self._walk(parent, path, more)
        t0 = time.monotonic()
        entry = await self.stat(path, fast=True)
        self.name_cost(t0, 1)
        return entry, t0

    async def _walk(self, parent: str, path: str, more: list[str]) -> tuple[Entry | None, float]:
        """Ask ``path`` with the names ``more`` after it in ``parent``'s listing (a walk:
        :meth:`ListingCache.walk_ahead`). Each name asked ahead is a question of its own
        while the job runs (:meth:`origin_entry`): its lookup, arriving meanwhile, waits for
        this answer instead of asking again (one not answered, the job's time budget spent,
        is asked again by those waiting). The walk of a bare listing (whose names' attributes
        were never asked) goes as wide as a listing's HEADs would (``BARE_WALK_LANES``)."""
        t0 = time.monotonic()
        latest = self.listings.latest(parent)
        answered = latest.ahead if latest is not None else {}
        mine: dict[str, Question] = {}
        for n in more:
            p = join(parent, n)
            if p not in self.asking and (n not in answered or t0 - answered[n][1] >= self.ttl):
                mine[p] = self.asking[p] = Question(t0)  # not being asked, nor answered
        wide = latest is not None and latest.bare
        got: dict[str, Entry | None] = {}
        try:
            got = await self.origin.stat_many(
                [path, *mine],
                fast=True,
                lanes=BARE_WALK_LANES if wide else None,
                budget_s=BARE_WALK_BUDGET_S if wide else 0.02,
            )
        finally:
            for p, q in mine.items():
                if p in got:
                    q.answer = (got[p], t0)
                    self._named(p)
                self._ended(p, q)
        self.name_cost(t0, len(got))
        self.listings.asked(parent, len(mine))
        asked = [(n, got[p]) for n in more if (p := join(parent, n)) in got]
        self.listings.put_ahead(parent, asked, t0)
        return got[path], t0

    @staticmethod
    def _answering(listing: Listing | None, name: str) -> Listing | None:
        """``listing`` if it answers ``name`` (absent, or listed with its attributes)."""
        if listing is None:
            return None
        e = listing.entries.get(name)
        return None if e is not None and e.guessed else listing

    async def _read_whole(
        self, parent: str, name: str, path: str
    ) -> tuple[Entry | None, float] | None:
        """Revalidate ``path``, a file of the directory ``parent`` being read whose (expired)
        listing shows a version of at most ``WHOLE_READ_MAX`` bytes that the cache does not
        know, by reading it whole: one request answers the name (as a ``stat`` would, valid
        from when it was asked) and its bytes go to the cache
        (:meth:`~airfs.core.readpath.ReadPath.store_fetched`), so that the open that follows
        reads nothing more from the origin. None: not such a file (ask as usual)."""
        old = self.listings.latest(parent)
        e = old.entries.get(name) if old is not None else None
        if (
            e is None
            or e.kind is not Kind.FILE
            or not 0 < e.size <= WHOLE_READ_MAX
            or e.nlink > 1
            or not self.origin.capabilities.whole_reads
            or self.readpath.knows(ObjectRef(path, e.version, e.size))
        ):
            return None
        t0 = time.monotonic()
        try:
            entry, data = await self.origin.read_small(path, WHOLE_READ_MAX)
        except NotFound:
            return None  # gone, or a directory now: asked as usual
        if data is not None:
            self.readpath.store_fetched(ObjectRef(path, entry.version, entry.size), data)
        return entry, t0

    def name_cost(self, t0: float, names: int) -> None:
        """``names`` names were asked of the origin since ``t0``: the moving mean of what one
        costs (``name_s``, which :meth:`ListingCache.worth_relisting` weighs)."""
        self.name_s = 0.8 * self.name_s + 0.2 * (time.monotonic() - t0) / max(1, names)

    def put_listing(self, dir_path: str, entries: list[Entry], t0: float) -> Listing:
        """Keep a listing of ``dir_path`` fetched from ``t0``; the first one this daemon
        has of it names the read path the files likely to be opened next
        (:meth:`~airfs.core.readpath.ReadPath.expect`)."""
        first = self.listings.latest(dir_path) is None
        listing = self.listings.put(dir_path, entries, t0, time.monotonic() - t0)
        if first:
            self.readpath.expect(files_listed(dir_path, entries))
        return listing

    async def relist(
        self, dir_path: str, since: float, *, bare: bool = False
    ) -> Listing | None:
        """Fetch ``dir_path``'s listing again (one fetch at a time per directory and kind; a
        caller that finds one in flight waits for it). The listing is returned to a caller
        that asked at ``since`` if it was kept and fresh at ``since`` (it shows the origin as
        of its start, so no change older than the TTL is missed), even if it expired while
        it was fetched. ``bare``: with ``bare_entries``, the listing may be bare
        (:data:`~.listings.HEADS_MAX`); a caller that did not allow it never gets one."""
        bare = bare and self.bare_entries
        key = (dir_path, bare)
        busy = self.relisting.get(key)
        if busy is not None:
            await busy.wait()
            listing = self.listings.latest(dir_path)
            if listing is None or (listing.bare and not bare):
                return None
            return listing if since - listing.at < self.ttl else None
        done = self.relisting[key] = trio.Event()
        try:
            t0 = time.monotonic()
            try:
                heads = HEADS_MAX if bare else None
                entries = await self.origin.list(dir_path, fast=True, heads_max=heads)
            except (NotFound, NotADir):
                self.listings.drop(dir_path)
                return None
            self.listings.relists += 1
            listing = self.put_listing(dir_path, entries, t0)
            return listing if self.listings.kept(dir_path, listing) else None
        finally:
            del self.relisting[key]
            done.set()

    async def refresh(self, node: Node) -> Entry | None:
        """Re-read ``node``'s origin entry if it is older than the TTL (None if gone)."""
        if self.fresh(node):
            return node.entry
        path = self.path_of(node)
        try:
            if node.entry is not None and node.entry.nlink > 1 and node.kind is not Kind.DIR:
                # several names: a listing's entry for this one is stale after a change
                # through another (a link count, a chmod)
                t0 = time.monotonic()
                entry = await self.stat(path, fast=True)
            else:
                entry, t0 = await self.origin_entry(path)
        except OriginError as exc:
            if not exc.transient or node.entry is None:
                raise
            # origin unreachable: keep serving what we know (cached data stays readable)
            log.warning("%s: origin unreachable, using the last known version: %s", path, exc)
            return node.entry
        if entry is None:
            return None
        if entry.kind is not node.kind:
            return None  # replaced by another kind of object: the old inode is gone
        if t0 >= node.fetched:  # else a commit updated the node while we asked
            node.entry = entry
            node.fetched = t0
        return node.entry
