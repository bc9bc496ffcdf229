"""The check both resumable datasets (:class:`airfs.data.VolumeDataset`,
:class:`airfs.tables.TableDataset`) make of a state handed to ``load_state_dict``: its keys and
their types, its version, and the worker layout it describes (``num_workers``, each worker's
``positions``, the ``history`` of earlier layouts). Each dataset then checks its own keys."""

from __future__ import annotations

from typing import Any

__all__ = ["checked_layout"]


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
