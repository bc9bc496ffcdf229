"""Tables in volumes: Parquet and Delta tables read as pyarrow tables, a rank-sharded resumable
dataset of their rows, and exports into Parquet files. Needs the ``tables`` extra (pyarrow,
deltalake); :class:`TableDataset` also needs torch.

``TableDataset`` is imported on first use, so that :func:`read_table` and :func:`export_table`
work without torch.
"""

from typing import Any

from .export import ExportedFile as ExportedFile
from .export import ExportResult as ExportResult
from .export import export_table as export_table
from .reader import read_table as read_table
from .source import TableError as TableError
from .source import TableSource as TableSource
from .source import delta_write_options as delta_write_options
from .source import resolve as resolve

__all__ = [
    "ExportResult",
    "ExportedFile",
    "TableDataset",
    "TableError",
    "TableSource",
    "delta_write_options",
    "export_table",
    "read_table",
    "resolve",
]


def __getattr__(name: str) -> Any:
    if name == "TableDataset":
        from .dataset import TableDataset

        return TableDataset
    raise AttributeError(f"module 'airfs.tables' has no attribute {name!r}")
