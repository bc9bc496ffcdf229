"""Units of work: the (file, row group) pairs of a source and how many rows each yields.

Row counts come from the Parquet footers (read in parallel: on a mount each footer is a couple
of small range reads). A deletion vector lowers a unit's count to its live rows. With a
``filter``, every unit's matching rows are counted here (pyarrow reads only the columns the
filter needs and skips row groups by their statistics), so that the counts, and so the split
over ranks, are exact; units with no row left are dropped.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from .source import DataFile, TableError, TableSource

FOOTER_THREADS = 16


@dataclass(frozen=True)
class Unit:
    """Row group ``row_group`` of file ``file`` (an index into the source's files): ``rows``
    rows once the deletion vector and the filter are applied; ``first_row`` is the index, in the
    file, of the row group's first row (to slice the deletion vector)."""

    file: int
    row_group: int
    rows: int
    first_row: int
    file_rows: int  # rows of the row group as stored


def fragment(source: TableSource, unit: Unit | None, file: int | None = None) -> ds.Fragment:
    """A pyarrow fragment for one unit (or for a whole file) that reads with the source's
    schema: partition values filled in, columns a file lacks read as nulls."""
    f = source.files[unit.file if unit is not None else file]  # type: ignore[index]
    return _FORMAT.make_fragment(
        f.path,
        filesystem=_LOCAL,
        partition_expression=f.partition_expression(),
        row_groups=None if unit is None else [unit.row_group],
    )


_LOCAL = pafs.LocalFileSystem()
_FORMAT = ds.ParquetFileFormat(
    default_fragment_scan_options=ds.ParquetFragmentScanOptions(pre_buffer=True)
)


def as_expression(filter: Any) -> pc.Expression | None:
    """``filter`` as a pyarrow Expression: an Expression, or pyarrow/deltalake's DNF form
    (``[("col", ">", 3), ...]`` or a list of such lists)."""
    if filter is None or isinstance(filter, pc.Expression):
        return filter
    if isinstance(filter, list | tuple):
        try:
            return pq.filters_to_expression(list(filter))
        except (TypeError, ValueError) as exc:
            raise TableError(f"bad filter {filter!r}: {exc}") from None
    raise TypeError(f"filter is a pyarrow Expression or a DNF list, not {type(filter).__name__}")


def check_columns(source: TableSource, columns: Sequence[str] | None) -> list[str] | None:
    """``columns`` as a list, or TableError naming the first one the table does not have."""
    if columns is None:
        return None
    if isinstance(columns, str):
        raise TypeError("columns is a list of column names, not a string")
    names = set(source.schema.names)
    for c in columns:
        if c not in names:
            raise TableError(f"{source.root}: no column {c!r} (columns: {source.schema.names})")
    return list(columns)


def plan_units(source: TableSource, filter: pc.Expression | None = None) -> list[Unit]:
    """Every unit of ``source`` with at least one row, in file order then row-group order."""
    with ThreadPoolExecutor(min(FOOTER_THREADS, max(1, len(source.files)))) as pool:
        per_file = list(pool.map(_file_units, range(len(source.files)), source.files))
        units = [u for us in per_file for u in us]
        if filter is not None:
            counts = list(pool.map(lambda u: count_rows(source, u, filter), units))
            units = [
                Unit(u.file, u.row_group, n, u.first_row, u.file_rows)
                for u, n in zip(units, counts, strict=True)
            ]
    return [u for u in units if u.rows > 0]


def _file_units(index: int, f: DataFile) -> list[Unit]:
    try:
        meta = pq.read_metadata(f.path)
    except (OSError, pa.ArrowException) as exc:
        raise TableError(f"{f.path}: cannot read the Parquet footer ({exc})") from None
    if f.keep is not None and len(f.keep) > meta.num_rows:
        raise TableError(
            f"{f.path}: deletion vector covers {len(f.keep)} rows, the file has {meta.num_rows}"
        )
    out = []
    first = 0
    for rg in range(meta.num_row_groups):
        n = meta.row_group(rg).num_rows
        live = n if f.keep is None else n - int((~f.keep[first : first + n]).sum())
        out.append(Unit(index, rg, live, first, n))
        first += n
    return out


def keep_mask(source: TableSource, unit: Unit) -> Any:
    """The deletion-vector mask of ``unit``'s rows (numpy bool array), or None (all live)."""
    import numpy as np

    keep = source.files[unit.file].keep
    if keep is None:
        return None
    mask = keep[unit.first_row : unit.first_row + unit.file_rows]
    if len(mask) < unit.file_rows:  # a vector shorter than the file: the rest is live
        mask = np.concatenate([mask, np.ones(unit.file_rows - len(mask), dtype=bool)])
    return mask


def read_unit(
    source: TableSource,
    unit: Unit,
    columns: list[str] | None,
    filter: pc.Expression | None,
) -> pa.Table:
    """The rows of ``unit`` (deletion vector, then filter applied), projected to ``columns``."""
    frag = fragment(source, unit)
    mask = keep_mask(source, unit)
    try:
        if mask is None:
            return frag.to_table(schema=source.schema, columns=columns, filter=filter)
        # the mask is positional: read every row, drop the deleted ones, then filter
        table = frag.to_table(schema=source.schema, columns=None if filter is not None else columns)
        table = table.filter(pa.array(mask))
        if filter is not None:
            table = table.filter(filter)
            if columns is not None:
                table = table.select(columns)
        return table
    except (OSError, pa.ArrowException) as exc:
        raise TableError(
            f"{source.files[unit.file].path} row group {unit.row_group}: {exc}"
        ) from exc


def count_rows(source: TableSource, unit: Unit, filter: pc.Expression) -> int:
    """How many rows of ``unit`` are live and match ``filter``."""
    if source.files[unit.file].keep is None:
        try:
            return int(
                fragment(source, unit).scanner(schema=source.schema, filter=filter).count_rows()
            )
        except (OSError, pa.ArrowException) as exc:
            raise TableError(f"{source.files[unit.file].path}: {exc}") from exc
    return read_unit(source, unit, [source.schema.names[0]], filter).num_rows

