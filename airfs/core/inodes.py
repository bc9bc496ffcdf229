"""The inode table: stable inode numbers for paths, kernel lookup counts and ``forget``.

Contract:

* an inode number stays bound to its node while the kernel holds a lookup reference, a handle
  is open on it, or it has local (staged) content; a rename moves the node (and, for a
  directory, every known descendant) to the new path without changing numbers;
* a node replaced or removed while still referenced is *detached*: it keeps its number and
  its open handles keep working, but no path leads to it any more;
* the names of one hard-linked file (an origin entry with ``nlink > 1`` and an ``ino``, or a
  name made by ``link``) share one node: ``path`` is one of its names, ``aliases`` the
  others, and the kernel sees one inode (its link count and ``st_ino`` right for every name);
* the root is inode 1 and is never dropped;
* a node made for a name a listing answered without attributes (:meth:`InodeTable.named`:
  no lookup reference) keeps its number, for ``stat`` to report what ``getdents`` did,
  while it is one of the ``NAMED_MAX`` most recent such nodes (beyond, the oldest is
  dropped if nothing else holds it).
"""

from __future__ import annotations

import collections
import errno
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import trio

from airfs.origin.base import Entry, Kind
from airfs.util.pathindex import PathDict, PathIndex

ROOT_INO = 1
LAST_KNOWN_MAX = 100_000
#: nodes kept for names answered without attributes, nothing else holding them
NAMED_MAX = 65_536


@dataclass(eq=False)
class Node:
    """One inode. ``entry`` is the last origin entry seen (None while the node exists only
    locally, e.g. a created file not yet committed); ``fetched`` is when (monotonic)."""

    ino: int
    path: str | None
    kind: Kind
    entry: Entry | None
    fetched: float
    lookups: int = 0
    opens: int = 0
    #: The version whose bytes the kernel may hold in its page cache for this inode.
    cached_version: str | None = None
    lock: trio.Lock = field(default_factory=trio.Lock)
    #: the file's other names (hard links), besides ``path``
    aliases: set[str] = field(default_factory=set)


def _one_storage(path: str) -> str:
    return ""


class NodeLog(Protocol):
    """Told every change of which node numbers exist and where they lead (a daemon taking
    over the kernel's connection rebuilds the table from it: :mod:`airfs.fuse.kernel.takeover`)."""

    def bound(self, ino: int, kind: Kind, path: str | None) -> None: ...
    def dropped(self, ino: int) -> None: ...


class InodeTable:
    """Maps inode numbers and paths to nodes. Not thread-safe: used from the trio loop only."""

    def __init__(self, root_entry: Entry, storage: Callable[[str], str] | None = None) -> None:
        """``storage(path)`` names the storage a path lives in (a governed volume): names of
        one origin file in two storages are two nodes (each checked against its own)."""
        self._by_ino: dict[int, Node] = {}
        self._storage = storage or _one_storage
        #: indexed by directory: a rename costs the nodes it moves, not the table's size
        self._by_path: PathDict[Node] = PathDict()
        #: (storage, origin file number) -> the node of a file with several names
        self._by_file: dict[tuple[str, int], Node] = {}
        self._next = itertools.count(ROOT_INO + 1)
        # origin entries of nodes the kernel forgot, so that a known name stays usable while
        # the origin is unreachable (bounded LRU; dropped on rename/removal)
        self._last: collections.OrderedDict[str, Entry] = collections.OrderedDict()
        self._last_index = PathIndex()  # the paths of ``_last``, by directory
        #: nodes made for names answered bare, oldest first (:meth:`named`)
        self._named: collections.OrderedDict[int, Node] = collections.OrderedDict()
        #: told of every node made, moved, detached or dropped (None: nobody listens)
        self.log: NodeLog | None = None
        root = Node(ROOT_INO, "", Kind.DIR, root_entry, time.monotonic(), lookups=1)
        self._add(root)

    def _add(self, node: Node) -> None:
        self._by_ino[node.ino] = node
        if node.path is not None:
            self._by_path[node.path] = node
        if self.log is not None:
            self.log.bound(node.ino, node.kind, node.path)

    def restore(
        self, ino: int, path: str | None, kind: Kind, entry: Entry | None, lookups: int
    ) -> Node:
        """Make node ``ino`` again as the kernel knows it (a daemon taking over the
        connection); later nodes are numbered above it. Not for a number in use."""
        if ino in self._by_ino:
            raise AssertionError(f"inode {ino} exists")
        node = Node(ino, path, kind, entry, time.monotonic(), lookups=lookups)
        if path is not None and path in self._by_path:
            node.path = None  # two saved nodes at one path: the later one keeps it
        self._add(node)
        top = next(self._next)
        self._next = itertools.count(max(top, ino + 1))
        return node

    def __len__(self) -> int:
        return len(self._by_ino)

    def get(self, ino: int) -> Node:
        """The node of ``ino``; ESTALE (an ``OSError``) if the kernel names one we dropped."""
        try:
            return self._by_ino[ino]
        except KeyError:
            raise OSError(errno.ESTALE, f"inode {ino} is not known") from None

    def find(self, ino: int) -> Node | None:
        """The node of ``ino``, None if there is none."""
        return self._by_ino.get(ino)

    def children(self, directory: str) -> list[Node]:
        """The nodes bound to names directly inside ``directory``."""
        by_path = self._by_path
        return [by_path[p] for p in by_path.children(directory)]

    def under(self, path: str) -> list[Node]:
        """The nodes bound to ``path`` and to names anywhere below it."""
        by_path = self._by_path
        return [by_path[p] for p in by_path.under(path)]

    def at(self, path: str) -> Node | None:
        """The node bound to ``path``, if any."""
        return self._by_path.get(path)

    def bind(self, path: str, kind: Kind, entry: Entry | None, at: float | None = None) -> Node:
        """The node for ``path``, created if needed, recording ``entry`` as the origin's
        state at monotonic time ``at`` (when the origin call that returned it started;
        default now). An entry older than what the node already knows is ignored, so a
        listing that raced a commit never rolls a node back to the previous version.

        If the path's node has a different kind (replaced at the origin by another program),
        the old node is detached and a new one made.
        """
        at = time.monotonic() if at is None else at
        node = self._by_path.get(path)
        if node is not None and node.kind is kind:
            if entry is not None and at >= node.fetched:
                node.entry = entry
                node.fetched = at
                self._note_links(node)
            return node
        if node is not None:
            self.unlink_name(path)
        if entry is not None and entry.nlink > 1 and entry.ino and kind is not Kind.DIR:
            same = self._by_file.get((self._storage(path), entry.ino))
            if same is not None and same.path is not None and same.kind is kind:
                self.alias(path, same)  # another name of a file we know
                if at >= same.fetched:
                    same.entry, same.fetched = entry, at
                return same
        node = Node(next(self._next), path, kind, entry, at)
        self._add(node)
        self._note_links(node)
        return node

    def _note_links(self, node: Node) -> None:
        e = node.entry
        if e is not None and e.nlink > 1 and e.ino and node.kind is not Kind.DIR and node.path:
            self._by_file[(self._storage(node.path), e.ino)] = node

    def alias(self, path: str, node: Node) -> None:
        """Bind ``path`` as another name of ``node`` (a hard link to it)."""
        if node.path is None or path == node.path:
            return
        other = self._by_path.get(path)
        if other is not None and other is not node:
            self.unlink_name(path)
        self._forget_known(path)
        node.aliases.add(path)
        self._by_path[path] = node

    def unlink_name(self, path: str) -> None:
        """``path`` is gone (unlinked, or replaced): a node with other names keeps them,
        else it is detached."""
        node = self._by_path.get(path)
        if node is None:
            return
        if not node.aliases:
            self.detach(node)
            return
        self._forget_known(path)
        del self._by_path[path]
        if path == node.path:
            node.path = min(node.aliases)
            node.aliases.discard(node.path)
            if self.log is not None:
                self.log.bound(node.ino, node.kind, node.path)
        else:
            node.aliases.discard(path)

    def split(self, node: Node) -> None:
        """``node``'s other names no longer are the same file (it was rewritten through its
        ``path``: a commit makes a new file): they resolve afresh from now on."""
        for p in list(node.aliases):
            if self._by_path.get(p) is node:
                del self._by_path[p]
        node.aliases.clear()
        if node.entry is not None and node.path is not None:
            key = (self._storage(node.path), node.entry.ino)
            if self._by_file.get(key) is node:
                del self._by_file[key]

    def detach(self, node: Node) -> None:
        """Unbind ``node`` from its path (removed or replaced); drop it if unreferenced."""
        if node.path is not None:
            self._forget_known(node.path)
            if self._by_path.get(node.path) is node:
                del self._by_path[node.path]
        self.split(node)
        node.path = None
        self._named.pop(node.ino, None)  # no name leads to it any more
        if self.log is not None:
            self.log.bound(node.ino, node.kind, None)
        self.maybe_drop(node)

    def move(self, old: str, new: str) -> None:
        """Rebind ``old`` (and every known path under it) to ``new``. Whatever was bound at
        ``new`` (or under it) is detached first."""
        self._forget_known(old)
        self._forget_known(new)
        if not old or not new:
            raise AssertionError("the root is never renamed")
        for path in self._by_path.under(new):
            self.unlink_name(path)
        moved = [(p, self._by_path[p]) for p in self._by_path.under(old)]
        for p, _ in moved:
            del self._by_path[p]
        for p, n in moved:
            moved_to = new + p[len(old) :]
            if n.path == p:
                n.path = moved_to
                if self.log is not None:
                    self.log.bound(n.ino, n.kind, moved_to)
            else:
                n.aliases.discard(p)
                n.aliases.add(moved_to)
            self._by_path[moved_to] = n

    def forget(self, ino: int, count: int) -> None:
        node = self._by_ino.get(ino)
        if node is None or ino == ROOT_INO:
            return
        node.lookups = max(0, node.lookups - count)
        self.maybe_drop(node)

    def named(self, path: str, kind: Kind) -> Node:
        """The node for ``path`` (made without an entry if needed), whose number a listing
        answers with its name alone: kept (not dropped for want of references) while it is
        one of the ``NAMED_MAX`` most recent such nodes."""
        node = self.bind(path, kind, None)
        named = self._named
        named[node.ino] = node
        named.move_to_end(node.ino)
        while len(named) > NAMED_MAX:
            _, old = named.popitem(last=False)
            self.maybe_drop(old)
        return node

    def maybe_drop(self, node: Node) -> None:
        """Forget ``node`` entirely once nothing references it."""
        if node.ino == ROOT_INO or node.lookups or node.opens or node.ino in self._named:
            return
        if self._by_ino.pop(node.ino, None) is not None and self.log is not None:
            self.log.dropped(node.ino)
        self.split(node)
        if node.path is not None and self._by_path.get(node.path) is node:
            del self._by_path[node.path]
            if node.entry is not None:
                self._last[node.path] = node.entry
                self._last.move_to_end(node.path)
                self._last_index.add(node.path)
                while len(self._last) > LAST_KNOWN_MAX:
                    self._last_index.discard(self._last.popitem(last=False)[0])

    def last_known(self, path: str) -> Entry | None:
        """The last origin entry seen for ``path`` by a node since dropped (None if none)."""
        return self._last.get(path)

    def _forget_known(self, path: str) -> None:
        """Drop the last known entries at and under ``path``."""
        for p in self._last_index.under(path) if path else [path]:
            self._last.pop(p, None)
            self._last_index.discard(p)

    def nodes(self) -> list[Node]:
        return list(self._by_ino.values())
