"""Source resolution: what a ``source`` argument of :mod:`airfs.tables` names, as a list of
Parquet data files with everything needed to read them the same way in every process.

A source is one of:

* a **Delta table**: a directory with a ``_delta_log/`` (or a ``deltalake.DeltaTable``). Its
  *active* files at one version are read from the log by deltalake; partition values become
  columns; deletion vectors are applied (deltalake exposes them as row masks); tables with
  column mapping are refused (:class:`TableError`).
* a **Parquet directory**: every ``*.parquet`` file under it, recursively, sorted (names that
  start with ``_`` or ``.`` are skipped, as Spark and Hive do); Hive-style ``key=value``
  directories (Spark's ``partitionBy``) become columns. If it holds a ``_SUCCESS``
  manifest written by :func:`airfs.tables.export_table`, exactly the files it lists; if it holds
  a ``_temporary/`` directory and no ``_SUCCESS``, it is a write in progress or one that died
  midway, and is refused.
* a **Parquet file**, a **glob** (``/Volumes/.../*.parquet``) or a **list** of files.
* a ``catalog.schema.table`` **name** registered in the catalog of the airfs mount at ``root``
  (``$AIRFS_VOLUMES``, else ``/Volumes``): resolved by its daemon (:mod:`.names`), ``SELECT``
  checked (a ``PermissionError`` naming it), then read as its registered format (a ``DELTA``
  table from its log, a ``PARQUET`` table as a Parquet directory) from its location on the
  mount.

Every data file's path is absolute and local: on an airfs mount the mount's own path.
"""

from __future__ import annotations

import glob as globlib
import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from ..control import client
from . import names

SUCCESS = "_SUCCESS"
TEMPORARY = "_temporary"
MANIFEST_FORMAT = "airfs-export-1"

def delta_write_options(path: str | os.PathLike[str]) -> dict[str, str]:
    """``storage_options`` for ``deltalake.write_deltalake`` (and other deltalake writes) of the
    table at ``path``: none are needed any more, on a mount or elsewhere (an empty dict; kept so
    that code written for earlier versions keeps running). deltalake commits each version with
    ``link(tmp, NNN.json)``, which the mount does as a real hard link on a POSIX origin and as
    an atomic create-if-absent copy on S3: two writers racing for a version on any nodes get
    one winner and one EEXIST (then a retry at the next version), never a lost commit."""
    del path
    return {}


class TableError(ValueError):
    """A source that cannot be read as asked: not found, not a table, incomplete, or a Delta
    feature that is not supported. The message says which and why."""


@dataclass(frozen=True)
class DataFile:
    """One Parquet file of a source.

    ``partition`` holds the partition values that are not stored in the file (Delta), already
    typed; ``keep`` is the deletion vector as a row mask (True: the row is live), or None."""

    path: str
    size: int
    partition: tuple[tuple[str, Any], ...] = ()
    keep: Any = None  # numpy bool array, or None

    def partition_expression(self) -> pc.Expression:
        expr = pc.scalar(True)
        for name, value in self.partition:
            term = pc.field(name).is_null() if value is None else pc.field(name) == value
            expr = expr & term
        return expr


@dataclass(frozen=True)
class TableSource:
    """A resolved source: its data files in a fixed order and the schema they are read with."""

    kind: str  # "parquet" or "delta"
    root: str
    files: tuple[DataFile, ...]
    schema: pa.Schema
    version: int | None = None  # the Delta version read
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def fingerprint(self) -> str:
        """A digest of the version and of every file's path, size, partition and mask: equal
        for the same data, different once the table changes."""
        h = hashlib.sha256(f"{self.kind}:{self.version}".encode())
        for f in self.files:
            rel = os.path.relpath(f.path, self.root) if self.root else f.path
            h.update(f"\0{rel}\0{f.size}\0{f.partition!r}".encode())
            if f.keep is not None:
                h.update(f.keep.tobytes())
        return h.hexdigest()[:24]

    @property
    def mountpoint(self) -> str | None:
        """The airfs mount the files are on, or None."""
        return client.find_mount(self.files[0].path) if self.files else None


def resolve(
    source: Any, *, version: int | None = None, root: str | os.PathLike[str] | None = None
) -> TableSource:
    """The :class:`TableSource` that ``source`` names (see the module doc). ``version`` picks a
    Delta table's version (default: the latest) and is refused for Parquet sources. ``root``:
    the mount table names resolve through (default ``$AIRFS_VOLUMES``, else ``/Volumes``)."""
    if isinstance(source, TableSource):
        return source
    if _is_delta_table_object(source):
        return _resolve_delta(source, version)
    if isinstance(source, Sequence) and not isinstance(source, str | bytes):
        paths = [os.path.abspath(os.fspath(p)) for p in source]
        if not paths:
            raise TableError("the list of Parquet files is empty")
        _no_version(version, "a list of Parquet files")
        return _resolve_files(os.path.commonpath(paths), paths)
    if not isinstance(source, str | os.PathLike):
        raise TypeError(
            f"a table source is a path, a glob, a list of paths or a DeltaTable, "
            f"not {type(source).__name__}"
        )
    text = os.fspath(source)
    if names.is_name(text) and not os.path.exists(text):
        return resolve_name(text, version=version, root=root)
    path = os.path.abspath(text)
    if any(c in text for c in "*?["):
        found = sorted(p for p in globlib.glob(path, recursive=True) if os.path.isfile(p))
        if not found:
            raise TableError(f"{text}: no file matches")
        _no_version(version, "a glob")
        for d in sorted({os.path.dirname(p) for p in found}):
            _refuse_in_progress(d)
        return _resolve_files(os.path.commonpath([os.path.dirname(p) for p in found]), found)
    if not os.path.exists(path):
        raise TableError(f"{text}: no such file or directory")
    if os.path.isdir(os.path.join(path, "_delta_log")):
        import deltalake

        try:
            dt = deltalake.DeltaTable(path, version=version)
        except Exception as exc:  # deltalake raises its own types
            raise TableError(f"{text}: cannot open the Delta table: {exc}") from None
        return _resolve_delta(dt, version)
    _no_version(version, "a Parquet source")
    if os.path.isfile(path):
        return _resolve_files(os.path.dirname(path), [path])
    return _resolve_files(path, _parquet_dir_files(path))


def registered(
    name: str, *, root: str | os.PathLike[str] | None = None, access: str = "read"
) -> names.Registered:
    """Table ``name`` as the catalog of the mount at ``root`` shows it (``access`` ``"read"``
    needs SELECT, ``"write"`` MODIFY: ``PermissionError``); :class:`TableError` when it cannot
    be resolved."""
    try:
        return names.lookup(name, root=root, access=access)
    except names.UnresolvedName as exc:
        raise TableError(str(exc)) from None


def resolve_name(
    name: str, *, version: int | None = None, root: str | os.PathLike[str] | None = None
) -> TableSource:
    """The source of registered table ``name`` (SELECT checked), read as its format."""
    reg = registered(name, root=root)
    info = {"table": name, "table_type": reg.table_type}
    if reg.data_source_format == "DELTA":
        if not os.path.isdir(os.path.join(reg.path, "_delta_log")):
            raise TableError(
                f"table {name} (DELTA, {reg.path}) has no Delta log yet: nothing was written"
            )
        import deltalake

        try:
            dt = deltalake.DeltaTable(reg.path, version=version)
        except Exception as exc:  # deltalake raises its own types
            raise TableError(f"table {name}: cannot open the Delta table: {exc}") from None
        src = _resolve_delta(dt, version)
    else:
        _no_version(version, f"table {name} (PARQUET)")
        src = _resolve_files(reg.path, _parquet_dir_files(reg.path))
    return TableSource(src.kind, src.root, src.files, src.schema, src.version,
                       {**src.info, **info})  # fmt: skip


def _no_version(version: int | None, what: str) -> None:
    if version is not None:
        raise TableError(f"version= is for Delta tables, not for {what}")


def _is_delta_table_object(obj: Any) -> bool:
    return type(obj).__name__ == "DeltaTable" and hasattr(obj, "get_add_actions")


def _parquet_dir_files(root: str) -> list[str]:
    """The data files of a Parquet directory (manifest, in-progress and hidden rules)."""
    _refuse_in_progress(root)
    listed = read_manifest(root)
    if listed is not None:
        return listed
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(("_", ".")))
        for name in filenames:
            if name.endswith(".parquet") and not name.startswith(("_", ".")):
                out.append(os.path.join(dirpath, name))
    out.sort()
    if not out:
        raise TableError(f"{root}: no Parquet files (*.parquet) in this directory")
    return out


def _refuse_in_progress(root: str) -> None:
    """TableError if ``root`` holds a write in progress (``_temporary/``, no ``_SUCCESS``)."""
    if os.path.isdir(os.path.join(root, TEMPORARY)) and not os.path.isfile(
        os.path.join(root, SUCCESS)
    ):
        raise TableError(
            f"{root}: has {TEMPORARY}/ and no {SUCCESS}: a write in progress, or one that died "
            "midway; it is not read (finish or redo the export)"
        )


def read_manifest(root: str) -> list[str] | None:
    """The files listed by an airfs export's ``_SUCCESS`` manifest, or None when ``_SUCCESS`` is
    not an airfs manifest (Spark writes an empty one). TableError if a listed file is missing."""
    try:
        with open(os.path.join(root, SUCCESS), encoding="utf-8") as f:
            text = f.read()
    except OSError:
        return None
    if not text.strip():
        return None
    try:
        doc = json.loads(text)
    except ValueError:
        return None
    if not isinstance(doc, dict) or doc.get("format") != MANIFEST_FORMAT:
        return None
    paths = [os.path.join(root, f["name"]) for f in doc["files"]]
    missing = [p for p in paths if not os.path.isfile(p)]
    if missing:
        raise TableError(
            f"{root}: {len(missing)} files listed in {SUCCESS} are missing, e.g. {missing[0]}"
        )
    return paths


def _resolve_files(root: str, paths: list[str]) -> TableSource:
    import pyarrow.parquet as pq

    for p in paths:
        if not os.path.isfile(p):
            raise TableError(f"{p}: no such file")
    try:
        schema = pq.read_schema(paths[0])
    except (OSError, pa.ArrowException) as exc:
        raise TableError(f"{paths[0]}: not a Parquet file ({exc})") from None
    parts = _hive_partitions(root, paths)
    for name, typ in parts[1]:
        if name not in schema.names:
            schema = schema.append(pa.field(name, typ))
    files = tuple(
        DataFile(p, os.path.getsize(p), values) for p, values in zip(paths, parts[0], strict=True)
    )
    info = {"partition_columns": [n for n, _ in parts[1]]}
    return TableSource("parquet", root, files, schema, info=info)


_HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"


def _hive_partitions(
    root: str, paths: list[str]
) -> tuple[list[tuple[tuple[str, Any], ...]], list[tuple[str, pa.DataType]]]:
    """Hive-style partition values (``key=value`` directories under ``root``, as Spark's and
    pyarrow's partitioned writes make) of every file, typed: int64 when every value is an
    integer, else string. None when the files do not all have the same keys."""
    from urllib.parse import unquote

    keyed: list[list[tuple[str, str]]] = []
    for p in paths:
        rel_dir = os.path.relpath(os.path.dirname(p), root)
        comps = [] if rel_dir == "." else rel_dir.split(os.sep)
        pairs = [tuple(c.split("=", 1)) for c in comps if "=" in c]
        keyed.append([(unquote(k), unquote(v)) for k, v in pairs])
    keys = [k for k, _ in keyed[0]] if keyed else []
    if not keys or any([k for k, _ in kv] != keys for kv in keyed):
        return [() for _ in paths], []
    types: list[tuple[str, pa.DataType]] = []
    for i, k in enumerate(keys):
        values = [kv[i][1] for kv in keyed if kv[i][1] != _HIVE_NULL]
        is_int = all(v.lstrip("-").isdigit() for v in values)
        types.append((k, pa.int64() if is_int else pa.string()))
    typed = [
        tuple(
            (k, None if v == _HIVE_NULL else pa.scalar(int(v) if t == pa.int64() else v, t))
            for (k, v), (_, t) in zip(kv, types, strict=True)
        )
        for kv in keyed
    ]
    return typed, types


def _resolve_delta(dt: Any, version: int | None) -> TableSource:
    if version is not None and dt.version() != version:
        dt.load_as_version(version)
    root = dt.table_uri
    root = root[len("file://") :] if root.startswith("file://") else root
    root = root.rstrip("/") or "/"
    if "://" in root:
        raise TableError(f"{root}: only Delta tables at a local path (or on a mount) are read")
    config = dt.metadata().configuration or {}
    mode = config.get("delta.columnMapping.mode", "none")
    if mode != "none":
        raise TableError(f"{root}: Delta column mapping (mode {mode!r}) is not supported")
    schema = pa.schema(dt.schema().to_arrow())
    adds = pa.table(dt.get_add_actions(flatten=True))
    masks = _deletion_vectors(dt, root)
    part_cols = list(dt.metadata().partition_columns)
    rows = adds.to_pylist()
    files = []
    for row in sorted(rows, key=lambda r: r["path"]):
        path = os.path.join(root, _unquote(row["path"]))
        parts = tuple(
            (name, _typed(row.get(f"partition.{name}"), schema.field(name).type))
            for name in part_cols
        )
        files.append(DataFile(path, int(row["size_bytes"]), parts, masks.get(path)))
    return TableSource(
        "delta",
        root,
        tuple(files),
        schema,
        int(dt.version()),
        {"partition_columns": part_cols, "deletion_vectors": len(masks)},
    )


def _unquote(rel: str) -> str:
    from urllib.parse import unquote

    return unquote(rel)


def _typed(value: Any, typ: pa.DataType) -> Any:
    if value is None:
        return None
    if isinstance(value, str) and not pa.types.is_string(typ):
        return pa.scalar(value).cast(typ)
    return pa.scalar(value, typ)


def _deletion_vectors(dt: Any, root: str) -> dict[str, Any]:
    """``{absolute path: keep mask}`` for every active file that has a deletion vector."""
    import numpy as np

    protocol = dt.protocol()
    if "deletionVectors" not in (protocol.reader_features or []):
        return {}
    try:
        reader = dt.deletion_vectors()
    except Exception as exc:  # an older deltalake, or a vector it cannot read
        raise TableError(
            f"{root}: the table has deletion vectors and deltalake cannot expose "
            f"them ({exc}); it is not read"
        ) from None
    out = {}
    for batch in pa.table(reader).to_batches():
        for uri, mask in zip(
            batch.column("filepath").to_pylist(),
            batch.column("selection_vector").to_pylist(),
            strict=True,
        ):
            p = uri[len("file://") :] if uri.startswith("file://") else uri
            out[_unquote(p)] = np.asarray(mask, dtype=bool)
    return out
