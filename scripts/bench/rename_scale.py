"""Rename and create latency in the core as the number of known inodes and staged files grows.

    PYTHONPATH=. python scripts/bench/rename_scale.py [INODES:STAGED ...]
    # default: 1000:1000 90000:1000 1000:15000 90000:15000

For each pair: a core (``airfs.daemon.build``, no kernel) over a POSIX origin on tmpfs. First
INODES files are created (and closed) in 100 directories and committed; each keeps its
kernel lookup count, so the inode table knows INODES nodes. Then the origin's puts are held
back and STAGED more files are created: they stay staged (pending). Timed one by one on the
trio loop: renames of a staged file and of a committed file within their directory, creates
of new files, and renames of whole directories (with their files). Prints median and 90th
percentile in milliseconds. (Every staged file holds a descriptor, as in the daemon, so
STAGED is bounded by ``ulimit -n``.) Numbers go to docs/benchmarks.md.
"""

from __future__ import annotations

import os
import resource
import statistics
import sys
import tempfile
import threading
import time
from typing import Any

from airfs.core.inodes import ROOT_INO
from airfs.daemon.build import Built
from airfs.origin.base import Entry
from airfs.origin.posix import PosixOrigin
from airfs.testing.corehost import CoreHost

DIRS = 100
SAMPLES = 200


class GatedOrigin(PosixOrigin):
    """A POSIX origin whose puts wait while ``gate`` is clear (commits held back)."""

    def __init__(self, root: str) -> None:
        super().__init__(root)
        self.gate = threading.Event()
        self.gate.set()

    def put(self, *args: Any, **kwargs: Any) -> Entry:
        self.gate.wait()
        return super().put(*args, **kwargs)


async def create_files(b: Built, dirs: list[int], prefix: str, n: int) -> None:
    for i in range(n):
        name = f"{prefix}{i:06d}"
        fh, _ = await b.fs.create(dirs[i % DIRS], name, 0o644, os.O_WRONLY | os.O_CREAT)
        await b.fs.release(fh)


async def populate(b: Built, n: int) -> list[int]:
    dirs = [(await b.fs.mkdir(ROOT_INO, f"d{i:02d}", 0o755)).ino for i in range(DIRS)]
    await create_files(b, dirs, "f", n)
    await b.uploader.flush("")
    return dirs


async def timed(out: list[float], coro: Any) -> None:
    t = time.perf_counter()
    await coro
    out.append(time.perf_counter() - t)


async def measure(b: Built, dirs: list[int], staged: int) -> dict[str, list[float]]:
    """(The first staged files are being uploaded, held at the origin: a rename of those
    would wait for their upload. The names timed here are queued or committed ones.)"""
    out: dict[str, list[float]] = {
        "rename (staged file)": [],
        "rename (committed file)": [],
        "create": [],
        "rename dir": [],
    }
    last = staged - 1
    ds, dc = dirs[last % DIRS], dirs[DIRS - 1]
    for k in range(SAMPLES):  # s... -> r0 -> s... -> ...
        src, dst = (f"s{last:06d}", "r0") if k % 2 == 0 else ("r0", f"s{last:06d}")
        await timed(out["rename (staged file)"], b.fs.rename(ds, src, ds, dst))
        src, dst = (f"f{DIRS - 1:06d}", "r1") if k % 2 == 0 else ("r1", f"f{DIRS - 1:06d}")
        await timed(out["rename (committed file)"], b.fs.rename(dc, src, dc, dst))
    new = (await b.fs.mkdir(ROOT_INO, "new", 0o755)).ino

    async def create(k: int) -> None:
        fh, _ = await b.fs.create(new, f"c{k:04d}", 0o644, os.O_WRONLY | os.O_CREAT)
        await b.fs.release(fh)

    for k in range(SAMPLES):
        await timed(out["create"], create(k))
    for k in range(50, 70):
        await timed(out["rename dir"], b.fs.rename(ROOT_INO, f"d{k:02d}", ROOT_INO, f"e{k:02d}"))
    return out


def run(inodes: int, staged: int) -> dict[str, list[float]]:
    with tempfile.TemporaryDirectory() as cache, tempfile.TemporaryDirectory(dir="/dev/shm") as o:
        origin = GatedOrigin(o)
        host = CoreHost(origin, cache, staging_size=1 << 40, attempts=5)
        try:
            t = time.perf_counter()
            dirs = host.call(lambda b: populate(b, inodes), timeout=3600)
            print(f"  {inodes} files created and committed in {time.perf_counter() - t:.1f} s")
            origin.gate.clear()
            t = time.perf_counter()
            host.call(lambda b: create_files(b, dirs, "s", staged), timeout=3600)
            print(f"  {staged} staged files created in {time.perf_counter() - t:.1f} s", flush=True)
            return host.call(lambda b: measure(b, dirs, staged), timeout=3600)
        finally:
            origin.gate.set()
            host.close()


def main(argv: list[str]) -> None:
    pairs = [tuple(int(x) for x in a.split(":")) for a in argv] or [
        (1000, 1000),
        (90000, 1000),
        (1000, 15000),
        (90000, 15000),
    ]
    # every staged file keeps a descriptor open (as in the daemon)
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    rows = []
    for inodes, staged in pairs:
        print(f"inodes {inodes}, staged {staged}", flush=True)
        res = run(inodes, staged)
        for op, xs in res.items():
            ms = sorted(x * 1000 for x in xs)
            rows.append((inodes, staged, op, statistics.median(ms), ms[int(len(ms) * 0.9)]))
    print("\n| known inodes | staged files | operation | median ms | p90 ms |")
    print("| ---: | ---: | --- | ---: | ---: |")
    for inodes, staged, op, med, p90 in rows:
        print(f"| {inodes:,} | {staged:,} | {op} | {med:.3f} | {p90:.3f} |")


if __name__ == "__main__":
    main(sys.argv[1:])
