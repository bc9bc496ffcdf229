#!/usr/bin/env python3
"""Benchmark: tables in volumes (``airfs.tables``).

    .venv/bin/python scripts/bench/tables_bench.py [--size-mib 2048] [--work DIR] [--md OUT.md]

Makes a table of about ``--size-mib`` MiB (an id, 16 float32 features, a label, a 48-byte
string), then measures:

1. **export_table**, MiB/s of Parquet written: into an airfs mount (the call returns when the
   files are staged: local-disk speed), into a local directory, against a plain
   ``pyarrow.parquet.write_table`` of the same data to local disk.
2. **Reading the export**, rows/s and MiB/s (Parquet bytes): ``TableDataset`` (batches of
   8192 rows, NumPy, shuffled) through an airfs mount of the export's directory with emulated
   origin latency (``--latency``, ``--bandwidth``), **cold** (new cache) and **cached** (second
   epoch); against pyarrow reading the same files from local disk (page cache warm: the limit),
   the origin's raw parallel read (16 threads x 8 MiB ranges through the same latency origin:
   the limit of a cold read), ``TableDataset`` over the local files, and Hugging Face
   ``datasets`` streaming the same files through the mount.

Targets (issue 15): cached >= 0.8x pyarrow on local disk; cold >= 0.8x the origin's raw
parallel read. The machine is shared: each number is the median of ``--reps`` runs.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from airfs.origin.latency import LatencyOrigin  # noqa: E402
from airfs.origin.posix import PosixOrigin  # noqa: E402
from airfs.tables import TableDataset, export_table  # noqa: E402
from airfs.testing import mountfix  # noqa: E402

MiB = 1 << 20
ROW_BYTES = 8 + 16 * 4 + 4 + 48 + 4  # in memory, with the string offsets


def make_table(rows: int, seed: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed)
    cols: dict[str, pa.Array] = {"id": pa.array(np.arange(rows, dtype=np.int64))}
    for i in range(16):
        cols[f"f{i}"] = pa.array(rng.standard_normal(rows, dtype=np.float32))
    cols["label"] = pa.array(rng.integers(0, 1000, rows, dtype=np.int32))
    hexes = rng.integers(0, 1 << 62, rows).astype("U16")
    cols["text"] = pa.array(np.char.add("sample-text-padding-to-48-bytes-", hexes))
    return pa.table(cols)


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def timed(fn: Callable[[], object], reps: int) -> list[float]:
    out = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


@contextlib.contextmanager
def mounted(origin: Path, mp: Path, cache: Path, *args: str) -> Iterator[Path]:
    if cache.exists():
        shutil.rmtree(cache)
    origin.mkdir(parents=True, exist_ok=True)
    mp.mkdir(parents=True, exist_ok=True)
    m = mountfix.mount(str(origin), mp, cache, *args, timeout=120)
    try:
        yield mp
    finally:
        mountfix.teardown(m)


def dataset_pass(root: Path, shuffle: bool = True, mount_prefetch: bool = True) -> int:
    ds = TableDataset(root, batch_rows=8192, shuffle=shuffle, mount_prefetch=mount_prefetch)
    n = 0
    for batch in ds:
        n += len(batch["id"])
    return n


def pyarrow_pass(files: list[str]) -> int:
    n = 0
    for f in files:
        pf = pq.ParquetFile(f)
        for rg in range(pf.num_row_groups):
            n += pf.read_row_group(rg).num_rows
    return n


def hf_stream_pass(files: list[str], cache: Path) -> int:
    from datasets import load_dataset

    ds = load_dataset("parquet", data_files=files, split="train", streaming=True,
                      cache_dir=str(cache))  # fmt: skip
    n = 0
    for batch in ds.iter(batch_size=8192):
        n += len(batch["id"])
    return n


def origin_parallel_read(origin: LatencyOrigin, rels: list[str], threads: int = 16) -> int:
    jobs = []
    for rel in rels:
        size = origin.stat(rel).size
        jobs += [(rel, off, min(8 * MiB, size - off)) for off in range(0, size, 8 * MiB)]
    with ThreadPoolExecutor(threads) as ex:
        return sum(ex.map(lambda j: len(origin.read_range(*j)), jobs))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    ap.add_argument("--size-mib", type=int, default=2048)
    ap.add_argument("--work", type=Path, default=Path("/tmp/airfs-tables-bench"))
    ap.add_argument("--latency", type=float, default=0.01)
    ap.add_argument("--bandwidth", default=None, help="e.g. 400M (origin bandwidth cap)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--md", type=Path, default=None, help="write the result table here")
    a = ap.parse_args()
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    work = a.work
    if work.exists():
        shutil.rmtree(work)
    (work / "local").mkdir(parents=True)
    rows = a.size_mib * MiB // ROW_BYTES
    print(f"table: {rows:,} rows (~{a.size_mib} MiB in memory)", flush=True)
    table = make_table(rows)
    target = max(16 * MiB, a.size_mib * MiB // 4)  # 4+ files at any size
    rg = min(128 * MiB, target // 4)
    out: list[tuple[str, str, str]] = []

    # 1. export
    rg_rows = max(1, rg // ROW_BYTES)
    plain = timed(
        lambda: pq.write_table(table, work / "local" / "plain.parquet", row_group_size=rg_rows),
        a.reps,
    )
    pbytes = os.path.getsize(work / "local" / "plain.parquet")
    local_runs = []
    for _ in range(a.reps):
        r = export_table(table, work / "local" / "export", target_file_bytes=target,
                         row_group_bytes=rg, overwrite=True, progress=False)  # fmt: skip
        local_runs.append(r.seconds)
    ebytes = r.bytes
    files_rel = [os.path.basename(p) for p in r.paths]
    origin_dir = work / "origin"
    shutil.copytree(work / "local" / "export", origin_dir / "export")
    mount_runs = []
    lat = ["--emulate-latency", str(a.latency)]
    if a.bandwidth:
        lat += ["--emulate-bandwidth", a.bandwidth]
    with mounted(work / "origin-w", work / "mnt-w", work / "cache-w", *lat) as mp:
        for i in range(a.reps):
            r2 = export_table(table, mp / f"export{i}", target_file_bytes=target,
                              row_group_bytes=rg, progress=False)  # fmt: skip
            mount_runs.append(r2.seconds)
    base = pbytes / MiB / median(plain)
    for name, runs in (("export_table into an airfs mount (staged)", mount_runs),
                       ("export_table to local disk", local_runs)):  # fmt: skip
        speed = ebytes / MiB / median(runs)
        out.append((name, f"{speed:,.0f} MiB/s", f"{speed / base:.2f}x pyarrow write"))
    out.append(("pyarrow write_table to local disk (baseline)", f"{base:,.0f} MiB/s", "1.00x"))

    # 2. reads
    local_files = [str(work / "local" / "export" / f) for f in files_rel]
    pyarrow_pass(local_files)  # page cache warm
    t_pa = timed(lambda: pyarrow_pass(local_files), a.reps)
    t_local_ds = timed(lambda: dataset_pass(work / "local" / "export"), a.reps)
    lo = LatencyOrigin(PosixOrigin(str(origin_dir)), a.latency,
                       _parse_size(a.bandwidth) if a.bandwidth else None)  # fmt: skip
    t_raw = timed(lambda: origin_parallel_read(lo, [f"export/{f}" for f in files_rel]), a.reps)
    cold, cached, hf, cold_plain, cold_pf = [], [], [], [], []
    for _ in range(a.reps):
        with mounted(origin_dir, work / "mnt-r", work / "cache-r", *lat) as mp:
            cold.append(timed(lambda mp=mp: dataset_pass(mp / "export"), 1)[0])
            cached.append(timed(lambda mp=mp: dataset_pass(mp / "export"), 1)[0])
            hf.append(timed(lambda mp=mp: hf_stream_pass(
                [str(mp / "export" / f) for f in files_rel], work / "hf"), 1)[0])  # fmt: skip
        with mounted(origin_dir, work / "mnt-r", work / "cache-r", *lat) as mp:
            cold_plain.append(timed(lambda mp=mp: dataset_pass(mp / "export", False), 1)[0])
        with mounted(origin_dir, work / "mnt-r", work / "cache-r", *lat) as mp:
            cold_pf.append(timed(lambda mp=mp: dataset_pass(mp / "export", True, False), 1)[0])
    mib = ebytes / MiB

    def row(name: str, secs: list[float], ref: float | None, ref_name: str) -> None:
        s = median(secs)
        ratio = f"{mib / s / ref:.2f}x {ref_name}" if ref else "-"
        out.append((name, f"{rows / s:,.0f} rows/s, {mib / s:,.0f} MiB/s", ratio))

    pa_speed = mib / median(t_pa)
    raw_speed = mib / median(t_raw)
    row("TableDataset through airfs, cached (2nd epoch)", cached, pa_speed, "pyarrow local")
    row("TableDataset through airfs, cold", cold, raw_speed, "origin raw parallel read")
    row("TableDataset through airfs, cold, shuffle=False", cold_plain, raw_speed,
        "origin raw parallel read")  # fmt: skip
    row("TableDataset through airfs, cold, mount_prefetch=False", cold_pf, raw_speed,
        "origin raw parallel read")  # fmt: skip
    row("TableDataset over the local files", t_local_ds, pa_speed, "pyarrow local")
    row("HF datasets streaming through airfs (cached)", hf, pa_speed, "pyarrow local")
    row("pyarrow reading the local files (the limit)", t_pa, None, "")
    row("origin raw parallel read (16 x 8 MiB ranges)", t_raw, None, "")
    lines = [
        f"Size: {mib:,.0f} MiB of Parquet ({len(files_rel)} files, {rows:,} rows); origin latency"
        f" {a.latency * 1000:g} ms{', bandwidth ' + a.bandwidth if a.bandwidth else ''}; "
        f"median of {a.reps}.",
        "",
        "| measurement | result | ratio |",
        "| --- | --- | --- |",
        *[f"| {n} | {v} | {r} |" for n, v, r in out],
    ]
    text = "\n".join(lines)
    print(text)
    if a.md:
        a.md.write_text(text + "\n")
    shutil.rmtree(work, ignore_errors=True)
    return 0


def _parse_size(s: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(float(s[:-1]) * units[s[-1].upper()]) if s[-1].upper() in units else int(s)


if __name__ == "__main__":
    sys.exit(main())
