"""The daemon's catalog: its store, TTL cache and guard, and what the control socket asks of
them: catalog commands run with the caller's identity, and the grant checks of ``warm``,
``prefetch`` (READ VOLUME) and ``flush`` (WRITE VOLUME).

On a governed mount a non-admin names a volume or a path inside one for ``warm``,
``prefetch`` and ``flush`` (a walk from a higher level would cross volumes it may not read);
admins may name any path.
"""

from __future__ import annotations

import errno
import logging
from typing import Any

import trio

from airfs.core.context import Caller
from airfs.origin.aio import AsyncOrigin
from airfs.origin.base import Origin

from .commands import READ_ONLY
from .guard import CatalogGuard
from .model import CatalogError, Decision, allowed, is_admin, split_path
from .store import CatalogCache, CatalogStore
from .table import ABOVE

log = logging.getLogger(__name__)

#: control operations → the access they need on their paths
CONTROL_ACCESS = {"warm": "read", "prefetch": "read", "flush": "write"}


#: the one answer for a name the caller may not see and for a name that does not exist
NOT_VISIBLE = "no such catalog, schema or volume (or none you may see)"


class CatalogService:
    """One mount's catalog (``origin`` is the mount's origin)."""

    def __init__(
        self,
        origin: Origin,
        ttl: float,
        *,
        via: AsyncOrigin | None = None,
        tmp_dir: str | None = None,
    ) -> None:
        self.store = CatalogStore(origin, tmp_dir=tmp_dir)
        self.cache = CatalogCache(self.store, ttl, via=via)
        self.guard = CatalogGuard(self.cache)

    async def command(self, caller: Caller, command: str, args: dict[str, Any]) -> Any:
        """Run catalog command ``command`` as ``caller``; raises ``OSError`` with the errno
        and the one-line reason of a refusal."""
        if not isinstance(args, dict):
            raise OSError(errno.EINVAL, "catalog arguments must be an object")
        await self.cache.current()
        if command == "why":
            return self.why(caller, str(args.get("path", "")), str(args.get("access", "read")))
        w = self.guard.who(caller)
        try:
            return await trio.to_thread.run_sync(self.store.run, w, command, args)
        except CatalogError as exc:
            if exc.errno in (errno.EACCES, errno.EPERM):
                refused = Decision(exc.errno, "", str(exc))
                self.guard.denied(caller, f"catalog {command}", "", refused)
            raise OSError(exc.errno, str(exc)) from None
        finally:
            if command not in READ_ONLY:
                self.cache.invalidate()

    def _decide(self, caller: Caller, access: str, path: str) -> tuple[Decision, str]:
        meta = self.cache.meta
        parts = split_path(path)
        volume = ".".join(parts[:3])
        if self.cache.damaged is not None:
            return self.guard.decide(caller, "open_read", path), volume
        w = self.guard.who(caller)
        if meta is None or is_admin(meta, w):
            return allowed(meta, w, "open_read", path), volume
        index = self.guard.index()
        match = index.match(path)
        in_table = match is not None and match.relation != ABOVE
        if len(parts) < 3 and not in_table:
            return Decision(
                errno.EACCES,
                "",
                "on a governed mount name a volume, a table's path or a path inside one",
            ), volume
        if access != "write":
            return allowed(meta, w, "open_read", path, index), volume
        # what creating a file in it needs (READ + WRITE VOLUME, or MODIFY in a table)
        d = allowed(meta, w, "create", f"{path}/x", index)
        return (d if d.ok else Decision(d.errno, d.missing, "flush denied")), volume

    async def check_control(self, caller: Caller, op: str, path: str) -> None:
        """Raise ``PermissionError``/``FileNotFoundError`` unless ``caller`` may ``op``
        (``warm``, ``prefetch``, ``flush``) on ``path``; denials are counted and logged."""
        await self.cache.current()
        d, _volume = self._decide(caller, CONTROL_ACCESS.get(op, "write"), path)
        if d.ok:
            return
        self.guard.denied(caller, op, path, d)
        if d.errno == errno.ENOENT:  # hidden or missing: one answer (the log says which)
            raise OSError(d.errno, f"{op} /{path}: {NOT_VISIBLE}")
        what = f"missing {d.missing}" if d.missing else d.reason
        raise OSError(d.errno, f"{op} /{path}: not allowed ({what})")

    def why(self, caller: Caller, path: str, access: str) -> dict[str, Any]:
        """What ``caller`` lacks for ``access`` on ``path`` by the mount's own rules:
        ``"read"`` (open or list it) or ``"write"`` (create or change something in it).
        ``missing`` None: nothing the catalog decides (the mode bits may still refuse). For
        clear errors in the torch package."""
        parts = split_path(path)
        if access == "write":
            d = self.guard.decide(caller, "create", f"{path}/x" if path else "x")
        else:
            d = self.guard.decide(caller, "open_read", path)
        missing = d.missing or (d.reason if not d.ok else None)
        if d.errno == errno.ENOENT:
            missing = NOT_VISIBLE  # a hidden name and a missing one answer alike
        return {
            "governed": self.cache.meta is not None,
            "volume": ".".join(parts[:3]) if len(parts) >= 3 else None,
            "missing": missing,
            "errno": d.errno,
        }

    def statistics(self) -> dict[str, Any]:
        from dataclasses import asdict

        return asdict(self.guard.statistics())
