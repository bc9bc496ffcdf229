"""The daemon's enforcement of the catalog: a :class:`~airfs.core.context.Guard` for the
core (every filesystem operation) and the same decision for the control socket.

A caller's principals come from its credentials: the user name of its uid and the names of
its primary and supplementary groups (``group:NAME``), mapped by the catalog's aliases; a uid
or gid without a name is ``#UID`` / ``group:#GID``. The decision is
:func:`airfs.catalog.model.allowed` on the cached catalog (:class:`CatalogCache`, reloaded at
most once per TTL, so a grant or revoke made on any node is seen within the TTL, and by an
open file at its next open).

Every denial is counted (:meth:`CatalogGuard.statistics`) and logged with who, what, where
and the missing privilege; repeats of the same denial are logged at most once per
``log_every`` seconds (still counted).
"""

from __future__ import annotations

import collections
import dataclasses
import errno
import grp
import logging
import pwd
import time
from dataclasses import dataclass
from typing import Any

from airfs.core.context import Caller, groups_of

from .model import (
    OK,
    RESERVED,
    Decision,
    Metastore,
    Who,
    allowed,
    split_path,
    table_index,
    who,
)
from .store import CatalogCache, CatalogCacheStats
from .table import TableIndex

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class GuardStats:
    """``CatalogGuard.statistics()``: checks made, denials by errno name, by operation and by
    missing privilege, and the catalog cache's figures."""

    checks: int
    denied: int
    denied_by_errno: dict[str, int]
    denied_by_op: dict[str, int]
    denied_by_privilege: dict[str, int]
    catalog: CatalogCacheStats

    def to_dict(self) -> dict[str, Any]:
        """As ``airfs status --json`` shows it under ``catalog`` (the cache's figures nested)."""
        return dataclasses.asdict(self)


class _Names:
    """uid/gid → names, remembered for ``ttl`` seconds (users made after a lookup are seen
    once it expires; a uid never looked up is looked up at once)."""

    def __init__(self, ttl: float = 10.0) -> None:
        self.ttl = ttl
        self._users: dict[int, tuple[float, str]] = {}
        self._groups: dict[int, tuple[float, str]] = {}

    def _get(self, cache: dict[int, tuple[float, str]], key: int, user: bool) -> str:
        now = time.monotonic()
        hit = cache.get(key)
        if hit is not None and now - hit[0] < self.ttl:
            return hit[1]
        try:
            name = pwd.getpwuid(key).pw_name if user else grp.getgrgid(key).gr_name
        except KeyError:
            name = f"#{key}"
        cache[key] = (now, name)
        return name

    def user(self, uid: int) -> str:
        return self._get(self._users, uid, True)

    def group(self, gid: int) -> str:
        return self._get(self._groups, gid, False)


def immutable_volumes(meta: Metastore | None) -> frozenset[tuple[str, str, str]]:
    """The volumes of ``meta`` declared immutable, by name."""
    if meta is None:
        return frozenset()
    return frozenset(
        (c, s, v)
        for c, cat in meta.catalogs.items()
        for s, sch in cat.children.items()
        for v, vol in sch.children.items()
        if vol.immutable
    )


def denial_message(d: Decision, op: str, path: str) -> str:
    what = (d.missing and f"missing {d.missing}") or d.reason
    return f"/{path}: {op} not allowed ({what})"


class CatalogGuard:
    """Implements :class:`airfs.core.context.Guard` over ``cache``."""

    def __init__(self, cache: CatalogCache, *, log_every: float = 10.0) -> None:
        self.cache = cache
        self.names = _Names()
        self.log_every = log_every
        self._checks = 0
        self._by_errno: collections.Counter[str] = collections.Counter()
        self._by_op: collections.Counter[str] = collections.Counter()
        self._by_priv: collections.Counter[str] = collections.Counter()
        self._logged: dict[tuple[object, ...], float] = {}
        self._who: dict[tuple[object, ...], tuple[float, Who]] = {}
        self._decided: dict[tuple[object, ...], Decision] = {}
        self._decided_on: object = None
        self._index = TableIndex({})
        #: (catalog, schema, volume) of the volumes declared immutable
        self._immutable: frozenset[tuple[str, str, str]] = frozenset()

    def who(self, caller: Caller) -> Who:
        """The caller's principals (remembered for a second per process and catalog: the
        groups of a process are read from /proc)."""
        meta = self.cache.meta
        key = (caller.uid, caller.gid, caller.pid, caller.groups, id(meta))
        now = time.monotonic()
        hit = self._who.get(key)
        if hit is not None and now - hit[0] < 1.0:
            return hit[1]
        gids = {caller.gid, *caller.groups, *groups_of(caller.pid)}
        w = who(
            meta,
            self.names.user(caller.uid),
            [self.names.group(g) for g in gids],
            is_root=caller.uid == 0,
        )
        if len(self._who) > 4096:
            self._who.clear()
        self._who[key] = (now, w)
        return w

    def decide(self, caller: Caller, op: str, path: str) -> Decision:
        """The decision on the catalog as cached now (no reload)."""
        reserved = path == RESERVED or path.startswith(RESERVED + "/")
        if reserved:
            return Decision(errno.ENOENT, "", f"{RESERVED} is reserved for the catalog")
        if self.cache.damaged is not None and caller.uid != 0:
            return Decision(errno.EACCES, "", f"the catalog is damaged: {self.cache.damaged}")
        meta = self.cache.meta
        if meta is None:
            return OK  # no catalog: no governance (and no principals to look up)
        index = self.index()
        w = self.who(caller)
        parts = path.split("/", 3)
        # the answer depends only on the first three names, whether there is more, and the
        # table the path is at, under or above
        key = (w, op, tuple(parts[:3]), len(parts), index.match(path))
        d = self._decided.get(key)
        if d is None:
            d = allowed(meta, w, op, path, index)
            if len(self._decided) > 65536:
                self._decided.clear()
            self._decided[key] = d
        return d

    async def check(self, caller: Caller, op: str, path: str) -> None:
        """Return if ``caller`` may do ``op`` on ``path``; else count, log and raise
        ``OSError`` (ENOENT: not visible; EACCES: a privilege missing; EPERM: a catalog
        level). Reloads the catalog first when it is older than the TTL."""
        await self.cache.current()
        self._checks += 1
        d = self.decide(caller, op, path)
        if d.ok:
            return
        self.denied(caller, op, path, d)
        raise OSError(d.errno, denial_message(d, op, path))

    def index(self) -> TableIndex:
        """The tables of the catalog as cached now, by location (decisions made on an older
        catalog are forgotten when it changes)."""
        meta = self.cache.meta
        if meta is not self._decided_on:
            self._decided.clear()
            self._decided_on = meta
            self._index = table_index(meta) if meta is not None else TableIndex({})
            self._immutable = immutable_volumes(meta)
        return self._index

    def filters(self, dir_path: str) -> bool:
        """Listings at the three catalog levels depend on the caller's grants."""
        return (self.cache.meta is not None and dir_path.count("/") < 2) or (
            self.cache.damaged is not None
        )

    def governs(self) -> bool:
        return self.cache.meta is not None or self.cache.damaged is not None

    def immutable(self, path: str) -> bool:
        """``path`` is in a volume the cached catalog declares immutable (the volume root
        included; a catalog or schema never is)."""
        self.index()  # the set follows the catalog as cached now
        if not self._immutable:
            return False
        parts = path.split("/", 3)
        return len(parts) >= 3 and (parts[0], parts[1], parts[2]) in self._immutable

    def storage(self, path: str) -> str:
        """A volume is its own storage (Unity Catalog): the first three names of ``path``;
        so is a table (its location, for a path at or under it)."""
        if self.cache.meta is None:
            return ""
        match = self.index().match(path)
        if match is not None and match.location:
            return match.location
        return "/".join(path.split("/", 3)[:3])

    def visible(self, caller: Caller, dir_path: str, name: str) -> bool:
        if not dir_path and name == RESERVED:
            return False
        if self.cache.damaged is not None and caller.uid != 0:
            return False
        if self.cache.meta is None or dir_path.count("/") >= 2:
            return True  # ungoverned, or inside a volume (its listing was allowed)
        return self.decide(caller, "lookup", f"{dir_path}/{name}" if dir_path else name).ok

    def denied(self, caller: Caller, op: str, path: str, d: Decision) -> None:
        """Count and log a denial (made here or by the control socket)."""
        code = errno.errorcode.get(d.errno, str(d.errno))
        self._by_errno[code] += 1
        self._by_op[op] += 1
        if d.missing:
            self._by_priv[d.missing.split(" on ")[0]] += 1
        parts = split_path(path)
        if parts and parts[0] == RESERVED:
            return
        key = (caller.uid, op, code, d.missing or d.reason, parts[:3])
        now = time.monotonic()
        if now - self._logged.get(key, -1e18) < self.log_every:
            return
        if len(self._logged) > 10000:
            self._logged.clear()
        self._logged[key] = now
        level = logging.INFO if d.errno == errno.ENOENT else logging.WARNING
        log.log(
            level,
            "catalog: denied %s (uid %d, pid %d) %s /%s: %s (%s)",
            self.names.user(caller.uid),
            caller.uid,
            caller.pid,
            op,
            path,
            (d.missing and f"missing {d.missing}") or d.reason,
            code,
        )

    def statistics(self) -> GuardStats:
        return GuardStats(
            checks=self._checks,
            denied=sum(self._by_errno.values()),
            denied_by_errno=dict(self._by_errno),
            denied_by_op=dict(self._by_op),
            denied_by_privilege=dict(self._by_priv),
            catalog=self.cache.statistics(),
        )
