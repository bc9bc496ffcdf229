"""Reading a worker's pieces: row groups read ahead on threads, an optional bounded shuffle,
batches cut to size, and prefetch requests to the airfs daemon for the files coming next.

Everything here is a plain iterator over Arrow data; :mod:`airfs.tables.dataset` turns the
batches into NumPy arrays or tensors.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections import deque
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.compute as pc

from ..control import client
from .assign import Interval, Piece, to_pieces
from .plan import Unit, as_expression, check_columns, plan_units, read_unit
from .source import TableSource, resolve

log = logging.getLogger("airfs.tables")
T = TypeVar("T")
R = TypeVar("R")


def ordered_map(
    fn: Callable[[T], R], items: Iterable[T], *, ahead: int, threads: int
) -> Generator[R, None, None]:
    """``fn(item)`` for each item, in order, with up to ``ahead`` calls running on ``threads``
    threads ahead of the consumer. Closing the iterator cancels what has not started."""
    with ThreadPoolExecutor(max(1, threads), thread_name_prefix="airfs-tables-read") as pool:
        pending: deque[Future[R]] = deque()
        todo = iter(items)

        def fill() -> None:
            while len(pending) < max(1, ahead):
                item = next(todo, _END)
                if item is _END:
                    return
                pending.append(pool.submit(fn, item))  # type: ignore[arg-type]

        try:
            fill()
            while pending:
                result = pending.popleft().result()
                fill()
                yield result
        finally:
            for fut in pending:
                fut.cancel()


_END = object()


def read_pieces(
    source: TableSource,
    units: Sequence[Unit],
    pieces: Sequence[Piece],
    *,
    columns: list[str] | None,
    filter: pc.Expression | None,
    read_ahead: int,
    threads: int,
) -> Iterator[pa.Table]:
    """The rows of ``pieces`` in order, one table per piece. Up to ``read_ahead`` row groups
    are being read (on ``threads`` threads) while the consumer works on the current one; a
    row group cut into consecutive pieces is read once."""
    groups = _group(pieces)

    def read(group: list[Piece]) -> pa.Table:
        return read_unit(source, units[group[0].unit], columns, filter)

    tables = ordered_map(read, groups, ahead=read_ahead, threads=threads)
    try:
        for group, table in zip(groups, tables, strict=True):
            unit = units[group[0].unit]
            if table.num_rows != unit.rows:
                raise RuntimeError(
                    f"{source.files[unit.file].path} row group {unit.row_group} has "
                    f"{table.num_rows} rows, the plan counted {unit.rows}: the file changed "
                    "under the dataset"
                )
            for p in group:
                yield table.slice(p.start, p.rows)
    finally:
        tables.close()


def read_table(
    source: Any,
    columns: Sequence[str] | None = None,
    filter: Any = None,
    *,
    version: int | None = None,
    threads: int = 8,
    root: str | os.PathLike[str] | None = None,
) -> pa.Table:
    """The whole table (a source as :func:`airfs.tables.source.resolve` takes, or a pyarrow
    dataset) as one ``pyarrow.Table``, deletion vectors and ``filter`` applied, projected to
    ``columns``; then ``.to_pandas()`` or ``.column(c).to_numpy()``. For tables that fit in
    memory; use :class:`airfs.tables.TableDataset` for the others. A ``catalog.schema.table``
    name is resolved through the mount at ``root`` (default ``$AIRFS_VOLUMES``, else
    ``/Volumes``) and needs ``SELECT`` on the table."""
    import pyarrow.dataset as ds

    expr = as_expression(filter)
    if isinstance(source, ds.Dataset):
        return source.to_table(columns=None if columns is None else list(columns), filter=expr)
    src = resolve(source, version=version, root=root)
    cols = check_columns(src, columns)
    units = plan_units(src)
    parts = list(
        ordered_map(
            lambda u: read_unit(src, u, cols, expr), units, ahead=2 * threads, threads=threads
        )
    )
    if not parts:
        schema = src.schema if cols is None else pa.schema([src.schema.field(c) for c in cols])
        return schema.empty_table()
    return pa.concat_tables(parts)


def _group(pieces: Sequence[Piece]) -> list[list[Piece]]:
    """Consecutive pieces of the same unit together (they share one read)."""
    out: list[list[Piece]] = []
    for p in pieces:
        if out and out[-1][-1].unit == p.unit:
            out[-1].append(p)
        else:
            out.append([p])
    return out


def window_plan(
    span: Sequence[Piece], intervals: Sequence[Interval], window_rows: int
) -> list[tuple[int, list[Piece], list[Interval]]]:
    """How to read the positions ``intervals`` of a rank's *shuffled* stream.

    The rank's span of ``P`` rows is cut into windows of ``window_rows`` rows (window ``j``:
    span offsets ``[j B, (j + 1) B)``), and the shuffled stream is each window's rows permuted,
    window after window, so every stream position falls in one window. Returns, per window
    needed (in order): its index, the pieces that hold its rows (in span order), and the ranges
    of positions within the window to yield from it, in order."""
    total = sum(p.rows for p in span)
    out: list[tuple[int, list[Piece], list[Interval]]] = []
    for a, b in intervals:
        while a < b:
            j = a // window_rows
            lo, hi = j * window_rows, min((j + 1) * window_rows, total)
            stop = min(b, hi)
            if not out or out[-1][0] != j:
                out.append((j, to_pieces(span, [(lo, hi)]), []))
            out[-1][2].append((a - lo, stop - lo))
            a = stop
    return out


def read_shuffled(
    tables: Iterator[pa.Table],
    plan: Sequence[tuple[int, list[Piece], list[Interval]]],
    *,
    key: str,
) -> Iterator[pa.Table]:
    """The shuffled stream's rows that ``plan`` (:func:`window_plan`) asks for, given in
    ``tables`` the reads of every window's pieces, in plan order. Window ``j`` is permuted by a
    generator seeded from ``key`` and ``j``: the same rows in the same order in every process
    (of one NumPy version). Memory: one window."""
    import numpy as np

    for j, pieces, ranges in plan:
        want = sum(p.rows for p in pieces)
        parts: list[pa.Table] = []
        have = 0
        while have < want:
            t = next(tables)
            parts.append(t)
            have += t.num_rows
        # one chunk per column: take() on a chunked table is ~15x slower
        window = (pa.concat_tables(parts) if len(parts) > 1 else parts[0]).combine_chunks()
        seed = int.from_bytes(hashlib.sha256(f"{key}:{j}".encode()).digest()[:8], "little")
        perm = np.random.default_rng(seed).permutation(window.num_rows)
        for lo, hi in ranges:
            yield window.take(pa.array(perm[lo:hi]))


def batches(tables: Iterator[pa.Table], batch_rows: int) -> Iterator[pa.Table]:
    """The rows of ``tables`` regrouped into tables of ``batch_rows`` rows (the last one may be
    shorter)."""
    held: list[pa.Table] = []
    have = 0
    for t in tables:
        while t.num_rows:
            take = min(batch_rows - have, t.num_rows)
            held.append(t.slice(0, take))
            have += take
            t = t.slice(take)
            if have == batch_rows:
                yield _combine(held)
                held, have = [], 0
    if have:
        yield _combine(held)


def _combine(parts: list[pa.Table]) -> pa.Table:
    return parts[0] if len(parts) == 1 else pa.concat_tables(parts).combine_chunks()


class MountPrefetch:
    """Asks an airfs daemon to fetch the next ``ahead`` files after the one being read, from a
    background thread. The file being read is never asked for: pyarrow is reading it already,
    and a whole-file fetch beside those reads only competes with them (measured: cold reads
    26% slower). A failed request logs one warning and turns prefetching off; it never stops
    the reading."""

    def __init__(self, mountpoint: str, paths: Sequence[str], ahead: int) -> None:
        self._paths = list(dict.fromkeys(paths))  # each file once, in first-use order
        self._mountpoint = mountpoint
        self._ahead = max(1, ahead)
        self._requested = 1  # one past the last file asked for; the first is being read
        self._enabled = True
        self._sent: deque[Future[None]] = deque()
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="airfs-tables-prefetch")
        self.requests = 0

    def at(self, path: str) -> None:
        """The reader has reached ``path``: keep ``ahead`` files requested past it."""
        while self._sent and self._sent[0].done():
            exc = self._sent.popleft().exception()
            if exc is not None and self._enabled:
                self._enabled = False
                log.warning(
                    "airfs: cannot ask the daemon of %s to prefetch (%s); reading without prefetch",
                    self._mountpoint,
                    exc,
                )
        if not self._enabled:
            return
        try:
            i = self._paths.index(path, max(0, self._requested - self._ahead - 1))
        except ValueError:
            return
        nxt = i + 1
        if self._requested - nxt <= self._ahead // 2 and self._requested < len(self._paths):
            end = min(len(self._paths), nxt + self._ahead)
            batch = self._paths[max(self._requested, nxt) : end]
            if batch:
                self._sent.append(self._pool.submit(client.prefetch, self._mountpoint, batch))
                self.requests += 1
            self._requested = end

    def close(self) -> None:
        for fut in self._sent:
            fut.cancel()
        self._pool.shutdown(wait=False, cancel_futures=True)
