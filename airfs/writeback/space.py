"""The staging area's floor of free disk space: staged files never fill the cache filesystem
to 0 bytes free (the journal, the block cache's index and every other writer on that disk need
room too; a full disk is also when the journal would fail to record a close).

:class:`DiskFloor` answers "may the staged files grow by N bytes?" against ``min_free``. It
measures the filesystem with ``statvfs`` at most every ``interval`` seconds or every
``every_bytes`` bytes the staged files grew or shrank, and estimates in between from that
growth (one system call per measurement, made on the loop: it never waits for the disk). A
writer that does not fit waits for commits to free space and then gets ENOSPC before anything
is written (:meth:`~airfs.writeback.stagedio.StagedBytes.reserve`): bytes a write already
accepted are never dropped.

Default floor (:func:`default_min_free`): :data:`MIN_FREE_FRACTION` of the filesystem's size,
at most :data:`MIN_FREE_MAX`. ``airfs mount --staging-min-free SIZE`` sets it; 0 turns it off.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

__all__ = ["MIN_FREE_FRACTION", "MIN_FREE_MAX", "DiskFloor", "StatVfs", "default_min_free"]

#: the default floor: this share of the cache filesystem's size...
MIN_FREE_FRACTION = 0.03
#: ...but never more than this
MIN_FREE_MAX = 512 << 20

#: how the floor measures the filesystem (``os.statvfs``; tests give a fake one)
StatVfs = Callable[[str], os.statvfs_result]


def default_min_free(path: str, statvfs: StatVfs = os.statvfs) -> int:
    """The default floor for staging files under ``path``: :data:`MIN_FREE_FRACTION` of its
    filesystem's size, at most :data:`MIN_FREE_MAX` bytes."""
    sv = statvfs(path)
    return min(MIN_FREE_MAX, int(sv.f_blocks * sv.f_frsize * MIN_FREE_FRACTION))


class DiskFloor:
    """Free space under ``path`` kept at or above ``min_free`` bytes (0: no floor). Trio loop
    only (not thread-safe)."""

    def __init__(
        self,
        path: str,
        min_free: int,
        *,
        interval: float = 0.1,
        every_bytes: int = 64 << 20,
        statvfs: StatVfs = os.statvfs,
    ) -> None:
        if min_free < 0:
            raise ValueError(f"min_free must be >= 0, got {min_free}")
        self.path = path
        self.min_free = min_free
        self.interval = interval
        self.every_bytes = every_bytes
        self._statvfs = statvfs
        self._at = -1e18
        self._free = 0
        self._used_at = 0
        #: measurements made so far (``statvfs`` calls)
        self.measurements = 0

    def free(self, used: int) -> int:
        """The free bytes of the filesystem, estimated from the last measurement and the
        staged files' size ``used`` now (measured again when stale); an unreadable
        filesystem counts as having room (the write then gets the disk's own error)."""
        now = time.monotonic()
        if now - self._at >= self.interval or abs(used - self._used_at) >= self.every_bytes:
            try:
                sv = self._statvfs(self.path)
            except OSError:
                return self.min_free + (1 << 62)
            self._free = sv.f_bavail * sv.f_frsize
            self._at, self._used_at = now, used
            self.measurements += 1
        return self._free - (used - self._used_at)

    def fits(self, grow: int, used: int) -> bool:
        """Whether the staged files (``used`` bytes now) may grow by ``grow`` bytes."""
        return self.min_free == 0 or self.free(used) - grow >= self.min_free

    def invalidate(self) -> None:
        """Measure again at the next question (space was freed outside the estimate)."""
        self._at = -1e18
