"""The resume state of a :class:`~airfs.data.VolumeDataset`: its form, its checks, and the
trackers that say how far an iteration got. Needs no torch.

A state is a plain JSON-able dict (``version``, ``epoch``, ``seed``, ``rank``, ``world_size``,
``num_files``, ``fingerprint``, ``history``, ``num_workers``, ``positions``, ``worker_offset``)
in the terms of :mod:`airfs.data.sharding`: a layout (worker count and, per worker, files
consumed) plus the history of earlier layouts of the epoch.

- :func:`fresh_state` is the state at the start of an epoch; :func:`validated` checks a state
  given by the user and returns a normalised copy, or raises ``ValueError`` saying what is wrong.
- :func:`check_matches` refuses (``RuntimeError``) a state made for another listing, world size
  or rank.
- :class:`Progress` tracks one in-process iterator (the main process, or one DataLoader
  worker); :class:`LoaderProgress` infers every worker's position from the batches a
  DataLoader handed out. Both report through :func:`state_from`.
"""

from __future__ import annotations

from typing import Any

from airfs.util.layoutstate import LayoutLike, WorkerProgress, checked_layout, layout_fields

from .sharding import UNKNOWN, Layout

STATE_VERSION = 1


def fresh_state(*, epoch: int, seed: int, num_files: int, fingerprint: int) -> dict[str, Any]:
    """The state of epoch ``epoch`` with nothing consumed yet, for any rank and world size."""
    return {
        "version": STATE_VERSION,
        "epoch": int(epoch),
        "seed": int(seed),
        "rank": None,
        "world_size": None,
        "num_files": num_files,
        "fingerprint": fingerprint,
        "history": [],
        "num_workers": 1,
        "positions": [0],
        "worker_offset": 0,
    }


def check_matches(
    state: dict[str, Any], *, root: str, num_files: int, fingerprint: int, rank: int, world: int
) -> None:
    """Raise ``RuntimeError`` unless ``state`` was made for this listing of ``root`` (file count
    and fingerprint) and, when it records them, this world size and rank."""
    if state["num_files"] != num_files or state["fingerprint"] != fingerprint:
        raise RuntimeError(
            f"the resume state was made for another listing of {root} "
            f"({state['num_files']} files, fingerprint {state['fingerprint']}; now "
            f"{num_files} files, fingerprint {fingerprint})"
        )
    if state["world_size"] is not None and state["world_size"] != world:
        raise RuntimeError(
            f"the resume state was saved with world size {state['world_size']}, the job now "
            f"runs with {world}: resuming mid-epoch needs the same world size (or start the "
            "next epoch: set_epoch(state['epoch'] + 1))"
        )
    if state["rank"] is not None and state["rank"] != rank:
        raise RuntimeError(
            f"the resume state belongs to rank {state['rank']}, loaded on rank {rank}"
        )


class Progress(WorkerProgress):
    """How far one in-process iterator got (in the main process, or one DataLoader worker):
    ``count`` files yielded."""

    def __init__(
        self,
        state: dict[str, Any],
        layout: Layout,
        rank: int,
        world: int,
        worker: int,
        *,
        own_only: bool,
    ) -> None:
        super().__init__(layout, worker, own_only=own_only)
        self._base = state
        self._rank = rank
        self._world = world

    def state(self) -> dict[str, Any]:
        """The state after ``count`` files; with ``own_only``, other workers' positions are
        :data:`~airfs.util.layoutstate.UNKNOWN`."""
        offset = int(self._base.get("worker_offset", 0)) if self.own_only else 0
        return state_from(
            self._base, self.layout, self.positions(), offset, self._rank, self._world
        )


class LoaderProgress:
    """Infers per-worker positions from the number of batches a DataLoader has handed out.

    torch's DataLoader with an ``IterableDataset`` and ``in_order=True`` asks its workers for
    batches in turn (worker 0 first) and yields them in that order, skipping a worker once it is
    exhausted; so batch ``k`` comes from a known worker. This holds when the datasets between
    :class:`VolumeDataset` and the loader map each path to exactly one sample.

    DataLoader worker ``j`` serves layout worker ``(offset + j) % K``. The state records, as
    ``worker_offset``, the layout worker whose batch is due next, so that a resumed loader
    hands out the remaining batches in the very order the interrupted one would have."""

    def __init__(
        self,
        state: dict[str, Any],
        layout: Layout,
        offset: int,
        rank: int,
        world: int,
        batch_size: int | None,
        drop_last: bool,
    ) -> None:
        self._base = state
        self._layout = layout
        self._offset = offset
        self._rank = rank
        self._world = world
        k = layout.num_workers
        counts = layout.remaining_counts()
        # indexed by DataLoader worker j
        self._counts = [counts[(offset + j) % k] for j in range(k)]
        self._batch = batch_size or 1
        if batch_size is None:
            per_worker = list(self._counts)
        elif drop_last:
            per_worker = [c // batch_size for c in self._counts]
        else:
            per_worker = [-(-c // batch_size) for c in self._counts]
        self._expected = per_worker
        self._taken = [0] * k
        self._active = [j for j, n in enumerate(per_worker) if n > 0]
        self._next = 0
        self.broken: str | None = None

    def advance(self) -> None:
        """One more batch was handed to the consumer."""
        if not self._active:
            self.broken = "the DataLoader yielded more batches than the dataset's files allow"
            return
        j = self._active[self._next]
        self._taken[j] += 1
        if self._taken[j] == self._expected[j]:
            self._active.pop(self._next)
            if self._next >= len(self._active):
                self._next = 0
        else:
            self._next = (self._next + 1) % len(self._active)

    def finish(self) -> None:
        """The DataLoader's iterator is exhausted."""
        if self._active:
            self.broken = "the DataLoader yielded fewer batches than the dataset's files allow"

    def state(self) -> dict[str, Any]:
        """The state after the batches counted so far; ``RuntimeError`` if the count broke."""
        if self.broken is not None:
            raise RuntimeError(
                f"cannot tell how far each worker got: {self.broken}. The datasets wrapping "
                "VolumeDataset must yield exactly one sample per path for airfs.data.DataLoader "
                "to count progress; use torchdata's StatefulDataLoader otherwise"
            )
        layout = self._layout
        k = layout.num_workers
        positions = list(layout.skip)
        for j in range(k):
            w = (self._offset + j) % k
            positions[w] += min(self._taken[j] * self._batch, self._counts[j])
        due = (self._offset + self._active[self._next]) % k if self._active else 0
        return state_from(self._base, layout, positions, due, self._rank, self._world)


def state_from(
    base: dict[str, Any],
    layout: LayoutLike,
    positions: list[int],
    worker_offset: int,
    rank: int,
    world: int,
) -> dict[str, Any]:
    """The state of ``base``'s epoch with ``layout`` (and its history), ``positions`` files
    consumed per layout worker, ``worker_offset`` the layout worker whose batch is due next."""
    return {
        "version": STATE_VERSION,
        "epoch": base["epoch"],
        "seed": base["seed"],
        "rank": rank,
        "world_size": world,
        "num_files": base["num_files"],
        "fingerprint": base["fingerprint"],
        **layout_fields(layout, positions),
        "worker_offset": worker_offset,
    }


_KEYS = {
    "version": int,
    "epoch": int,
    "seed": int,
    "num_files": int,
    "fingerprint": int,
    "history": list,
    "num_workers": int,
    "positions": list,
}


def validated(state: dict[str, Any]) -> dict[str, Any]:
    """A normalised copy of a state, or ValueError saying what is wrong with it."""
    state, k, positions, history = checked_layout(
        state, _KEYS, "VolumeDataset", STATE_VERSION, UNKNOWN
    )
    out: dict[str, Any] = {
        key: int(state[key]) for key in ("version", "epoch", "seed", "num_files", "fingerprint")
    }
    for key in ("rank", "world_size"):
        v = state.get(key)
        out[key] = None if v is None else int(v)
    offset = int(state.get("worker_offset", 0))
    if not 0 <= offset < k:
        raise ValueError(f"VolumeDataset state: bad worker_offset {offset} for {k} workers")
    out.update(history=history, num_workers=k, positions=positions, worker_offset=offset)
    return out
