"""Small files written until close, per journal apply mode, side by side (issue 22, item 5).

    PYTHONPATH=. python scripts/bench/small_close.py [--files N] [--rounds R] [--upload]
        [--modes loop,handoff,thread] [--json out.json]

A core (``airfs.daemon.build``, no kernel) over a POSIX origin in a temporary directory on the
cache's disk; the uploader is off unless ``--upload`` (what the close path alone costs). Each
round writes N files (4 KiB, created, written, closed: flush + release, one after another) with
each mode of :mod:`airfs.writeback.applier` in turn (a fresh stall guard each time), and N files
to the local disk with ``os.open``/``os.write``/``os.close`` (same disk), so a busy machine
moves every column alike. Reported per mode, medians over the rounds: files/s, its ratio to the
local disk of the same rounds, the CPU time per file (this process, every thread: what a busy
machine moves least), the worker-thread round trips the writer waited for per file (counted in
its own task: a busy machine does not move that number), the batches the stall guard found slow
(:mod:`airfs.writeback.applier`: each sends the next second's batches to a worker thread), and
the trio loop's stall (a ticker sleeping 1 ms, 99th percentile and maximum over all rounds, ms).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

import trio

from airfs.core.inodes import ROOT_INO
from airfs.daemon.build import Built, build
from airfs.origin.posix import PosixOrigin
from airfs.writeback.applier import Applier

DATA = b"s" * 4096


class Ticker:
    def __init__(self) -> None:
        self.lates: dict[str, list[float]] = {}
        self.mode = ""

    async def run(self) -> None:
        while True:
            t = time.perf_counter()
            await trio.sleep(0.001)
            self.lates.setdefault(self.mode, []).append(time.perf_counter() - t - 0.001)

    def of(self, mode: str) -> tuple[float, float]:
        xs = sorted(self.lates.get(mode, [0.0]))
        return xs[max(int(len(xs) * 0.99) - 1, 0)] * 1e3, xs[-1] * 1e3


async def _small(b: Built, names: list[str]) -> None:
    for name in names:
        fh, _ = await b.fs.create(ROOT_INO, name, 0o644, os.O_WRONLY | os.O_CREAT)
        await b.fs.write(fh, 0, DATA)
        await b.fs.flush(fh)
        await b.fs.release(fh)


def _local(d: str, n: int) -> float:
    shutil.rmtree(d, ignore_errors=True)
    os.mkdir(d)
    t = time.perf_counter()
    for i in range(n):
        fd = os.open(os.path.join(d, f"l{i}"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        os.write(fd, DATA)
        os.close(fd)
    return n / (time.perf_counter() - t)


async def main(args: argparse.Namespace) -> list[dict[str, Any]]:
    waits = 0
    run_sync = trio.to_thread.run_sync
    writer = trio.lowlevel.current_task()

    async def counting(fn: Callable[..., Any], *a: Any, **kw: Any) -> Any:
        nonlocal waits
        if trio.lowlevel.current_task() is writer:
            waits += 1
        return await run_sync(fn, *a, **kw)

    trio.to_thread.run_sync = counting  # type: ignore[assignment]
    rates: dict[str, list[float]] = {m: [] for m in [*args.modes, "local"]}
    hops: dict[str, list[float]] = {m: [] for m in args.modes}
    cpu: dict[str, list[float]] = {m: [] for m in [*args.modes, "local"]}
    slow: dict[str, int] = dict.fromkeys(args.modes, 0)
    cache_root = os.environ.get("AIRFS_BENCH_DIR", "/var/tmp")
    with tempfile.TemporaryDirectory(dir=cache_root) as tmp:
        origin_dir = os.path.join(tmp, "origin")
        os.mkdir(origin_dir)
        async with build(
            PosixOrigin(origin_dir),
            os.path.join(tmp, "cache"),
            ttl=60.0,
            staging_size=8 << 30,
            upload=args.upload,
        ) as b:
            ticker = Ticker()
            async with trio.open_nursery() as n:
                n.start_soon(ticker.run)
                for r in range(args.rounds):
                    order = args.modes if r % 2 == 0 else args.modes[::-1]
                    for mode in order:
                        b.area.disk.applier.close()  # a fresh guard for each mode's run
                        b.area.disk.applier = Applier(mode)
                        ticker.mode, waits = mode, 0
                        t, c = time.perf_counter(), time.process_time()
                        await _small(b, [f"{mode}{r}_{i}" for i in range(args.files)])
                        rates[mode].append(args.files / (time.perf_counter() - t))
                        cpu[mode].append((time.process_time() - c) / args.files)
                        slow[mode] += b.area.disk.applier.statistics().slow
                        hops[mode].append(waits / args.files)
                        ticker.mode = ""
                        await b.area.settle()
                    c = time.process_time()
                    rates["local"].append(_local(os.path.join(tmp, "local"), args.files))
                    cpu["local"].append((time.process_time() - c) / args.files)
                n.cancel_scope.cancel()
    trio.to_thread.run_sync = run_sync  # type: ignore[assignment]
    local = statistics.median(rates["local"])
    rows = []
    for mode in [*args.modes, "local"]:
        rate = statistics.median(rates[mode])
        p99, mx = ticker.of(mode) if mode != "local" else (0.0, 0.0)
        h = statistics.median(hops[mode]) if mode in hops else 0.0
        rows.append({"mode": mode, "files_per_s": rate, "x_local": rate / local,
                     "us_per_file": 1e6 / rate, "thread_waits_per_file": h,
                     "cpu_us_per_file": statistics.median(cpu[mode]) * 1e6,
                     "slow_batches": slow.get(mode, 0),
                     "stall_p99_ms": p99, "stall_max_ms": mx})  # fmt: skip
    return rows


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    p.add_argument("--files", type=int, default=500, help="files per mode and round")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--modes", default="loop,handoff,thread")
    p.add_argument("--upload", action="store_true", help="keep the uploader running")
    p.add_argument("--json", default=None)
    a = p.parse_args()
    a.modes = [m for m in a.modes.split(",") if m]
    out = trio.run(main, a)
    print(f"{'mode':<8} {'files/s':>9} {'x local':>8} {'us/file':>8} {'waits/file':>10} "
          f"{'cpu us':>7} {'slow':>5} {'stall p99':>9} {'max ms':>7}")  # fmt: skip
    for row in out:
        print(f"{row['mode']:<8} {row['files_per_s']:>9,.0f} {row['x_local']:>8.2f} "
              f"{row['us_per_file']:>8.0f} {row['thread_waits_per_file']:>10.3f} "
              f"{row['cpu_us_per_file']:>7.0f} {row['slow_batches']:>5} "
              f"{row['stall_p99_ms']:>9.2f} {row['stall_max_ms']:>7.2f}")  # fmt: skip
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
