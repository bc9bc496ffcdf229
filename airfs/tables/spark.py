"""A table by name for a Spark session: :func:`spark_table`.

Spark's own Delta reader (the ``delta-spark`` jars) is not available here, and the catalog is
not Spark's; so the table is resolved by airfs (name → location, ``SELECT`` checked, the
registered format; a Delta table's *active* files at a version, from its log, by deltalake)
and Spark reads those Parquet files through the mount, with the table's partition values
added as columns. What Spark would read wrongly from the files alone is refused with a
:class:`~airfs.tables.source.TableError`: deletion vectors (Spark would return the deleted
rows) and column mapping (the files' column names are not the table's).
"""

from __future__ import annotations

import os
from collections import defaultdict
from typing import Any

import pyarrow as pa

from .source import TableError, resolve


def spark_table(
    spark: Any,
    name: str,
    *,
    version: int | None = None,
    root: str | os.PathLike[str] | None = None,
) -> Any:
    """A ``pyspark.sql.DataFrame`` of table ``name`` (a ``catalog.schema.table`` name resolved
    through the mount at ``root``, default ``$AIRFS_VOLUMES`` or ``/Volumes``; or a path
    :func:`~airfs.tables.source.resolve` takes), with the table's columns in its order. Works
    with classic and Spark Connect sessions. Raises ``PermissionError`` without ``SELECT``,
    :class:`TableError` for what cannot be read faithfully."""
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import from_arrow_schema

    src = resolve(name, version=version, root=root)
    if src.info.get("deletion_vectors"):
        raise TableError(
            f"{name}: {src.info['deletion_vectors']} file(s) have Delta deletion vectors, which "
            "Spark reading the Parquet files would ignore (returning deleted rows); read it "
            "with airfs.tables.read_table or TableDataset (they apply them), or purge them "
            "(REORG TABLE ... APPLY (PURGE)) first"
        )
    parts = list(src.info.get("partition_columns") or [])
    file_schema = pa.schema([f for f in src.schema if f.name not in parts])
    spark_schema = from_arrow_schema(src.schema)
    types = {f.name: f.dataType for f in spark_schema.fields}
    if not src.files:
        return spark.createDataFrame([], spark_schema)
    groups: dict[tuple[tuple[str, Any], ...], list[str]] = defaultdict(list)
    for f in src.files:
        key = tuple((k, None if v is None else v.as_py()) for k, v in f.partition)
        groups[key].append(f.path)
    reader = spark.read.schema(from_arrow_schema(file_schema))
    frames = []
    for key, paths in sorted(groups.items(), key=lambda kv: repr(kv[0])):
        df = reader.parquet(*paths)
        for col, value in key:
            df = df.withColumn(col, F.lit(value).cast(types[col]))
        frames.append(df.select(*src.schema.names))
    out = frames[0]
    for df in frames[1:]:
        out = out.unionByName(df)
    return out
