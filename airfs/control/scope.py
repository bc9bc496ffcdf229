"""The origin as one control caller may walk it (``airfs warm DIR`` of a non-root user).

The request's own paths are checked by :func:`airfs.control.auth.check_path`; a recursive
warm then only descends into directories the caller may list and search, and only fetches
files it may read, exactly as ``cp -r`` run by that user through the mount would. What it may
not see is skipped silently (counted in ``skipped``), so that the reply reveals nothing about
it. The core still receives every full listing (its lookups must not believe in holes).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any, cast

from airfs.core.attrs import Owner
from airfs.origin.aio import AsyncOrigin
from airfs.origin.base import Capabilities, Entry, Kind, join

from .auth import Peer, R, X, may

#: the mode the mount shows for ``(path, origin entry)`` (a staged chmod wins)
ModeOf = Callable[[str, Entry], int]
OnListing = Callable[[str, list[Entry], float], Any]


class ScopedOrigin:
    """``list`` filtered to what ``caller`` may reach; every other attribute is ``origin``'s
    (a view, not a second origin: same threads, limits and retries)."""

    def __init__(
        self,
        origin: AsyncOrigin,
        caller: Peer,
        owner: Owner,
        mode_of: ModeOf,
        on_listing: OnListing | None = None,
    ) -> None:
        self.origin = origin
        self.caller = caller
        self.owner = owner
        self.mode_of = mode_of
        self.on_listing = on_listing
        self.skipped = 0

    def visible(self, path: str, entry: Entry) -> bool:
        """Whether the caller may read this file, or list and search this directory."""
        if entry.kind is Kind.FILE:
            want, is_dir = R, False
        elif entry.kind is Kind.DIR:
            want, is_dir = R | X, True
        else:
            return False  # symbolic links are never followed by warm
        mode = self.mode_of(path, entry)
        uid = self.owner.uid if entry.uid is None else entry.uid
        gid = self.owner.gid if entry.gid is None else entry.gid
        return may(self.caller, mode, uid, gid, want, is_dir)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.origin, name)

    def as_origin(self) -> AsyncOrigin:
        """This view, typed as what it stands for."""
        return cast(AsyncOrigin, self)

    @property
    def capabilities(self) -> Capabilities:
        """The origin's, less ``bare_lists``: the filter needs every entry's mode."""
        return dataclasses.replace(self.origin.capabilities, bare_lists=False)

    async def list(
        self, path: str, *, attrs: bool = True, heads_max: int | None = None
    ) -> list[Entry]:
        """The entries ``caller`` may reach, always with their attributes (``attrs`` and
        ``heads_max`` are ignored: the filter needs the modes)."""
        t0 = time.monotonic()
        entries = await self.origin.list(path)
        if self.on_listing is not None:
            self.on_listing(path, entries, t0)
        out = [e for e in entries if self.visible(join(path, e.name), e)]
        self.skipped += len(entries) - len(out)
        return out
