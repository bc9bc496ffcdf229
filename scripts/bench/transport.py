#!/usr/bin/env python3
"""Kernel transport vs pyfuse3 adapter, side by side in one run (rounds interleaved A/B).

Over a directory origin (page-cached, so the transport and the core are what is measured):

* small files: open + read + close of every one of ``--files`` cached files (1 and 8 threads);
* stat: ``os.stat`` of every file within the TTL (the kernel answers) and after it expired
  (each one a LOOKUP through the daemon);
* create + write + close of ``--writes`` new 16 KiB files (until close returns);
* cached sequential read of a ``--size-mib`` file whose bytes are in airfs's cache, the mount's
  page cache dropped for that file before each pass (``posix_fadvise(DONTNEED)``);
* the same operations straight on the origin directory, as the local-disk baseline.

Each figure is the median of ``--rounds``. Small sizes by default: the machine is shared.

    .venv/bin/python scripts/bench/transport.py --out /tmp/transport.md  # fold into docs/
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from airfs.testing.mountfix import mounted

MiB = 1 << 20
TRANSPORTS = ("kernel", "pyfuse3")


def make_tree(root: Path, n: int, size: int, big_mib: int) -> None:
    (root / "small").mkdir(parents=True, exist_ok=True)
    blob = os.urandom(size)
    for i in range(n):
        (root / "small" / f"f{i:05d}").write_bytes(blob)
    chunk = os.urandom(16 * MiB)
    with open(root / "big.bin", "wb") as f:
        for _ in range(max(1, big_mib // 16)):
            f.write(chunk)


def read_all(paths: list[Path], threads: int) -> float:
    """Files per second for open/read/close of every path."""

    def work(part: list[Path]) -> None:
        for p in part:
            with open(p, "rb", buffering=0) as f:
                while f.read(1 << 20):
                    pass

    parts = [paths[i::threads] for i in range(threads)]
    t0 = time.perf_counter()
    ts = [threading.Thread(target=work, args=(p,)) for p in parts]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return len(paths) / (time.perf_counter() - t0)


def stat_all(paths: list[Path]) -> float:
    t0 = time.perf_counter()
    for p in paths:
        os.stat(p)
    return len(paths) / (time.perf_counter() - t0)


def seq_read(path: Path) -> float:
    """MiB/s of one sequential pass, the file's page cache dropped first."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        n = 0
        t0 = time.perf_counter()
        while chunk := os.read(fd, MiB):
            n += len(chunk)
        return n / MiB / (time.perf_counter() - t0)
    finally:
        os.close(fd)


def write_files(d: Path, n: int, size: int) -> float:
    """Files per second for create + write + close of ``n`` new files."""
    d.mkdir()
    blob = os.urandom(size)
    t0 = time.perf_counter()
    for i in range(n):
        fd = os.open(d / f"w{i:05d}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        os.write(fd, blob)
        os.close(fd)
    return n / (time.perf_counter() - t0)


def measure(root: Path, ttl: float, tag: str, writes: int) -> dict[str, float]:
    small = sorted((root / "small").iterdir())
    out = {
        "open/read/close, 1 thread (files/s)": read_all(small, 1),
        "open/read/close, 8 threads (files/s)": read_all(small, 8),
    }
    time.sleep(ttl + 0.2)
    out["stat after the TTL expired (stats/s)"] = stat_all(small)
    out["stat within the TTL (stats/s)"] = stat_all(small)  # right after: entries are fresh
    out["cached sequential read (MiB/s)"] = seq_read(root / "big.bin")
    out["create + 16 KiB write + close (files/s)"] = write_files(root / tag, writes, 16 << 10)
    return out


def warm(root: Path) -> None:
    """Read everything once so that airfs's cache holds it."""
    read_all(sorted((root / "small").iterdir()), 8)
    with open(root / "big.bin", "rb") as f:
        while f.read(8 * MiB):
            pass


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--files", type=int, default=2000)
    ap.add_argument("--file-kib", type=int, default=16)
    ap.add_argument("--size-mib", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--writes", type=int, default=500, help="files created per round")
    ap.add_argument("--ttl", type=float, default=1.0)
    ap.add_argument("--work", default=None, help="scratch directory (default: a temp dir)")
    ap.add_argument("--out", default=None, help="write the markdown table here")
    args = ap.parse_args()
    work = Path(args.work or tempfile.mkdtemp(prefix="airfs-transport-"))
    origin = work / "origin"
    make_tree(origin, args.files, args.file_kib << 10, args.size_mib)
    results: dict[str, dict[str, list[float]]] = {"local": {}, **{t: {} for t in TRANSPORTS}}
    negotiated = ""

    def add(who: str, figures: dict[str, float]) -> None:
        for k, v in figures.items():
            results[who].setdefault(k, []).append(v)

    for rnd in range(args.rounds):
        add("local", measure(origin, 0.0, f"w-local-{rnd}", args.writes))
        order = TRANSPORTS if rnd % 2 == 0 else TRANSPORTS[::-1]
        for t in order:
            mp, cache = work / f"mnt-{t}", work / f"cache-{t}"
            mp.mkdir(exist_ok=True)
            with mounted(str(origin), mp, cache, "--fuse", t, "--ttl", str(args.ttl)) as m:
                if rnd == 0:
                    warm(mp)
                add(t, measure(mp, args.ttl, f"w-{t}-{rnd}", args.writes))
                fuse = m.status().get("fuse") or {}
                if t == "kernel" and fuse.get("protocol"):
                    negotiated = (
                        f"FUSE {fuse['protocol']}, max_write {fuse['max_write'] >> 10} KiB, "
                        f"passthrough {'on' if fuse['passthrough'] else 'off'}; "
                        + " ".join(fuse["flags"])
                    )
        print(f"round {rnd + 1}/{args.rounds} done", flush=True)

    med: Callable[[list[float]], float] = statistics.median
    lines = [
        f"Run {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: {args.files} x "
        f"{args.file_kib} KiB files, a {args.size_mib} MiB file, ttl {args.ttl} s, median of "
        f"{args.rounds} interleaved rounds. Kernel transport: {negotiated or 'n/a'}.",
        "",
        "| scenario | local disk | kernel | pyfuse3 | kernel / pyfuse3 | kernel / local |",
        "|---|---|---|---|---|---|",
    ]
    for k in results["local"]:
        loc, ker, py = (med(results[w][k]) for w in ("local", "kernel", "pyfuse3"))
        lines.append(
            f"| {k} | {loc:,.0f} | {ker:,.0f} | {py:,.0f} | {ker / py:.2f}x | {ker / loc:.2f}x |"
        )
    table = "\n".join(lines)
    print(table)
    if args.out:
        Path(args.out).write_text(
            "# Transport benchmarks (`scripts/bench/transport.py`)\n\n" + table + "\n"
        )
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
