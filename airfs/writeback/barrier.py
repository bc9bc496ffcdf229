"""Barriers: waiting until given staged versions are committed at the origin (``fsync``,
``airfs flush``, unmount), and the one-line message naming what could not be."""

from __future__ import annotations

import errno
import time
from collections.abc import Callable
from typing import Protocol

import trio

from .versions import PathState, Staged

__all__ = ["Committing", "failure_message", "wait_committed"]


class Committing(Protocol):
    """What a barrier needs of the staging area
    (:class:`~airfs.writeback.staging.StagingArea`)."""

    #: conflicts not yet reported to a barrier (path, kept copy)
    unreported: list[tuple[str, str]]

    def on_ready(self, ps: PathState) -> None:
        """Tell the uploader a commit of ``ps`` may be possible now."""
        ...

    def change_event(self) -> trio.Event:
        """An event set at the area's next change."""
        ...


async def wait_committed(
    area: Committing,
    targets: list[tuple[Staged, int]],
    on_progress: Callable[[dict[str, object]], None] | None = None,
) -> int:
    """Ask for each ``(staged, generation)`` to be committed and wait for all of them (a
    version replaced by a newer one is followed to it). Raises ``OSError`` (EIO) naming
    the files that cannot be committed (a non-transient failure) or that lost a
    conflict, with where their bytes are kept; waits through transient failures (cancel
    the caller to give up). Returns the count."""
    start = {st.id: st.attempts for st, _ in targets}
    for st, _gen in targets:
        if st.error is not None:
            st.next_try = 0.0  # a barrier makes a fresh attempt at once
        st.urgent = True
        if st.ps is not None:
            area.on_ready(st.ps)
    last = 0.0
    while True:
        ev = area.change_event()
        now_targets = []
        for st, g in targets:
            while (nxt := st.replaced_by) is not None:
                st, g = nxt, nxt.journaled_gen or nxt.gen
                if not st.urgent:
                    st.urgent = True  # (past the commit delay: the uploader looks again)
                    if st.ps is not None:
                        area.on_ready(st.ps)
                start.setdefault(st.id, st.attempts)
            now_targets.append((st, g))
        lost = [st for st, _ in now_targets if st.conflict is not None]
        left = [
            (st, g)
            for st, g in now_targets
            if st.path is not None and st.committed_gen < g and st.conflict is None
        ]
        hard = [st for st, _ in left if st.failed_since(start[st.id])]
        if hard or (lost and not left):
            for st in lost:
                if st.conflict in area.unreported:
                    area.unreported.remove(st.conflict)
            raise OSError(errno.EIO, _failure(hard, lost))
        if not left:
            return len(targets)
        now = time.monotonic()
        if on_progress is not None and now - last >= 0.5:
            last = now
            on_progress(
                {
                    "left": len(left),
                    "total": len(targets),
                    "bytes_left": sum(s.size for s, _ in left),
                }
            )
        with trio.move_on_after(1.0):
            await ev.wait()


def _failure(hard: list[Staged], lost: list[Staged]) -> str:
    return failure_message(hard, [c for st in lost if (c := st.conflict)])


def failure_message(hard: list[Staged], conflicts: list[tuple[str, str]]) -> str:
    """One line naming what a barrier could not commit and where lost bytes are kept."""
    parts = []
    if conflicts:
        kept = "; ".join(f"{path} -> {copy}" for path, copy in conflicts[:5])
        parts.append(
            f"{len(conflicts)} file(s) lost a conflict with another version at the origin; "
            f"their bytes are kept: {kept}"
        )
    if hard:
        names = ", ".join(str(st.path) for st in hard[:5])
        parts.append(f"{len(hard)} file(s) cannot be committed ({names}): {hard[0].error}")
    return "; ".join(parts)
