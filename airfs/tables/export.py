"""``export_table``: a table into Parquet files of a chosen size in a volume, visible only when
complete.

The protocol is Spark's: the files are written under ``DEST/_temporary/<job>/``, renamed into
``DEST`` once every one is closed, then ``DEST/_SUCCESS`` (a JSON manifest of the files and
their row counts) is written last, by rename, and ``_temporary`` is removed. A reader that
honours ``_SUCCESS`` (every reader of :mod:`airfs.tables`, and Spark) never sees half an export:
until ``_SUCCESS`` exists, ``_temporary/`` is there and the directory is refused. On an airfs
mount the uploader commits in order, so at other nodes ``_SUCCESS`` also appears after the files.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, BinaryIO

import pyarrow as pa
import pyarrow.parquet as pq

from . import names
from .plan import as_expression, check_columns, plan_units, read_unit
from .reader import ordered_map
from .source import MANIFEST_FORMAT, SUCCESS, TEMPORARY, TableError, registered, resolve

MiB = 1 << 20


@dataclass(frozen=True)
class ExportedFile:
    path: str
    rows: int
    bytes: int


@dataclass(frozen=True)
class ExportResult:
    """What :func:`export_table` wrote: the files in order, with their row counts and sizes."""

    dest: str
    files: tuple[ExportedFile, ...]
    seconds: float

    @property
    def rows(self) -> int:
        return sum(f.rows for f in self.files)

    @property
    def bytes(self) -> int:
        return sum(f.bytes for f in self.files)

    @property
    def paths(self) -> list[str]:
        """The files, e.g. for ``load_dataset("parquet", data_files=result.paths)``."""
        return [f.path for f in self.files]


def export_table(
    source: Any,
    dest_dir: str | os.PathLike[str],
    *,
    target_file_bytes: int = 1 << 30,
    row_group_bytes: int = 128 * MiB,
    columns: Sequence[str] | None = None,
    filter: Any = None,
    version: int | None = None,
    overwrite: bool = False,
    compression: str = "snappy",
    progress: bool | None = None,
    read_threads: int = 4,
    root: str | os.PathLike[str] | None = None,
) -> ExportResult:
    """Write ``source`` as Parquet files of about ``target_file_bytes`` into ``dest_dir``.

    ``source`` is anything :func:`airfs.tables.source.resolve` takes (a Delta table: its active
    rows at ``version``, deletion vectors applied), or a ``pyarrow.dataset.Dataset``,
    ``pyarrow.Table`` or ``pyarrow.RecordBatchReader``. ``columns`` and ``filter`` select what
    is written. Row groups hold about ``row_group_bytes`` of (uncompressed) data. ``dest_dir``
    must be missing or empty unless ``overwrite`` (its ``_SUCCESS`` is removed first, so readers
    refuse it until the new export is complete). A progress line is shown on a terminal
    (``progress=None``: when stderr is one). Returns the files written, in order.

    ``source`` and ``dest_dir`` may be ``catalog.schema.table`` names, resolved through the
    mount at ``root`` (default ``$AIRFS_VOLUMES``, else ``/Volumes``): reading one needs
    ``SELECT``, writing one ``MODIFY`` (else ``PermissionError``). A ``PARQUET`` destination
    table gets the export in its directory as above; a ``DELTA`` one gets a Delta commit
    (``deltalake.write_deltalake``; ``overwrite`` replaces its rows, otherwise it must have no
    data yet), and the result lists the table's active files after it."""
    if target_file_bytes < 1 or row_group_bytes < 1:
        raise ValueError("target_file_bytes and row_group_bytes must be >= 1")
    t0 = time.monotonic()
    text = os.fspath(dest_dir)
    into = None
    if names.is_name(text) and not os.path.exists(text):
        into = registered(text, root=root, access="write")
        dest = into.path
    else:
        dest = os.path.abspath(text)
    batches = _batches(source, columns, as_expression(filter), version, read_threads, root)
    if into is not None and into.data_source_format == "DELTA":
        return _write_delta(batches, dest, overwrite, t0, into.name)
    _prepare(dest, overwrite)
    job = uuid.uuid4().hex[:12]
    tmp = os.path.join(dest, TEMPORARY, job)
    os.makedirs(tmp)
    show = sys.stderr.isatty() if progress is None else progress
    bar = _Progress(dest) if show else None
    writer = _Writer(tmp, job, target_file_bytes, row_group_bytes, compression, bar)
    try:
        for batch in batches:
            writer.add(batch)
        written = writer.finish()
    finally:
        writer.abort()
        if bar is not None:
            bar.done()
    files = []
    for name, rows, size in written:
        final = os.path.join(dest, name)
        os.rename(os.path.join(tmp, name), final)
        files.append(ExportedFile(final, rows, size))
    manifest = {
        "format": MANIFEST_FORMAT,
        "job": job,
        "rows": sum(f.rows for f in files),
        "files": [
            {"name": os.path.basename(f.path), "rows": f.rows, "bytes": f.bytes} for f in files
        ],
    }
    with open(os.path.join(tmp, SUCCESS), "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=1)
    os.rename(os.path.join(tmp, SUCCESS), os.path.join(dest, SUCCESS))
    shutil.rmtree(os.path.join(dest, TEMPORARY), ignore_errors=True)
    return ExportResult(dest, tuple(files), time.monotonic() - t0)


def _prepare(dest: str, overwrite: bool) -> None:
    if not os.path.exists(dest):
        os.makedirs(dest)
        return
    if not os.path.isdir(dest):
        raise NotADirectoryError(f"{dest}: exists and is not a directory")
    entries = os.listdir(dest)
    if not entries:
        return
    if not overwrite:
        raise FileExistsError(f"{dest}: not empty; pass overwrite=True to replace it")
    if SUCCESS in entries:
        os.unlink(os.path.join(dest, SUCCESS))  # first: readers refuse it from now on
    os.makedirs(os.path.join(dest, TEMPORARY), exist_ok=True)
    for name in entries:
        if name in (SUCCESS, TEMPORARY):
            continue
        p = os.path.join(dest, name)
        if os.path.isdir(p) and not os.path.islink(p):
            shutil.rmtree(p)
        else:
            os.unlink(p)


def _write_delta(
    batches: Iterator[pa.RecordBatch], dest: str, overwrite: bool, t0: float, name: str
) -> ExportResult:
    """One Delta commit of ``batches`` into registered table ``name`` at ``dest``."""
    import deltalake

    first = next(batches, None)
    if first is None:
        raise TableError(f"table {name}: nothing to write (the source has no rows)")
    if os.path.isdir(os.path.join(dest, "_delta_log")) and not overwrite:
        raise FileExistsError(f"table {name} has data already; pass overwrite=True to replace it")

    def all_batches() -> Iterator[pa.RecordBatch]:
        yield first
        yield from batches

    reader = pa.RecordBatchReader.from_batches(first.schema, all_batches())
    if overwrite:  # the rows and the schema are replaced
        deltalake.write_deltalake(dest, reader, mode="overwrite", schema_mode="overwrite")
    else:
        deltalake.write_deltalake(dest, reader, mode="error")
    adds = pa.table(deltalake.DeltaTable(dest).get_add_actions(flatten=True)).to_pylist()
    files = tuple(
        ExportedFile(
            os.path.join(dest, str(a["path"])), int(a["num_records"] or 0), int(a["size_bytes"])
        )
        for a in sorted(adds, key=lambda a: str(a["path"]))
    )
    return ExportResult(dest, files, time.monotonic() - t0)


def _batches(
    source: Any,
    columns: Sequence[str] | None,
    expr: Any,
    version: int | None,
    threads: int,
    root: str | os.PathLike[str] | None = None,
) -> Iterator[pa.RecordBatch]:
    """The record batches to write (checked here, before anything is written)."""
    import pyarrow.dataset as ds

    cols = None if columns is None else list(columns)
    if isinstance(source, pa.Table):
        source = ds.dataset(source)
    if isinstance(source, pa.RecordBatchReader):
        if cols is not None or expr is not None:
            source = ds.Scanner.from_batches(source, columns=cols, filter=expr).to_reader()
        return iter(source)
    if isinstance(source, ds.Dataset):
        return iter(source.to_batches(columns=cols, filter=expr))
    src = resolve(source, version=version, root=root)
    cols = check_columns(src, cols)
    units = plan_units(src)

    def gen() -> Iterator[pa.RecordBatch]:
        tables = ordered_map(
            lambda u: read_unit(src, u, cols, expr), units, ahead=2 * threads, threads=threads
        )
        for t in tables:
            yield from t.to_batches()

    return gen()


class _Writer:
    """Parquet files of about ``target`` bytes, row groups of about ``rg_bytes``."""

    def __init__(
        self,
        tmp: str,
        job: str,
        target: int,
        rg_bytes: int,
        compression: str,
        bar: _Progress | None,
    ) -> None:
        self._tmp = tmp
        self._job = job
        self._target = target
        self._rg_bytes = rg_bytes
        self._compression = compression
        self._bar = bar
        self._held: list[pa.RecordBatch] = []
        self._held_bytes = 0
        self._sink: BinaryIO | None = None
        self._writer: pq.ParquetWriter | None = None
        self._rows = 0
        self._last_rg = 0
        self.files: list[tuple[str, int, int]] = []

    def add(self, batch: pa.RecordBatch) -> None:
        if batch.num_rows == 0:
            return
        limit = min(self._rg_bytes, self._target)  # in memory; compressed it is smaller
        per_row = max(1, batch.nbytes // batch.num_rows)
        step = max(1, limit // per_row)
        for start in range(0, batch.num_rows, step):
            part = batch.slice(start, step)
            self._held.append(part)
            self._held_bytes += part.num_rows * per_row
            if self._held_bytes >= limit:
                self._flush_row_group()

    def _flush_row_group(self) -> None:
        if not self._held:
            return
        table = pa.Table.from_batches(self._held)
        self._held, self._held_bytes = [], 0
        if self._writer is None:
            name = f"part-{len(self.files):05d}-{self._job}.parquet"
            self._sink = open(os.path.join(self._tmp, name), "wb")  # noqa: SIM115
            self._writer = pq.ParquetWriter(self._sink, table.schema, compression=self._compression)
        before = self._sink.tell()  # type: ignore[union-attr]
        self._writer.write_table(table, row_group_size=table.num_rows)
        self._rows += table.num_rows
        size = self._sink.tell()  # type: ignore[union-attr]
        self._last_rg = size - before
        if self._bar is not None:
            self._bar.add(table.num_rows, self._last_rg)
        if size + self._last_rg // 2 >= self._target:
            self._close_file()

    def _close_file(self) -> None:
        if self._writer is None or self._sink is None:
            return
        self._writer.close()
        name = os.path.basename(self._sink.name)  # type: ignore[arg-type]
        size = self._sink.tell()
        self._sink.close()
        self.files.append((name, self._rows, size))
        self._writer, self._sink, self._rows = None, None, 0
        if self._bar is not None:
            self._bar.file_done()

    def finish(self) -> list[tuple[str, int, int]]:
        self._flush_row_group()
        self._close_file()
        return self.files

    def abort(self) -> None:
        if self._sink is not None:
            self._sink.close()


class _Progress:
    """One line on stderr, redrawn at most 10 times a second."""

    def __init__(self, dest: str) -> None:
        self._dest = dest
        self._rows = 0
        self._bytes = 0
        self._files = 0
        self._t0 = time.monotonic()
        self._last = 0.0

    def add(self, rows: int, nbytes: int) -> None:
        self._rows += rows
        self._bytes += nbytes
        self._draw()

    def file_done(self) -> None:
        self._files += 1
        self._draw(force=True)

    def _draw(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last < 0.1:
            return
        self._last = now
        rate = self._bytes / MiB / max(1e-9, now - self._t0)
        sys.stderr.write(
            f"\rexport {self._dest}: {self._rows:,} rows, "
            f"{self._bytes / MiB:,.1f} MiB, {self._files} files, {rate:,.1f} MiB/s"
        )
        sys.stderr.flush()

    def done(self) -> None:
        self._draw(force=True)
        sys.stderr.write("\n")
