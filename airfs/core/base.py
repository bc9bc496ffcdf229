"""The core's state and the helpers every operation shares (see :mod:`airfs.core.fs`).

:class:`Core` holds the origin, read path, staging area, inode table and listings, resolves
names and attributes, revalidates entries against the origin and takes the uploader's
``committed`` hook. The operations are layered on it by role: :mod:`airfs.core.files` (open,
read, write, close), :mod:`airfs.core.names` (directories and names), :mod:`airfs.core.fs`
(lookups and attributes: the :class:`Filesystem` the adapters drive).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import errno
import functools
import logging
import os
import stat
import time
from collections.abc import Awaitable, Callable
from time import perf_counter
from typing import ParamSpec, TypeVar

import trio

from airfs.obs.histogram import Latencies
from airfs.origin.aio import AsyncOrigin
from airfs.origin.base import (
    Entry,
    Kind,
    NotADir,
    NotFound,
    OriginError,
    join,
    split,
)
from airfs.writeback.opens import Opens
from airfs.writeback.staging import Staged, StagingArea

from .attrs import Attr, Owner, allocated_blocks, attr_of, attr_of_entry
from .context import Guard, current_caller
from .handles import DirHandle, Handle, err
from .inodes import InodeTable, Node
from .kernelcache import KernelCache
from .listings import Listing, ListingCache
from .passthrough import Passthrough
from .readpath import ObjectRef, ReadPath, files_listed

log = logging.getLogger(__name__)

NAME_MAX = 255
#: committed files up to this size are copied into the block cache (small files written and
#: read back, e.g. a dataset being built); larger ones (checkpoints) are not: the extra copy
#: of a multi-GiB file on the local disk costs more than it is likely to save
ADOPT_MAX = 128 << 20
#: directories whose "changed here" time is remembered (the least recently changed are
#: forgotten first, and then report the origin's mtime)
DIR_TIMES_MAX = 100_000

P = ParamSpec("P")
R = TypeVar("R")


def counted(fn: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
    """Count calls of a core operation in ``Filesystem.ops`` (when they start) and their
    durations in ``Filesystem.latency`` (when they end: with a result, an error or a
    cancellation), and settle the staging area's disk changes the operation queued before it
    returns (a ``close``, ``rename`` or ``unlink`` that returned survives a daemon crash). The
    duration is wall time from the call to its end on the trio loop, waits for the origin and
    the settle included; it costs one ``perf_counter`` pair and one
    :meth:`~airfs.obs.histogram.Latencies.observe` per call."""
    name = fn.__name__

    @functools.wraps(fn)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        core: Core = args[0].core  # type: ignore[attr-defined]
        core.ops[name] += 1
        t0 = perf_counter()
        disk = core.area.disk
        mark = disk.mark
        try:
            out = await fn(*args, **kwargs)
            if disk.wants_settle(mark):
                await disk.settle(since=mark)  # what it changed is on disk when it returns
            return out
        except Exception:
            if disk.wants_settle(mark):  # what it changed before failing is kept too
                with contextlib.suppress(OSError):
                    await disk.settle(since=mark)
            raise
        finally:
            core.latency.observe(name, perf_counter() - t0)

    return wrapper


class Core:
    """The core's state and the helpers its parts share (:class:`~airfs.core.files.Files`,
    :class:`~airfs.core.names.Names` and :class:`~airfs.core.fs.Filesystem` hold it as
    ``core``; :func:`counted` operations are methods of those parts). Every method runs on
    the trio loop; blocking
    origin calls go to threads."""

    def __init__(
        self,
        origin: AsyncOrigin,
        readpath: ReadPath,
        area: StagingArea,
        root_entry: Entry,
        *,
        ttl: float = 1.0,
        immutable: bool = False,
        owner: Owner | None = None,
        write_wait_s: float = 30.0,
        allow_devices: bool = False,
        guard: Guard | None = None,
    ) -> None:
        self.origin = origin
        self.allow_devices = allow_devices
        self.guard = guard
        #: directories whose entries changed here (a staged create or unlink) at this time
        #: (ns): reported as their mtime/ctime until the origin reports a later one
        self.dir_times: collections.OrderedDict[str, int] = collections.OrderedDict()
        self.readpath = readpath
        self.area = area
        self.ttl = ttl
        #: names and versions are trusted until :meth:`forget_known` (``airfs refresh``)
        self.immutable = immutable
        self.owner = owner or Owner(os.getuid(), os.getgid())
        self.write_wait_s = write_wait_s
        self.inodes = InodeTable(root_entry, guard.storage if guard is not None else None)
        self.handles: dict[int, Handle] = {}
        self.dirs: dict[int, DirHandle] = {}
        self._next_fh = 1
        self.ops: collections.Counter[str] = collections.Counter()
        #: durations of the core operations (see :func:`counted`)
        self.latency = Latencies()
        self.listings = ListingCache(ttl, trusted=self.trusts)
        self.relisting: dict[str, trio.Event] = {}
        #: what asking the origin about one name costs (seconds, a moving mean)
        self.name_s = 0.0
        #: opens answered inline (:meth:`~airfs.core.files.Files.open`'s fast way)
        self.fast_opens = 0
        caps = origin.capabilities
        self.pin = origin.sync.pin if caps.pin else None  # type: ignore[attr-defined]
        self.unpin = origin.sync.unpin if caps.pin else None  # type: ignore[attr-defined]
        self.mtimes = caps.mtimes
        #: the one owner of which staged version each open handle uses
        self.opens = Opens(area)
        self.passthrough = Passthrough(area, self.opens, readpath, self.inodes)
        #: what the kernel may keep past the TTL (leases, checks, invalidations)
        self.kernel = KernelCache(self)

    # -- helpers ---------------------------------------------------------------------------

    def new_fh(self) -> int:
        fh = self._next_fh
        self._next_fh += 1
        return fh

    def set_next_fh(self, fh: int) -> None:
        """The next handle opened is numbered ``fh`` (a daemon taking over the kernel's
        connection reopens its handles under their numbers: :mod:`airfs.core.restore`)."""
        self._next_fh = fh

    def path_of(self, node: Node) -> str:
        if node.path is None:
            # ESTALE, not ENOENT: a path-based call (open, stat) that raced a rename-over
            # or an unlink is retried by the kernel with a fresh lookup
            raise err(errno.ESTALE, f"inode {node.ino} was replaced or removed")
        return node.path

    def child(self, parent_ino: int, name: str) -> str:
        parent = self.inodes.get(parent_ino)
        if parent.kind is not Kind.DIR:
            raise err(errno.ENOTDIR, "not a directory")
        if len(os.fsencode(name)) > NAME_MAX:
            raise err(errno.ENAMETOOLONG, "name too long")
        if name in ("", ".", "..") or "/" in name:
            raise err(errno.EINVAL, f"invalid name {name!r}")
        return join(self.path_of(parent), name)

    def new_child(self, parent_ino: int, name: str) -> str:
        """``_child`` for a name about to be created: also refused when the origin could not
        store it (EINVAL / ENAMETOOLONG, before anything is written)."""
        path = self.child(parent_ino, name)
        self.origin.sync.check_name(path)
        return path

    def staged_attr(self, node: Node, st: Staged) -> Attr:
        self.passthrough.sync(st)
        owner = Owner(
            self.owner.uid if st.uid is None else st.uid,
            self.owner.gid if st.gid is None else st.gid,
        )
        return attr_of(
            node.ino,
            Kind.FILE,
            st.size,
            st.mtime_ns,
            st.mode,
            owner,
            atime_ns=st.atime_ns,
            ctime_ns=max(st.ctime_ns, st.mtime_ns),
            blocks=allocated_blocks(st.fd),
        )

    def entry_attr(self, node: Node, entry: Entry) -> Attr:
        """Attributes of an origin entry; a directory whose entries changed here reports
        that change's time until the origin reports a later one."""
        if entry.kind is Kind.DIR and node.path is not None:
            t = self.dir_times.get(node.path)
            if t is not None:
                if t > entry.mtime_ns:
                    ctime = max(t, entry.ctime_ns or 0)
                    entry = dataclasses.replace(entry, mtime_ns=t, ctime_ns=ctime)
                else:
                    del self.dir_times[node.path]
            if self.level(node.path):
                # the origin counts every subdirectory, hidden ones too: 1 ("not counted",
                # as on filesystems that keep no count) shows nothing
                return dataclasses.replace(attr_of_entry(node.ino, entry, self.owner), nlink=1)
        return attr_of_entry(node.ino, entry, self.owner)

    def dir_changed(self, path: str, subdirs: int = 0) -> None:
        """The entry ``path`` was created, removed or renamed in its directory; ``subdirs``:
        the directory gained (+1) or lost (-1) a subdirectory, so its link count moved (where
        the origin counts links)."""
        parent = split(path)[0]
        self.dir_times[parent] = time.time_ns()
        self.dir_times.move_to_end(parent)
        if len(self.dir_times) > DIR_TIMES_MAX:  # bounded: the oldest fall back to the origin's
            self.dir_times.popitem(last=False)
        if subdirs and self.origin.capabilities.hard_links:
            node = self.inodes.at(parent)
            if node is not None and node.entry is not None and node.entry.nlink >= 2:
                node.entry = dataclasses.replace(
                    node.entry, nlink=max(2, node.entry.nlink + subdirs)
                )
                self.listings.record(parent, node.entry)

    def attr(self, node: Node) -> Attr:
        st = self.area.get(node.path) if node.path is not None else self.opens.of_file(node.ino)
        if st is not None:
            return self.staged_attr(node, st)
        if node.entry is None:
            raise err(errno.ENOENT, "no such file")
        return self.entry_attr(node, node.entry)

    def trusts(self, path: str) -> bool:
        """Whether what is known of ``path`` (its name, its version; a directory's listing)
        is trusted until :meth:`forget_known` rather than for the TTL: ``--immutable``, or a
        volume the catalog declares immutable (seen within the catalog's TTL; when the
        declaration ends the TTL applies again at once)."""
        return self.immutable or (self.guard is not None and self.guard.immutable(path))

    def fresh(self, node: Node) -> bool:
        """Whether ``node.entry`` may be used without asking the origin. A file with several
        names is always asked (a change through another name moves its link count)."""
        e = node.entry
        if self.immutable or (node.path is not None and self.trusts(node.path)):
            return e is not None and node.fetched > 0.0  # 0: forgotten (or never asked)
        if e is None or (e.nlink > 1 and e.kind is not Kind.DIR):
            return False
        return time.monotonic() - node.fetched < self.ttl

    def forget_known(self, path: str) -> dict[str, int]:
        """Make ``path`` and everything under it be asked of the origin again at its next
        use (see :meth:`~airfs.core.fs.Filesystem.refresh`)."""
        prefix = f"{path}/" if path else ""
        names = 0
        self.kernel.forgot(path)
        for node in self.inodes.nodes():
            p = node.path
            if p is not None and (p == path or p.startswith(prefix)) and node.fetched > 0.0:
                node.fetched = 0.0
                names += 1
        listings = self.listings.drop(path)
        if path:  # the directory's listing names it too
            parent = split(path)[0]
            listings += self.listings.latest(parent) is not None
            self.listings.discard(parent)
        return {"names": names, "listings": listings}

    def per_caller(self, ino: int, name: str | None = None) -> bool:
        """Whether the kernel's answer about inode ``ino`` (with ``name``: about that name in
        directory ``ino``) is the caller's own: at a governed level (the root, a catalog, a
        schema, a volume root), where whether a name exists for the caller depends on its
        grants. Then an entry is not kept (entry timeout 0: every path walk through it asks
        again, as its caller) and "no such name" is never a negative entry. Attributes keep
        the TTL: they are the same for every caller that may see the name (the levels' link
        counts are 1: :meth:`_entry_attr`). Inside a volume the kernel keeps entries for the
        TTL: a caller reaches them only through its volume root, asked every time."""
        if self.guard is None or not self.guard.governs():
            return False
        try:
            path = self.path_of(self.inodes.get(ino))
        except OSError:
            return False
        return self.level(join(path, name) if name is not None else path)

    def level(self, path: str) -> bool:
        """``path`` is the root, a catalog, a schema or a volume root of a governed mount."""
        return self.guard is not None and self.guard.governs() and path.count("/") < 3

    def one_storage(self, src: str, dst: str, op: str) -> None:
        """EXDEV unless ``src`` and ``dst`` live in one storage (a governed volume is its own
        storage: tools then copy, and the copy's read is checked)."""
        if self.guard is None:
            return
        a, b = self.guard.storage(src), self.guard.storage(dst)
        if a != b:
            raise err(errno.EXDEV, f"{op} /{src} -> /{dst}: volumes {a} and {b} are two storages")

    async def check(self, op: str, path: str) -> None:
        """Ask the guard (governed volumes) whether the caller may do ``op`` on ``path``."""
        if self.guard is not None:
            await self.guard.check(current_caller(), op, path)

    def new_owner(self, parent_ino: int) -> tuple[int, int, bool]:
        """(uid, gid, setgid) of an object the caller creates in ``parent_ino``: the caller's
        uid, and its gid unless the directory is setgid (then the directory's group, and new
        directories inherit the setgid bit)."""
        caller = current_caller()
        parent = self.inodes.get(parent_ino)
        try:
            pattr = self.attr(parent)
        except OSError:
            return caller.uid, caller.gid, False
        if pattr.mode & stat.S_ISGID:
            return caller.uid, pattr.gid, True
        return caller.uid, caller.gid, False

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
        from ``stat``."""
        if path:
            parent, name = split(path)
            listing = self.listings.fresh(parent)
            if listing is None and (
                self.listings.worth_relisting(parent, self.name_s)
                or self.listings.first_listing_due(parent, name)
            ):
                listing = await self.relist(parent, time.monotonic())
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
                t0 = time.monotonic()
                got = await self.origin.stat_many(
                    [path, *(join(parent, n) for n in more)], fast=True
                )
                self.name_cost(t0, len(got))
                asked = [(n, got[p]) for n in more if (p := join(parent, n)) in got]
                self.listings.put_ahead(parent, asked, t0)
                return got[path], t0
        t0 = time.monotonic()
        entry = await self.stat(path, fast=True)
        self.name_cost(t0, 1)
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

    async def relist(self, dir_path: str, since: float) -> Listing | None:
        """Fetch ``dir_path``'s listing again (one fetch at a time per directory; a caller
        that finds one in flight waits for it). The listing is returned to a caller that
        asked at ``since`` if it was kept and fresh at ``since`` (it shows the origin as of
        its start, so no change older than the TTL is missed), even if it expired while it
        was fetched."""
        busy = self.relisting.get(dir_path)
        if busy is not None:
            await busy.wait()
            listing = self.listings.latest(dir_path)
            if listing is None:
                return None
            return listing if since - listing.at < self.ttl else None
        done = self.relisting[dir_path] = trio.Event()
        try:
            t0 = time.monotonic()
            try:
                entries = await self.origin.list(dir_path, fast=True)
            except (NotFound, NotADir):
                self.listings.drop(dir_path)
                return None
            self.listings.relists += 1
            listing = self.put_listing(dir_path, entries, t0)
            return listing if self.listings.kept(dir_path, listing) else None
        finally:
            del self.relisting[dir_path]
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

    async def committed(self, path: str, entry: Entry, st: Staged) -> None:
        """The uploader's ``on_committed`` hook: ``st`` is at the origin as ``entry``.

        Runs while the upload still holds ``st``, so the staged bytes are exactly that
        version's. Attributes set while it was being uploaded (``rsync`` sets owner, mode and
        times on its temporary file just before the rename) are set at the origin now. Where
        the origin keeps no mtimes, the entry takes the staged file's mtime, so a file's
        attributes never change by themselves at its commit."""
        caps = self.origin.capabilities
        mode = st.mode & 0o7777 if caps.modes and st.mode & 0o7777 != entry.mode else None
        mtime = st.mtime_ns if self.mtimes and st.mtime_ns != entry.mtime_ns else None
        uid = st.uid if caps.owners and st.uid is not None and st.uid != entry.uid else None
        gid = st.gid if caps.owners and st.gid is not None and st.gid != entry.gid else None
        if not st.dirty and any(v is not None for v in (mode, mtime, uid, gid)):
            put_version = entry.version
            try:
                entry = await self.origin.set_attrs(path, mode, mtime, uid=uid, gid=gid)
            except OriginError as exc:
                log.warning("%s: attributes set during its commit not kept: %s", path, exc)
            else:
                if st.ps is not None and st.ps.base == put_version:
                    # our own change: the next commit replaces it (journaled: after a crash
                    # it is still ours, not a conflict)
                    self.area.rebase(st.ps, entry.version)
        if not self.mtimes:
            entry = dataclasses.replace(entry, mtime_ns=st.mtime_ns)
        self.listings.record(path, entry)
        node = self.inodes.at(path)
        if node is not None:
            if node.aliases:
                self.inodes.split(node)  # a new file at this name: the other names part
            node.entry = entry
            node.fetched = time.monotonic()
            if node.cached_version == f"staged:{st.id}" and not st.dirty:
                node.cached_version = entry.version
        self.readpath.discard(path, keep=entry.version)  # the versions this one replaced
        if not st.dirty and entry.size == st.size <= ADOPT_MAX:
            try:
                await self.readpath.adopt(ObjectRef(path, entry.version, entry.size), st.file)
            except (OSError, ValueError) as exc:
                log.warning("could not keep %s in the cache after commit: %s", path, exc)

    # -- waiting for commits ---------------------------------------------------------------

    async def settle(self, path: str) -> None:
        """Wait for in-flight commits at or under ``path`` to land, so a name operation
        never races an upload to the old name; then put the journal updates of the commits
        that landed on disk (else, after a crash, the record of a commit that landed at the
        old name would be replayed there once the name operation has moved or removed it)."""
        while True:
            while busy := self.uploading(path):
                await self.wait_upload(busy[0])
            with contextlib.suppress(OSError):  # journal full: the operation's settle says so
                await self.area.settle()
            if not self.uploading(path):  # none started while we settled: no await after
                return

    def uploading(self, path: str) -> list[Staged]:
        return [v for st in self.area.under(path) for v in self.area.versions(st) if v.uploading]

    async def wait_upload(self, st: Staged) -> None:
        while st.uploading:
            await st.upload_done.wait()

    async def commit_now(self, st: Staged) -> None:
        """Commit ``st`` and the closed versions before it now, and wait."""
        targets = [(v, v.gen) for v in self.area.versions(st) if v.dirty]
        await self.area.wait_committed(targets)
