#!/usr/bin/env python3
"""Micro-benchmark of the read path, without FUSE.

Reads one large file through :class:`airfs.cache.CachedReadPath` over
``LatencyOrigin(PosixOrigin(dir), latency)`` — cold (empty cache), warm (same process), after a
restart (new read path on the same cache dir) — and compares with reading straight from that
origin: one sequential stream of requests (what an uncached mount does) and parallel 8 MiB range
reads (the best the origin can do). Also times ``warm()`` of the whole file and of many small
files at once.

The origin's file sits in the page cache, so the origin is "fast storage behind ``latency``"
(optionally ``--bandwidth`` limited). Numbers are MiB/s of payload.

    .venv/bin/python scripts/bench/readpath_micro.py --size-mib 1024
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from typing import Any

import trio

from airfs.cache import CachedReadPath
from airfs.core.readpath import DirectReadPath, ObjectRef
from airfs.origin.aio import AsyncOrigin
from airfs.origin.latency import LatencyOrigin
from airfs.origin.posix import PosixOrigin

MiB = 1 << 20


def make_file(path: str, size: int) -> None:
    if os.path.exists(path) and os.path.getsize(path) == size:
        return
    chunk = os.urandom(64 * MiB)
    with open(path, "wb") as f:
        left = size
        while left:
            n = min(left, len(chunk))
            f.write(chunk[:n])
            left -= n


def prime(work: str, nbytes: int) -> None:
    path = os.path.join(work, "prime.tmp")
    chunk = bytes(64 * MiB)
    with open(path, "wb") as f:
        for _ in range(nbytes // len(chunk)):
            f.write(chunk)
    os.unlink(path)


async def sequential(reader: Any, size: int, req: int, depth: int) -> float:
    """Read the whole object in ``req``-byte requests, ``depth`` outstanding (like the kernel's
    read-ahead); returns MiB/s."""
    t = time.perf_counter()
    nxt = 0

    async def worker() -> None:
        nonlocal nxt
        while nxt < size:
            off = nxt
            nxt += req
            data = await reader.read(off, req)
            assert len(data) == min(req, size - off)

    async with trio.open_nursery() as n:
        for _ in range(depth):
            n.start_soon(worker)
    return size / MiB / (time.perf_counter() - t)


async def parallel_ranges(origin: AsyncOrigin, obj: ObjectRef, part: int, width: int) -> float:
    t = time.perf_counter()
    offsets = list(range(0, obj.size, part))
    lim = trio.CapacityLimiter(width)

    async def one(off: int) -> None:
        async with lim:
            data = await origin.read_range(obj.path, off, part, obj.version)
            assert data

    async with trio.open_nursery() as n:
        for off in offsets:
            n.start_soon(one, off)
    return obj.size / MiB / (time.perf_counter() - t)


async def main(args: argparse.Namespace) -> dict[str, Any]:
    work = args.dir or tempfile.mkdtemp(prefix="airfs-bench-")
    root = os.path.join(work, "origin")
    os.makedirs(root, exist_ok=True)
    size = args.size_mib * MiB
    make_file(os.path.join(root, "big.bin"), size)
    bw = args.bandwidth_mib * MiB if args.bandwidth_mib else None
    sync = LatencyOrigin(PosixOrigin(root), latency_s=args.latency, bandwidth_bps=bw)
    origin = AsyncOrigin(sync, concurrency=64)
    e = sync.stat("big.bin")
    obj = ObjectRef("big.bin", e.version, e.size)
    req = args.request_kib << 10
    opts: dict[str, Any] = {
        "cache_size": 2 * size + 64 * MiB,
        "block_size": args.block_kib << 10,
        "max_window": args.max_window_mib * MiB,
        "part_size": args.part_mib * MiB,
    }
    out: dict[str, Any] = {
        "size_mib": args.size_mib,
        "latency_s": args.latency,
        "request_kib": args.request_kib,
        "depth": args.depth,
        **{k: v for k, v in opts.items() if k != "cache_size"},
    }

    # straight from the origin
    r = DirectReadPath(origin).open(obj)
    direct_n = min(size, args.direct_mib * MiB)
    out["direct_sequential_mib_s"] = round(await sequential(r, direct_n, req, args.depth), 1)
    for width in (8, 32):
        out[f"direct_parallel{width}x8MiB_mib_s"] = round(
            await parallel_ranges(origin, obj, 8 * MiB, width), 1
        )

    cache = os.path.join(work, "cache")
    shutil.rmtree(cache, ignore_errors=True)
    if args.prime:
        # Writing into page-cache memory the machine never touched before is slow on VMs whose
        # memory is mapped in lazily (measured 0.3 vs 6 GB/s): recycle some first, so that the
        # cold numbers are those of a node that has been running.
        await trio.to_thread.run_sync(prime, work, 2 * size)
    for _ in range(args.cold_runs):
        shutil.rmtree(cache, ignore_errors=True)
        async with CachedReadPath.running(origin, cache, **opts) as rp:
            r = rp.open(obj)
            mib_s = round(await sequential(r, size, req, args.depth), 1)
            out.setdefault("cached_cold_mib_s", []).append(mib_s)
            r.close()
            st = rp.statistics()
            out["cold_stats"] = {
                k: st.to_dict()[k]
                for k in (
                    "origin_requests", "origin_bytes_read", "prefetch_window_max",
                    "prefetch_bytes", "prefetch_waits", "inflight_peak_bytes", "miss_bytes",
                    "hit_bytes",
                )
            }  # fmt: skip
            r = rp.open(obj)
            out["cached_warm_mib_s"] = round(await sequential(r, size, req, args.depth), 1)
            r.close()
            r = rp.open(obj)
            out["cached_warm_depth1_mib_s"] = round(await sequential(r, size, req, 1), 1)
            r.close()
    async with CachedReadPath.running(origin, cache, **opts) as rp:
        r = rp.open(obj)
        out["cached_after_restart_mib_s"] = round(await sequential(r, size, req, args.depth), 1)
        r.close()
        assert rp.statistics().origin_requests == 0

    shutil.rmtree(cache, ignore_errors=True)
    async with CachedReadPath.running(origin, cache, **opts) as rp:
        t = time.perf_counter()
        assert await rp.warm(obj) == size
        out["warm_mib_s"] = round(size / MiB / (time.perf_counter() - t), 1)

    if args.small_files:
        small = os.path.join(root, "small")
        os.makedirs(small, exist_ok=True)
        payload = os.urandom(150 << 10)
        for i in range(args.small_files):
            p = os.path.join(small, f"{i:05d}")
            if not os.path.exists(p):
                with open(p, "wb") as f:
                    f.write(payload)
        refs = []
        for i in range(args.small_files):
            e = sync.stat(f"small/{i:05d}")
            refs.append(ObjectRef(f"small/{i:05d}", e.version, e.size))
        shutil.rmtree(cache, ignore_errors=True)
        async with CachedReadPath.running(origin, cache, **opts) as rp:
            lim = trio.CapacityLimiter(256)

            async def one(o: ObjectRef) -> None:
                async with lim:
                    await rp.warm(o)

            t = time.perf_counter()
            async with trio.open_nursery() as n:
                for o in refs:
                    n.start_soon(one, o)
            dt = time.perf_counter() - t
            out["small_150k_warm_files_s"] = round(len(refs) / dt)
            await rp.flush()
            out["small_index_flushes"] = rp.statistics().index_flushes

            async def read_one(o: ObjectRef) -> None:
                async with lim:
                    r = rp.open(o)
                    await r.read(0, o.size)
                    r.close()

            t = time.perf_counter()
            async with trio.open_nursery() as n:
                for o in refs:
                    n.start_soon(read_one, o)
            out["small_150k_cached_read_files_s"] = round(len(refs) / (time.perf_counter() - t))
    if not args.dir:
        shutil.rmtree(work, ignore_errors=True)
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", help="work directory (default: a temporary one, removed after)")
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--latency", type=float, default=0.01)
    ap.add_argument("--bandwidth-mib", type=float, default=0, help="origin cap, MiB/s (0: none)")
    ap.add_argument("--request-kib", type=int, default=1024, help="size of each read request")
    ap.add_argument("--depth", type=int, default=2, help="read requests outstanding")
    ap.add_argument("--direct-mib", type=int, default=256, help="bytes for the slow direct run")
    ap.add_argument("--block-kib", type=int, default=1024)
    ap.add_argument("--max-window-mib", type=int, default=128)
    ap.add_argument("--part-mib", type=int, default=8)
    ap.add_argument("--small-files", type=int, default=1000)
    ap.add_argument("--cold-runs", type=int, default=2)
    ap.add_argument("--no-prime", dest="prime", action="store_false")
    print(json.dumps(trio.run(main, ap.parse_args()), indent=2))
