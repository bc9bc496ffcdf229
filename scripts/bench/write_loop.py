"""The write path and the trio loop: throughput, and how long the loop is stalled meanwhile.

    PYTHONPATH=. python scripts/bench/write_loop.py [--files N] [--mib M] [--tasks T]

A core (``airfs.daemon.build``, no kernel) over a POSIX origin in a temporary directory on the
cache's disk. A ticker task sleeps 1 ms at a time and records how late it wakes: the *loop stall*
(what every other request on the mount waits for while the write path runs on the loop). Cases, each
timed on the loop:

* ``small``: N files created, 4 KiB written, closed (flush + release), one after another;
* ``small xT``: the same with T tasks at once (concurrent closes share journal batches);
* ``big``: M MiB written in 1 MiB writes to one file, then closed;
* ``rewrite``: the big file opened again and 64 KiB written at its start (copy-up of M MiB).

Prints files/s or MiB/s, and the loop stall's 99th percentile and maximum in ms. Run it from
two checkouts (``PYTHONPATH=<checkout>``) to compare; numbers go to docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import trio

from airfs.core.inodes import ROOT_INO
from airfs.daemon.build import Built, build
from airfs.origin.posix import PosixOrigin


class Ticker:
    def __init__(self) -> None:
        self.lates: list[float] = []

    async def run(self) -> None:
        while True:
            t = time.perf_counter()
            await trio.sleep(0.001)
            self.lates.append(time.perf_counter() - t - 0.001)

    def take(self) -> tuple[float, float]:
        xs, self.lates = sorted(self.lates), []
        if not xs:
            return 0.0, 0.0
        return xs[int(len(xs) * 0.99) - 1] * 1e3, xs[-1] * 1e3


async def _small(b: Built, names: list[str]) -> None:
    data = b"s" * 4096
    for name in names:
        fh, _ = await b.fs.create(ROOT_INO, name, 0o644, os.O_WRONLY | os.O_CREAT)
        await b.fs.write(fh, 0, data)
        await b.fs.flush(fh)
        await b.fs.release(fh)


async def main(args: argparse.Namespace) -> None:
    cache_root = os.environ.get("AIRFS_BENCH_DIR", "/var/tmp")
    with tempfile.TemporaryDirectory(dir=cache_root) as tmp:
        origin_dir = os.path.join(tmp, "origin")
        os.mkdir(origin_dir)
        async with build(
            PosixOrigin(origin_dir), os.path.join(tmp, "cache"), ttl=1.0, staging_size=8 << 30
        ) as b:
            ticker = Ticker()
            async with trio.open_nursery() as n:
                n.start_soon(ticker.run)
                rows = []

                ticker.take()
                t = time.perf_counter()
                await _small(b, [f"a{i}" for i in range(args.files)])
                dt = time.perf_counter() - t
                rows.append(("small", f"{args.files / dt:,.0f} files/s", *ticker.take()))

                t = time.perf_counter()
                async with trio.open_nursery() as tn:
                    per = args.files // args.tasks
                    for k in range(args.tasks):
                        tn.start_soon(_small, b, [f"b{k}_{i}" for i in range(per)])
                dt = time.perf_counter() - t
                rate = f"{per * args.tasks / dt:,.0f} files/s"
                rows.append((f"small x{args.tasks}", rate, *ticker.take()))

                chunk = b"B" * (1 << 20)
                t = time.perf_counter()
                fh, _ = await b.fs.create(ROOT_INO, "big", 0o644, os.O_WRONLY | os.O_CREAT)
                for i in range(args.mib):
                    await b.fs.write(fh, i << 20, chunk)
                await b.fs.flush(fh)
                await b.fs.release(fh)
                dt = time.perf_counter() - t
                rows.append(("big", f"{args.mib / dt:,.0f} MiB/s", *ticker.take()))

                await b.uploader.flush("")
                ticker.take()
                ino = (await b.fs.lookup(ROOT_INO, "big")).ino
                t = time.perf_counter()
                fh, _ = await b.fs.open(ino, os.O_RDWR)
                await b.fs.write(fh, 0, b"R" * (64 << 10))
                await b.fs.flush(fh)
                await b.fs.release(fh)
                dt = time.perf_counter() - t
                rows.append(("rewrite", f"{args.mib / dt:,.0f} MiB/s", *ticker.take()))
                await b.uploader.flush("")
                n.cancel_scope.cancel()
    print(f"{'case':<12} {'rate':>14} {'stall p99 ms':>13} {'stall max ms':>13}")
    for name, rate, p99, mx in rows:
        print(f"{name:<12} {rate:>14} {p99:>13.2f} {mx:>13.2f}")
    if args.json:
        out = [
            {"case": name, "rate": float(rate.split()[0].replace(",", "")),
             "unit": rate.split()[1], "stall_p99_ms": p99, "stall_max_ms": mx}
            for name, rate, p99, mx in rows
        ]  # fmt: skip
        with open(args.json, "w") as f:
            json.dump(out, f)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--files", type=int, default=2000)
    p.add_argument("--mib", type=int, default=512)
    p.add_argument("--tasks", type=int, default=16)
    p.add_argument("--json", default=None, help="also write the rows as JSON (scripts/bench/ab.py)")
    trio.run(main, p.parse_args())
