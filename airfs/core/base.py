"""The core's state and the helpers every operation shares (see :mod:`airfs.core.fs`).

:class:`Core` holds the origin, read path, staging area, inode table and listings, resolves
names and attributes, revalidates entries against the origin (:mod:`airfs.core.revalidate`, a
mixin) and takes the uploader's ``committed`` hook. The operations are layered on it by role:
:mod:`airfs.core.files` (open, read, write, close), :mod:`airfs.core.names` (directories and
names), :mod:`airfs.core.fs` (lookups and attributes: the :class:`Filesystem` the adapters
drive).
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
    OriginError,
    join,
    split,
)
from airfs.writeback.opens import Opens
from airfs.writeback.staging import Staged, StagingArea

from .ahead import FetchAhead
from .attrs import Attr, Owner, allocated_blocks, attr_of, attr_of_entry
from .context import Guard, current_caller
from .handles import DirHandle, Handle, err
from .inodes import InodeTable, Node
from .kernelcache import KernelCache
from .listings import ListingCache
from .passthrough import SMALL_FILE_MAX, Passthrough
from .readpath import ObjectRef, ReadPath
from .revalidate import Question, Revalidation

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


class Core(Revalidation):
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
        #: the adapter's ``readdir`` can answer a name without its attributes (``Emit``'s
        #: ``known``): set by the kernel transport; then ``opendir`` lists a big directory
        #: without asking every object's attributes (:data:`~.names.READDIR_HEADS_MAX`)
        self.bare_entries = False
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
        self.relisting: dict[tuple[str, bool], trio.Event] = {}
        self.asking: dict[str, Question] = {}
        self.joined_asks = 0
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
        #: a directory's files opened in order: the next ones fetched ahead (the daemon
        #: sets its ``submit``; off in a core without one)
        self.ahead = FetchAhead(self.listings, max_size=SMALL_FILE_MAX)
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

    async def settle(self, path: str, *, stop: bool = False) -> None:
        """Wait for in-flight commits at or under ``path`` to end, so a name operation
        never races an upload to the old name; then put the journal updates of the commits
        that landed on disk (else, after a crash, the record of a commit that landed at the
        old name would be replayed there once the name operation has moved or removed it).

        With ``stop`` (a rename or unlink, which holds the paths: no commit starts there
        meanwhile) each upload is first asked to stop before it publishes anything
        (:meth:`~airfs.writeback.versions.Staged.cancel_upload`, where the origin has
        ``cancel_puts``): one that stops leaves its version pending, which the operation
        then renames or drops locally, instead of waiting for the whole upload and then
        renaming (on S3: copying) or deleting the object."""
        while True:
            while busy := self.uploading(path):
                if stop:
                    for v in busy:
                        v.cancel_upload()
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
