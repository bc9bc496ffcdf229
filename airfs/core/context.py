"""Who asked: the caller of a filesystem request, and the hook that governs access.

Every core operation that a process triggers runs with a :class:`Caller` (the FUSE request's
uid, gid and pid; ``SO_PEERCRED`` on the control socket), set by the adapter in a context
variable before it calls the core (:func:`as_caller`; each request is its own trio task or runs
to its end before the next starts, so the value never leaks from one request into another).
Internal work (commits, recovery, warm-ups the daemon starts) runs as :data:`DAEMON`. The
kernel still checks the mode
bits (``default_permissions``); the core uses the caller for what the kernel cannot know:
the owner of new files, the ``chown`` rules, and the :class:`Guard` of governed volumes.
"""

from __future__ import annotations

import contextvars
import os
from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True, slots=True)
class Caller:
    """The process a request comes from. ``groups`` are its supplementary groups (read
    from ``/proc/<pid>/status`` on demand by :func:`groups_of`; empty when unknown)."""

    uid: int
    gid: int
    pid: int = 0
    groups: frozenset[int] = field(default_factory=frozenset)

    @property
    def is_root(self) -> bool:
        return self.uid == 0

    def in_group(self, gid: int) -> bool:
        """The caller's primary or a supplementary group is ``gid``."""
        return gid == self.gid or gid in self.groups or gid in groups_of(self.pid)


#: internal work (commits, recovery, warm-up started by the daemon itself)
DAEMON = Caller(os.getuid(), os.getgid())


_CALLER: contextvars.ContextVar[Caller] = contextvars.ContextVar("airfs_caller", default=DAEMON)


def current_caller() -> Caller:
    """The caller of the request being served (:data:`DAEMON` outside any request)."""
    return _CALLER.get()


def as_caller(caller: Caller) -> None:
    """Serve the rest of this request (this task, from here on) as ``caller``."""
    _CALLER.set(caller)


def groups_of(pid: int) -> frozenset[int]:
    """Supplementary groups of process ``pid`` (empty if it is gone or unknown)."""
    if pid <= 0:
        return frozenset()
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"Groups:"):
                    return frozenset(int(g) for g in line.split()[1:])
    except OSError:
        pass
    return frozenset()


class Guard(Protocol):
    """Access policy above the mode bits (governed volumes). The core calls :meth:`check`
    before an operation touches ``path`` and :meth:`visible` for each listed name.

    ``op`` names the core operation: ``lookup``, ``getattr``, ``readdir``, ``open_read``,
    ``open_write``, ``create``, ``write`` (truncate/setattr), ``mkdir``, ``rmdir``,
    ``unlink``, ``rename_from``, ``rename_to``, ``symlink``, ``link`` (the new name),
    ``link_from`` (the file linked), ``mknod``, ``readlink``.
    """

    async def check(self, caller: Caller, op: str, path: str) -> None:
        """Return if allowed; raise ``OSError`` (EACCES, ENOENT or EPERM) if not."""
        ...

    def visible(self, caller: Caller, dir_path: str, name: str) -> bool:
        """Whether ``name`` in directory ``dir_path`` is listed to ``caller``."""
        ...

    def filters(self, dir_path: str) -> bool:
        """Whether listings of ``dir_path`` depend on the caller (then no cache shares them)."""
        ...

    def governs(self) -> bool:
        """Whether answers depend on the caller now (a catalog governs the mount): then the
        kernel keeps no entry and no "no such name" for another caller."""
        ...

    def immutable(self, path: str) -> bool:
        """Whether ``path`` lies in a volume declared immutable (its files never change at
        the origin): the core then trusts what it knows of names and versions there until
        ``airfs refresh`` (as the whole mount does with ``--immutable``). Cheap: called per
        request."""
        ...

    def storage(self, path: str) -> str:
        """The storage ``path`` lives in (its volume, ``"cat/schema/volume"``; ``""`` where
        no catalog governs). A hard link or rename between two storages is EXDEV, and the
        names of one file in two storages are two files to the kernel."""
        ...
