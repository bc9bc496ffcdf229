"""Tables in volumes: Parquet and Delta tables read as pyarrow tables, a rank-sharded resumable
dataset of their rows, and exports into Parquet files; by path or by ``catalog.schema.table``
name (resolved through the mount's catalog, ``SELECT``/``MODIFY`` checked); and
:func:`spark_table` for a Spark session. Needs the ``tables`` extra (pyarrow, deltalake);
:class:`TableDataset` also needs torch, :func:`spark_table` pyspark.

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
from .source import registered as registered
from .source import resolve as resolve
from .spark import spark_table as spark_table

__all__ = [
    "ExportResult",
    "ExportedFile",
    "TableDataset",
    "TableError",
    "TableSource",
    "delta_write_options",
    "export_table",
    "read_table",
    "registered",
    "resolve",
    "spark_table",
]


def __getattr__(name: str) -> Any:
    if name == "TableDataset":
        from .dataset import TableDataset

        return TableDataset
    raise AttributeError(f"module 'airfs.tables' has no attribute {name!r}")
