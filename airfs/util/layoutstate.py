"""What both resumable datasets (:class:`airfs.data.VolumeDataset`,
:class:`airfs.tables.TableDataset`) share of their resume state: the check of a state handed to
``load_state_dict`` (its keys and their types, its version, and the worker layout it describes:
``num_workers``, each worker's ``positions``, the ``history`` of earlier layouts; each dataset
then checks its own keys), and :class:`WorkerProgress`, how far one in-process iterator got,
reported as those layout fields."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

__all__ = ["UNKNOWN", "LayoutLike", "WorkerProgress", "checked_layout", "layout_fields"]

#: a worker position that a state does not hold (another worker's, in a per-worker state)
UNKNOWN = -1


class SegmentLike(Protocol):
    """A finished layout of a history: its worker count and what each worker consumed."""

    @property
    def num_workers(self) -> int: ...

    @property
    def positions(self) -> Sequence[int]: ...


class LayoutLike(Protocol):
    """The current layout: its worker count, what each worker skips (already consumed), and
    the history of earlier layouts of the epoch (files for a volume, rows for a table)."""

    @property
    def num_workers(self) -> int: ...

    @property
    def skip(self) -> Sequence[int]: ...

    @property
    def history(self) -> Sequence[SegmentLike]: ...


def layout_fields(layout: LayoutLike, positions: list[int]) -> dict[str, Any]:
    """The state's layout keys: ``history`` (of ``layout``), ``num_workers``, ``positions``."""
    return {
        "history": [[seg.num_workers, list(seg.positions)] for seg in layout.history],
        "num_workers": layout.num_workers,
        "positions": positions,
    }


class WorkerProgress:
    """How far one in-process iterator (the main process, or one DataLoader worker) got:
    ``count`` items consumed after the ``skip`` of its worker. With ``own_only`` (a
    DataLoader worker, which cannot know the others) the other workers' positions are
    :data:`UNKNOWN`; else they are where the layout started them."""

    def __init__(self, layout: LayoutLike, worker: int, *, own_only: bool) -> None:
        self.layout = layout
        self.worker = worker
        self.own_only = own_only
        self.count = 0

    def positions(self) -> list[int]:
        layout = self.layout
        out = [UNKNOWN] * layout.num_workers if self.own_only else list(layout.skip)
        out[self.worker] = layout.skip[self.worker] + self.count
        return out


def checked_layout(
    state: object, keys: dict[str, type], what: str, version: int, unknown: int
) -> tuple[dict[str, Any], int, list[int], list[list[Any]]]:
    """``(state, num_workers, positions, history)`` of a ``what`` state (e.g.
    ``"VolumeDataset"``), or ``ValueError`` saying what is wrong: not a dict, a key of
    ``keys`` missing or of another type, another ``version``, positions that are not one
    per worker (each ``>= 0`` or ``unknown``), or a history entry that is not
    ``[num_workers, positions]``."""
    if not isinstance(state, dict):
        raise ValueError(f"a {what} state is a dict, not {type(state).__name__}")
    for key, typ in keys.items():
        if not isinstance(state.get(key), typ):
            raise ValueError(f"{what} state: {key!r} missing or not {typ.__name__}")
    if state["version"] != version:
        raise ValueError(f"{what} state version {state['version']} is not supported")
    k = int(state["num_workers"])
    positions = [int(p) for p in state["positions"]]
    if k < 1 or len(positions) != k or any(p < 0 and p != unknown for p in positions):
        raise ValueError(f"{what} state: bad positions {positions} for {k} workers")
    history: list[list[Any]] = []
    for seg in state["history"]:
        sk, sp = int(seg[0]), [int(p) for p in seg[1]]
        if sk < 1 or len(sp) != sk or any(p < 0 for p in sp):
            raise ValueError(f"{what} state: bad history entry {seg}")
        history.append([sk, sp])
    return state, k, positions, history
