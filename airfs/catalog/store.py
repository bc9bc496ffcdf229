"""Where the catalog lives: one JSON document at the origin, :data:`CATALOG_PATH`, shared by
every node that mounts the origin; and the daemon's cached view of it.

Updates are conditional writes: the document is read with its version tag, the command is
applied, and the result is put with ``if_match`` = that tag (``""``: must not exist yet). When
another admin changed it meanwhile the put raises ``Conflict``; the change is re-read and
re-applied, up to ``attempts`` times (with a short random pause), then refused with
:class:`CatalogBusy`. So two admins never lose each other's change. On S3 servers without
conditional writes the origin checks the tag with a HEAD just before the upload (its
documented race); :attr:`CatalogStore.conditional` tells which.

:class:`CatalogStore` is synchronous (call it from a worker thread); :class:`CatalogCache`
is its trio face for the daemon, reloading at most once per TTL (through the mount's
:class:`~airfs.origin.aio.AsyncOrigin` when given: its retries and statistics).
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import random
import tempfile
import time
from dataclasses import dataclass
from typing import Any

import trio

from airfs.origin.aio import AsyncOrigin
from airfs.origin.base import Conflict, Exists, NotFound, Origin, OriginError

from .commands import DROPPED_DIR, READ_ONLY, apply
from .model import RESERVED, CatalogError, Metastore, Who

log = logging.getLogger(__name__)

CATALOG_PATH = f"{RESERVED}/catalog.json"


class CatalogBusy(CatalogError):
    """The catalog kept changing under a command (too many concurrent admins)."""


class CatalogDamaged(CatalogError):
    """The stored document cannot be read as a catalog."""


def _parse(raw: bytes, where: str) -> Metastore:
    try:
        return Metastore.from_json(json.loads(raw))
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CatalogDamaged(f"{where}: damaged catalog: {exc}", errno.EIO) from None


class CatalogStore:
    """The catalog document of ``origin`` (a synchronous origin; blocking calls)."""

    def __init__(self, origin: Origin, *, attempts: int = 20, tmp_dir: str | None = None) -> None:
        self.origin = origin
        self.attempts = attempts
        self.tmp_dir = tmp_dir
        self.conflicts = 0
        self.where = f"{origin.url.rstrip('/')}/{CATALOG_PATH}"

    @property
    def conditional(self) -> bool:
        """Whether the origin checks ``if_match`` atomically (an S3 origin probes its
        server once: see its ``capabilities``)."""
        return self.origin.capabilities.conditional_put

    def load(self) -> tuple[Metastore | None, str]:
        """The document and its version tag; ``(None, "")`` when the origin has none.
        Raises :class:`CatalogDamaged` and the origin's errors."""
        for _ in range(3):
            try:
                entry = self.origin.stat(CATALOG_PATH)
                raw = self.origin.read_range(CATALOG_PATH, 0, entry.size + 1, entry.version)
            except NotFound:
                return None, ""
            except Conflict:
                continue  # replaced between the stat and the read: read the new one
            return _parse(raw, self.where), entry.version
        raise CatalogBusy(f"{self.where} keeps changing while it is read; try again")

    def _put(self, meta: Metastore, if_match: str) -> None:
        with contextlib.suppress(Exists):
            self.origin.mkdir(RESERVED, 0o700)
        fd, tmp = tempfile.mkstemp(prefix="airfs-catalog-", dir=self.tmp_dir)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(meta.to_json(), f, indent=1, sort_keys=True)
                f.write("\n")
            self.origin.put(CATALOG_PATH, tmp, if_match, mode=0o600)
        finally:
            os.unlink(tmp)

    def _make_dir(self, command: str, out: dict[str, Any]) -> None:
        """Give a new managed object its directory at the origin: catalogs and schemas
        0755 (nobody writes there), volumes 0777 (the grants decide who writes; the files'
        own modes still apply)."""
        path = str(out["created"]).replace(".", "/")
        if command == "create-table":
            # a managed table's directory, or an external one's where it is missing (and
            # the directories on the way: those that exist already stay as they are)
            parts = str(out["location"]).split("/")
            paths = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
        elif command == "create-volume" and out.get("location") != path:
            return  # external: nothing to make here
        else:
            paths = [path]
        mode = 0o755 if command in ("create-catalog", "create-schema") else 0o777
        for p in paths:
            try:
                self.origin.mkdir(p, mode)
            except Exists:
                pass
            except OriginError as exc:
                log.warning("catalog: could not make %s at the origin: %s", p, exc)
                return

    def run(self, w: Who, command: str, args: dict[str, Any]) -> Any:
        """Apply catalog command ``command`` for ``w`` (see :mod:`airfs.catalog.commands`);
        return its result. Raises :class:`CatalogError` (refusals, :class:`CatalogBusy`)
        and the origin's errors.

        ``rename-*`` is checked first, then the directory is moved at the origin (refused if
        the new name exists there), then the catalog is changed; if that fails the directory
        is moved back. Between the two steps (one origin call) both names are unregistered:
        hidden from all but admins.

        ``drop-volume`` of a managed volume (``drop-table`` of a managed table) is done the
        same way: its directory moves to
        :func:`~airfs.catalog.commands.dropped_path` (inside the reserved directory, which
        no mount shows) before the volume leaves the catalog, so that nobody who creates the
        name again finds its files. A volume without a directory at the origin moves
        nothing."""
        if command.startswith("rename-") or command in ("drop-volume", "drop-table"):
            return self._rename(w, command, args)
        return self._run(w, command, args)

    def _rename(self, w: Who, command: str, args: dict[str, Any]) -> Any:
        meta, _ = self.load()
        _new, out = apply(meta, w, command, args)  # the checks, on the catalog as it is now
        moves = out.get("moves")
        dropping = command in ("drop-volume", "drop-table")
        if moves and dropping:
            with contextlib.suppress(Exists):
                self.origin.mkdir(RESERVED, 0o700)
            with contextlib.suppress(Exists):
                self.origin.mkdir(DROPPED_DIR, 0o700)
        if moves:
            try:
                self.origin.rename(moves[0], moves[1], replace=False)
            except NotFound:
                if not dropping:
                    raise
                moves = None  # no files: nothing to move aside
        try:
            result = self._run(w, command, args)
            if dropping:
                result = {"dropped": result["dropped"], "files_moved_to": moves and moves[1]}
            return result
        except BaseException:
            if moves:
                try:
                    self.origin.rename(moves[1], moves[0], replace=False)
                except OriginError as exc:
                    log.error("catalog %s failed and %s could not be moved back to %s: %s",
                              command, moves[1], moves[0], exc)  # fmt: skip
            raise

    def _run(self, w: Who, command: str, args: dict[str, Any]) -> Any:
        for attempt in range(1, self.attempts + 1):
            meta, version = self.load()
            new, out = apply(meta, w, command, args)
            if new is None or command in READ_ONLY:
                return out
            try:
                self._put(new, version)
            except Conflict:
                self.conflicts += 1
                log.info(
                    "catalog %s: changed meanwhile (attempt %d); re-applying", command, attempt
                )
                time.sleep(random.uniform(0, 0.02 * attempt))
                continue
            log.info("catalog %s by %s: %s", command, w.name, json.dumps(out))
            if command.startswith("create-"):
                self._make_dir(command, out)
            return out
        raise CatalogBusy(
            f"{command}: the catalog changed {self.attempts} times while applying it "
            "(other admins are busy); try again",
            errno.EAGAIN,
        )


@dataclass(frozen=True, slots=True)
class CacheStats:
    """``CatalogCache.statistics()``."""

    governed: bool
    serial: int | None
    loads: int
    load_errors: int
    #: seconds since the last reload (None: never loaded)
    age_s: float | None


class CatalogCache:
    """The daemon's view of the catalog: :meth:`current` reloads it when older than ``ttl``
    (one load at a time; others wait for it). When a reload fails (origin down) the last
    document read keeps being used and the failure is logged; a damaged document denies
    everything but admins (:attr:`damaged`)."""

    def __init__(self, store: CatalogStore, ttl: float, *, via: AsyncOrigin | None = None) -> None:
        self.store = store
        self.via = via
        self.ttl = ttl
        self.meta: Metastore | None = None
        self.damaged: str | None = None
        self._loaded_at = -1e18
        self._read_at = -1.0
        self._failing = False
        self._lock = trio.Lock()
        self._loads = 0
        self._errors = 0

    @property
    def stale(self) -> bool:
        return time.monotonic() - self._loaded_at >= self.ttl

    async def current(self) -> Metastore | None:
        if self.stale:
            async with self._lock:
                if self.stale:
                    await self.reload()
        return self.meta

    async def reload(self) -> None:
        try:
            if self.via is not None:  # the mount's retry policy and origin statistics
                # once one was read, a reload is a revalidation: while the origin is down it
                # fails at once (the last one read stays in force) instead of retrying
                loaded = await self.via.call(
                    self.store.load, what="catalog load", op="catalog", fast=self._read_at >= 0
                )
            else:
                loaded = await trio.to_thread.run_sync(self.store.load, abandon_on_cancel=True)
            meta, _version = loaded
        except CatalogDamaged as exc:
            if self.damaged != str(exc):
                log.error("%s; only admins get through until it is repaired", exc)
            self.damaged = str(exc)
            self._errors += 1
        except (OriginError, CatalogError) as exc:
            self._errors += 1
            if not self._failing:  # once per outage, not once per TTL
                log.warning("catalog reload failed (%s); using the last one read", exc)
            self._failing = True
        else:
            if self._failing:
                log.info("catalog reloads again")
            self._failing = False
            self.damaged = None
            if (meta is None) != (self.meta is None):
                log.info("catalog %s", "found: governance on" if meta else "gone: governance off")
            self.meta = meta
        self._loads += 1
        self._loaded_at = self._read_at = time.monotonic()

    def invalidate(self) -> None:
        """Reload at the next :meth:`current` (after a change made through this daemon)."""
        self._loaded_at = -1e18

    def statistics(self) -> CacheStats:
        return CacheStats(
            governed=self.meta is not None or self.damaged is not None,
            serial=self.meta.serial if self.meta is not None else None,
            loads=self._loads,
            load_errors=self._errors,
            age_s=round(time.monotonic() - self._read_at, 3) if self._read_at >= 0 else None,
        )
