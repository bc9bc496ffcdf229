"""``TableDataset``: the rows of a Parquet or Delta table, sharded over ranks and DataLoader
workers, as dicts of column arrays. See :class:`TableDataset` for the contract and
:mod:`airfs.tables.assign` for who reads which rows."""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Iterator, Sequence
from typing import Any, Literal

import pyarrow as pa
import torch
from torch.utils.data import IterableDataset, get_worker_info

from airfs.util.layoutstate import checked_layout

from . import assign
from .assign import UNKNOWN, Layout, Segment
from .plan import Unit, as_expression, check_columns, plan_units
from .reader import MountPrefetch, batches, read_pieces, read_shuffled, window_plan
from .source import TableSource, resolve

STATE_VERSION = 1
_BLOB_CAPACITY = 1 << 14  # below torch's parallel grain size: filling it never enters OpenMP
Output = Literal["numpy", "torch", "arrow"]


class TableDataset(IterableDataset[dict[str, Any]]):
    """An ``IterableDataset`` over the rows of a table (see :mod:`airfs.tables.source` for what
    ``source`` may be: a Parquet directory, file, glob or list, a Delta table, or a
    ``catalog.schema.table`` name resolved through the mount at ``root``, default
    ``$AIRFS_VOLUMES`` or ``/Volumes``, which needs ``SELECT`` on the table).

    **Units.** Here, once: the source is resolved (a Delta table at ``version``, default the
    latest), the Parquet footers are read and every (file, row group) becomes a unit with its row
    count, after the deletion vector and ``filter`` (a pyarrow Expression or DNF list; with a
    filter the matching rows are counted now, reading the columns it needs).

    **Sharding.** At iteration time (a dataset made before ``init_process_group`` still shards)
    the rank and world size are read from ``torch.distributed`` (or ``rank``/``world_size``) and
    the worker from ``get_worker_info()``. Every rank reads the same number of rows, every row of
    the epoch's span exactly once across all (rank, worker): ``uneven="drop"`` leaves out up to
    ``world_size - 1`` rows, ``"pad"`` reads as many twice (:mod:`airfs.tables.assign`). With
    ``shuffle`` the units are in an order fixed by ``(seed, epoch)`` and rows are permuted within
    windows of at least ``shuffle_rows`` rows; :meth:`set_epoch` picks the epoch (it reaches
    persistent workers).

    **Items.** With ``batch_rows`` a dict ``{column: array}`` of ``batch_rows`` rows (a worker's
    last batch may be shorter); else one dict per row. ``output`` says what the arrays are:
    ``"numpy"`` arrays (read-only views of Arrow's buffers where possible: pass
    ``output="torch"`` to a DataLoader, which would otherwise warn about them), ``"torch"``
    tensors (columns that are not numeric stay NumPy arrays) or
    ``"arrow"`` (a ``pyarrow.Table`` per batch). Use ``DataLoader(ds, batch_size=None)`` with
    ``batch_rows``.

    **Reading.** pyarrow reads only ``columns``; ``read_ahead`` row groups are read on threads
    while the current one is consumed. On an airfs mount (unless ``mount_prefetch=False``) the
    daemon is also asked to fetch the next ``prefetch_files`` whole files of this worker into
    its cache, never the file being read (pyarrow reads it already; a whole-file fetch beside
    those reads competed with them). Measured on 2 cores, cold: 125 against 110 MiB/s without
    (docs/benchmarks.md, "Tables"). Turn it off when a worker reads a small part of each file (a
    few columns of wide files): the daemon would fetch what is not read.

    **Resume.** :meth:`state_dict` says how many rows each worker consumed; after
    :meth:`load_state_dict` the next iteration yields exactly the rows not yet yielded, in the
    same order (a new worker count also works: the rest is split anew). A state made for another
    table version or content, another world size or rank, or other planning options is refused
    with a ``RuntimeError`` naming the difference. With DataLoader workers, use torchdata's
    ``StatefulDataLoader`` (it keeps each worker's state).
    """

    _local: dict[str, Any] | None
    _progress: _Progress | None

    def __init__(
        self,
        source: Any,
        *,
        columns: Sequence[str] | None = None,
        filter: Any = None,
        batch_rows: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        uneven: assign.Uneven = "pad",
        shuffle_rows: int = 65536,
        output: Output = "numpy",
        version: int | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        read_ahead: int = 4,
        read_threads: int = 4,
        prefetch_files: int = 8,
        mount_prefetch: bool = True,
        root: str | os.PathLike[str] | None = None,
    ) -> None:
        if uneven not in ("pad", "drop"):
            raise ValueError(f"uneven must be 'pad' or 'drop', not {uneven!r}")
        if output not in ("numpy", "torch", "arrow"):
            raise ValueError(f"output must be 'numpy', 'torch' or 'arrow', not {output!r}")
        if batch_rows is not None and batch_rows < 1:
            raise ValueError(f"batch_rows must be >= 1, not {batch_rows}")
        if output == "arrow" and batch_rows is None:
            raise ValueError("output='arrow' needs batch_rows")
        if shuffle_rows < 1 or read_ahead < 1 or read_threads < 1 or prefetch_files < 1:
            raise ValueError("shuffle_rows, read_ahead, read_threads, prefetch_files must be >= 1")
        if (rank is None) != (world_size is None):
            raise ValueError("give both rank and world_size, or neither")
        if rank is not None and world_size is not None:
            assign.check_rank(rank, world_size)
        self.source: TableSource = resolve(source, version=version, root=root)
        self.columns = check_columns(self.source, columns)
        self.filter = as_expression(filter)
        self.units: tuple[Unit, ...] = tuple(plan_units(self.source, self.filter))
        self.batch_rows = batch_rows
        self.shuffle = shuffle
        self.uneven: assign.Uneven = uneven
        self.shuffle_rows = shuffle_rows
        self.output: Output = output
        self.read_ahead = read_ahead
        self.read_threads = read_threads
        self.prefetch_files = prefetch_files
        self.mount_prefetch = mount_prefetch
        self._rank = rank
        self._world_size = world_size
        self._unit_rows = [u.rows for u in self.units]
        self._plan = (
            f"{self.source.fingerprint}:{self.filter}:{self.shuffle}:"
            f"{self.shuffle_rows if shuffle else 0}:{self.uneven}"
        )
        self._blob = torch.zeros(_BLOB_CAPACITY, dtype=torch.uint8).share_memory_()
        self._write_shared(self._fresh(epoch=0, seed=seed))
        self._init_local()

    # ------------------------------------------------------------------------------ public

    @property
    def num_rows(self) -> int:
        """Rows in the table (after deletion vectors and the filter)."""
        return sum(self._unit_rows)

    @property
    def epoch(self) -> int:
        return int(self._state()["epoch"])

    def rows_per_rank(self) -> int:
        """Rows this rank reads in a whole epoch (rank and world size read now)."""
        _, world = self._rank_world()
        return assign.rows_per_rank(self._unit_rows, world, self.uneven)

    def __len__(self) -> int:
        """Items this rank yields in an epoch with one worker (rows, or batches of
        ``batch_rows``; with ``K`` workers each worker's last batch may be short, so up to
        ``K - 1`` more batches)."""
        n = self.rows_per_rank()
        return n if self.batch_rows is None else -(-n // self.batch_rows)

    def set_epoch(self, epoch: int) -> None:
        """Read epoch ``epoch`` next. A resume state loaded for another epoch is dropped."""
        state = self._state()
        if state["epoch"] != epoch:
            self._set(self._fresh(epoch=epoch, seed=int(state["seed"])))

    def state_dict(self) -> dict[str, Any]:
        """Where this rank is in the current epoch (JSON-able). In a DataLoader worker (where
        ``StatefulDataLoader`` asks): that worker's position only."""
        if self._progress is not None:
            return self._progress.state()
        return dict(self._state())

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Make the next iteration over ``state["epoch"]`` yield what was not yet yielded."""
        self._set(_validated(state))

    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        worker, num_workers = (info.id, info.num_workers) if info is not None else (0, 1)
        rank, world = self._rank_world()
        state = self._state()
        self._check(state, rank, world)
        span = assign.rank_pieces(
            self._unit_rows,
            rank=rank,
            world_size=world,
            epoch=state["epoch"],
            seed=state["seed"],
            shuffle=self.shuffle,
            uneven=self.uneven,
        )
        layout = assign.resolve_layout(
            assign.length([(0, sum(p.rows for p in span))]),
            history=[Segment(int(k), tuple(p)) for k, p in state["history"]],
            num_workers=int(state["num_workers"]),
            positions=[int(p) for p in state["positions"]],
            new_num_workers=num_workers,
        )
        progress = _Progress(state, layout, rank, world, worker, own_only=info is not None)
        self._progress = progress
        if layout.skip[worker] == UNKNOWN:
            raise RuntimeError(f"the resume state does not hold worker {worker}'s position")
        intervals = layout.worker_intervals(worker)  # positions in the (shuffled) stream
        if self.shuffle:
            plan = window_plan(span, intervals, self.shuffle_rows)
            pieces = [p for _, ps, _ in plan for p in ps]
        else:
            pieces = assign.to_pieces(span, intervals)
        mountpoint = self.source.mountpoint if self.mount_prefetch else None
        prefetch = None
        if mountpoint is not None:
            prefetch = MountPrefetch(
                mountpoint,
                [self.source.files[self.units[p.unit].file].path for p in pieces],
                self.prefetch_files,
            )
        tables = read_pieces(
            self.source,
            self.units,
            pieces,
            columns=self.columns,
            filter=self.filter,
            read_ahead=self.read_ahead,
            threads=self.read_threads,
        )
        if prefetch is not None:
            tables = _announce(tables, pieces, self, prefetch)
        if self.shuffle:
            key = f"{state['seed']}:{state['epoch']}:{rank}"
            tables = read_shuffled(tables, plan, key=key)
        try:
            if self.batch_rows is not None:
                for batch in batches(tables, self.batch_rows):
                    item = self._convert(batch)
                    progress.consumed += batch.num_rows
                    yield item
            else:
                for t in tables:
                    cols = self._convert(t)
                    for i in range(t.num_rows):
                        row = {k: v[i] for k, v in cols.items()}
                        progress.consumed += 1
                        yield row
        finally:
            tables.close()  # type: ignore[attr-defined]
            if prefetch is not None:
                prefetch.close()

    # ----------------------------------------------------------------------------- private

    def _convert(self, table: pa.Table) -> Any:
        if self.output == "arrow":
            return table
        out: dict[str, Any] = {}
        for name, col in zip(table.column_names, table.columns, strict=True):
            arr = col.to_numpy(zero_copy_only=False)
            if self.output == "torch" and arr.dtype.kind in "biuf":
                arr = torch.from_numpy(arr if arr.flags.writeable else arr.copy())
            out[name] = arr
        return out

    def _init_local(self) -> None:
        self._local = None
        self._progress = None
        self._dist_snapshot: tuple[int, int] | None = getattr(self, "_dist_snapshot", None)

    def __getstate__(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["_progress"] = None
        snap = _dist_rank_world()
        if snap is not None:  # a worker started with "spawn" has no process group
            d["_dist_snapshot"] = snap
        return d

    def __setstate__(self, d: dict[str, Any]) -> None:
        self.__dict__.update(d)
        self._init_local()

    def _rank_world(self) -> tuple[int, int]:
        if self._rank is not None and self._world_size is not None:
            return self._rank, self._world_size
        return _dist_rank_world() or self._dist_snapshot or (0, 1)

    def _fresh(self, *, epoch: int, seed: int) -> dict[str, Any]:
        return {
            "version": STATE_VERSION,
            "epoch": int(epoch),
            "seed": int(seed),
            "rank": None,
            "world_size": None,
            "table_version": self.source.version,
            "plan": self._plan,
            "history": [],
            "num_workers": 1,
            "positions": [0],
        }

    def _state(self) -> dict[str, Any]:
        if self._local is not None:
            return self._local
        (n,) = struct.unpack("<Q", bytes(self._blob[:8].tolist()))
        state = json.loads(bytes(self._blob[8 : 8 + n].tolist()))
        assert isinstance(state, dict)
        return state

    def _set(self, state: dict[str, Any]) -> None:
        self._progress = None
        if get_worker_info() is not None:
            self._local = state  # one worker's own: must not clobber the others'
        else:
            self._local = None
            self._write_shared(state)

    def _write_shared(self, state: dict[str, Any]) -> None:
        data = json.dumps(state, separators=(",", ":")).encode()
        if len(data) + 8 > _BLOB_CAPACITY:
            raise ValueError(f"TableDataset state too large ({len(data)} bytes)")
        raw = bytearray(struct.pack("<Q", len(data)) + data)
        self._blob[: len(raw)] = torch.frombuffer(raw, dtype=torch.uint8)

    def _check(self, state: dict[str, Any], rank: int, world: int) -> None:
        if state["table_version"] != self.source.version:
            raise RuntimeError(
                f"the resume state was saved at version {state['table_version']} of "
                f"{self.source.root}, this dataset reads version {self.source.version}: "
                f"make it with version={state['table_version']}"
            )
        if state["plan"] != self._plan:
            raise RuntimeError(
                f"the resume state was made for other data or options ({state['plan']}), this "
                f"dataset is {self._plan}: the files, filter, shuffle or uneven changed"
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


def _announce(
    tables: Iterator[pa.Table], pieces: list[Any], ds: TableDataset, prefetch: MountPrefetch
) -> Iterator[pa.Table]:
    """Tell the prefetcher which file the reader is at as each piece comes out."""
    try:
        for piece, table in zip(pieces, tables, strict=False):
            prefetch.at(ds.source.files[ds.units[piece.unit].file].path)
            yield table
    finally:
        tables.close()  # type: ignore[attr-defined]


class _Progress:
    """How many rows one iterator (the main process, or one DataLoader worker) consumed."""

    def __init__(
        self,
        base: dict[str, Any],
        layout: Layout,
        rank: int,
        world: int,
        worker: int,
        *,
        own_only: bool,
    ) -> None:
        self._base = base
        self._layout = layout
        self._rank = rank
        self._world = world
        self._worker = worker
        self._own_only = own_only
        self.consumed = 0

    def state(self) -> dict[str, Any]:
        layout = self._layout
        positions = [UNKNOWN] * layout.num_workers if self._own_only else list(layout.skip)
        positions[self._worker] = layout.skip[self._worker] + self.consumed
        return {
            **self._base,
            "rank": self._rank,
            "world_size": self._world,
            "history": [[s.num_workers, list(s.positions)] for s in layout.history],
            "num_workers": layout.num_workers,
            "positions": positions,
        }


_KEYS = {
    "version": int,
    "epoch": int,
    "seed": int,
    "plan": str,
    "history": list,
    "num_workers": int,
    "positions": list,
}


def _validated(state: dict[str, Any]) -> dict[str, Any]:
    """A normalised copy of a state, or ValueError saying what is wrong with it."""
    state, k, positions, history = checked_layout(
        state, _KEYS, "TableDataset", STATE_VERSION, UNKNOWN
    )
    out = dict(state)
    for key in ("rank", "world_size", "table_version"):
        v = state.get(key)
        out[key] = None if v is None else int(v)
    out.update(history=history, num_workers=k, positions=positions)
    return out


def _dist_rank_world() -> tuple[int, int] | None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return None
