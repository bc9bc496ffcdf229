"""Open handles on staged versions: the one owner of which version a handle uses.

The filesystem core opens a staged file through :class:`Opens` and gets an :class:`Opened`
token, the handle's hold on it; every later question ("which version does this handle read
or write now?", "is the file closed now?") is answered here, from the token. Nothing else
changes a version's ``writers`` or the references its handles hold (``refs``; the staging
area takes short references of its own around work in worker threads).

* A **reader** token holds the version it opened, for its whole life (an unlinked or replaced
  file keeps its bytes for its open handles).
* A **writer** token follows its version's forks: a closed (journaled) version is never written
  again, so a write through a handle whose version was closed (``close()`` of another
  descriptor, ``fsync``, a shared mapping written back after the ``close()``) moves *all* the
  version's writers to one copy (:meth:`Opens.writable`; concurrent forks make one copy). The
  token is brought up to date when resolved (``forked_to``), so a fork patches no handle.
* Closing: :meth:`Opens.flush` (``close()`` of a descriptor) and :meth:`Opens.close` (the
  release of the handle) apply :func:`~airfs.writeback.versions.close_due`, the one rule: the
  version is journaled when no *other* writer has it open; barriers ask the area directly
  (:meth:`~airfs.writeback.staging.StagingArea.close` with ``barrier=True``).

Tokens are also indexed by a *file key* (the core's inode number), so that the core can ask
for the staged content of a file that no path leads to any more (:meth:`Opens.of_file`).
Trio loop only.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import trio

from .staging import StagingArea
from .versions import Staged

__all__ = ["Opened", "Opens"]


@dataclass(eq=False)
class Opened:
    """One open handle's hold on a staged file. Made and resolved by :class:`Opens` only: read
    the version through :meth:`Opens.version` (``at`` may lag behind a fork)."""

    at: Staged
    writable: bool
    #: the file it belongs to (the core's inode number; None: not indexed)
    key: int | None
    closed: bool = False


class Opens:
    """Handles on staged versions (see the module docstring)."""

    def __init__(self, area: StagingArea) -> None:
        self.area = area
        self._by_key: dict[int, list[Opened]] = {}

    async def open(
        self, live: Staged, key: int | None, *, writable: bool, truncate: bool = False
    ) -> Opened:
        """Open live version ``live`` (for writing when ``writable``; emptied with
        ``truncate``). A closed version (journaled, not written since) or one being
        uploaded is never written again: a writer then gets a new version, a copy of it
        (empty with ``truncate``). A writer joining one still open for writing shares it."""
        st = live
        if writable:
            if st.writers == 0 and (st.closed_version or st.uploading):
                st = await self.area.new_version(st, copy=not truncate)
            elif truncate and st.size:
                await self.area.io.truncate(st, 0)
            st.writers += 1
        st.refs += 1
        tok = Opened(st, writable, key)
        if key is not None:
            self._by_key.setdefault(key, []).append(tok)
        return tok

    def version(self, tok: Opened) -> Staged:
        """The version ``tok`` reads or writes now (a writer's follows the forks)."""
        st = tok.at
        if tok.writable:
            nxt = st.forked_to
            while nxt is not None:
                st, nxt = nxt, nxt.forked_to
            tok.at = st
        return st

    def staged(self, tok: Opened | None) -> Staged | None:
        """:meth:`version`, or None for a handle without staged content."""
        return None if tok is None else self.version(tok)

    def of_file(self, key: int) -> Staged | None:
        """The staged version of the newest open token of file ``key`` (what its open
        handles see), or None when it has none."""
        toks = self._by_key.get(key)
        return self.version(toks[-1]) if toks else None

    async def writable(self, tok: Opened, *, in_place: Callable[[Staged], bool]) -> Staged:
        """The version a write through writer ``tok`` goes to: its own, or, when that one is
        closed (journaled) or being uploaded, a copy all its writers move to. ``in_place(st)``
        True: ``st`` must be written where it is (the kernel writes its file directly:
        passthrough), so it is not forked. A version whose file was deleted is written in
        place (nothing will commit it)."""
        if not tok.writable:
            raise AssertionError("a reader token is never written through")
        st = self.version(tok)
        while (st.closed_version or st.uploading) and not in_place(st):
            new = await self._fork(st)
            if new is st:
                break
            st = self.version(tok)
        return st

    async def _fork(self, st: Staged) -> Staged:
        """Move the writers of closed version ``st`` to a copy; returns it (``st`` itself
        when its file was deleted while open: nothing will commit it).

        Concurrent forks of one version (the kernel writes a mapping's dirty pages back in
        parallel WRITEs) make one copy: the later callers wait for it and get the same new
        version (it may itself be closed again by then: callers loop until the version they
        get is writable). A fork that failed (ENOSPC) is tried again by the next caller."""
        while st.forking is not None:
            await st.forking.wait()
        if st.forked_to is not None:
            return st.forked_to
        if st.ps is None or st.ps.live is not st:
            return st
        ev = st.forking = trio.Event()
        try:
            new = await self.area.new_version(st, copy=True)
        finally:
            st.forking = None
            ev.set()
        # every writer token of ``st`` follows ``forked_to``: its count and its references
        # move with it (readers keep theirs)
        moved = st.writers
        new.writers, st.writers = moved, 0
        new.refs += moved
        st.refs -= moved
        st.forked_to = new
        self.area.release(st)
        return new

    async def flush(self, tok: Opened) -> Staged:
        """``close()`` of a descriptor of ``tok``'s handle: once the writes in flight end,
        its version is journaled if no other writer has it open. Returns the version."""
        st = self.version(tok)
        await self.area.io.quiesce(st)
        st = self.version(tok)
        self.area.close_version(st, other_writers=st.writers - tok.writable)
        return st

    async def close(self, tok: Opened) -> None:
        """Release ``tok``'s handle: as :meth:`flush`, then the writer count and the
        reference go (the version is dropped once clean and unreferenced). The token is
        released even when the wait for the writes in flight is cancelled (the close then
        happens when they end)."""
        try:
            await self.area.io.quiesce(self.version(tok))
        finally:
            self.close_now(tok)

    def close_now(self, tok: Opened) -> None:
        """:meth:`close` without waiting for the writes in flight (a close decided while
        they run is made when they end)."""
        if tok.closed:
            raise AssertionError("a staged open is closed twice")
        st = self.version(tok)
        tok.closed = True
        if tok.key is not None:
            toks = self._by_key[tok.key]
            toks.remove(tok)
            if not toks:
                del self._by_key[tok.key]
        try:
            self.area.close_version(st, other_writers=st.writers - tok.writable)
            if tok.writable:
                if st.writers <= 0:
                    raise AssertionError(f"staged {st.id}: writer count would go negative")
                st.writers -= 1
                if st.writers == 0 and st.closed_version and st.path is not None:
                    assert st.ps is not None
                    # the commit delay counts from here: the kernel's release of the file
                    # comes after the flush that journaled it, at the end of the close()
                    # (which can take a while: ext4 starts writing a truncated file back)
                    st.closed_at = time.monotonic()
                    self.area.on_ready(st.ps)  # a closed version waits for its last writer
        finally:
            st.refs -= 1
            self.area.release(st)
            self.area.notify()
