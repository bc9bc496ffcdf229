#!/usr/bin/env python3
"""Issue 23's slow-POSIX row, without FUSE: a cold sequential read through the block cache from
an origin that adds ``--latency`` (default 2 ms) to every ``--origin-request-kib`` (128 KiB) of
a read (an NFS-like client: a 8 MiB read is 64 such requests in a row), against eight parallel 8 MiB
``pread``-like range reads of the same origin, interleaved round by round (``--rounds``).

The reader asks ``--request-kib`` (128 KiB: the kernel's FUSE read size) with ``--depth``
requests outstanding (the kernel's readahead keeps a few in flight). The read path runs with
its *defaults* unless ``--block-kib`` / ``--part-mib`` / ``--max-window-mib`` are given, so a
run from an older checkout (``PYTHONPATH=/old/tree``) measures that checkout's defaults too:
it imports ``airfs`` from wherever ``PYTHONPATH`` points (both module layouts are handled).

    PYTHONPATH=$PWD .venv/bin/python scripts/bench/slow_posix.py --size-mib 512 --rounds 3

``--mount`` reads through a real airfs mount instead (kernel transport, a fresh mount and empty
cache per round, the origin emulated by the daemon: ``--emulate-latency 0.002
--emulate-request-size 128K``), one reader with 1 MiB ``read``s as ``cat``/``dd bs=1M`` do; the
CPU figure is then the daemon's (``/proc/PID/stat``).

Prints one JSON object: every round's MiB/s, the process's CPU seconds per GiB of the cold read
(all threads, the origin's own copies included: on a busy machine a steadier figure than MiB/s)
and the ratio of the medians. The origin's file
sits in the page cache (the origin is "fast storage behind the latency").
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import tempfile
import time
from typing import Any

import trio

from airfs.cache import CachedReadPath
from airfs.origin.aio import AsyncOrigin
from airfs.origin.latency import LatencyOrigin
from airfs.origin.posix import PosixOrigin

try:
    from airfs.core.readpath import ObjectRef
except ImportError:  # the first landing's layout
    from airfs.readpath import ObjectRef  # type: ignore[import-not-found,no-redef]

MiB = 1 << 20


class PerRequestOrigin(LatencyOrigin):
    """NFS-like: a read of ``n`` bytes is ``ceil(n / request)`` requests one after the other,
    each ``latency_s`` long (what an NFS client with ``rsize=128K`` does for one ``pread``).
    Written here for checkouts whose ``LatencyOrigin`` has no ``request_bytes``."""

    def __init__(self, inner: Any, latency_s: float, request: int) -> None:
        super().__init__(inner, 0.0)
        self.per_request = latency_s
        self.request = request

    def read_range(self, path: str, offset: int, size: int, version: str | None = None) -> bytes:
        data = super().read_range(path, offset, size, version)
        time.sleep(self.per_request * max(1, -(-len(data) // self.request)))
        return data

    def read_range_into(self, path: str, offset: int, buf: Any, version: str | None = None) -> int:
        """The same delays for a read into a buffer (the cache's big parts, where the
        checkout's origins have ``into_reads``)."""
        n: int = super().read_range_into(path, offset, buf, version)  # type: ignore[misc]
        time.sleep(self.per_request * max(1, -(-n // self.request)))
        return n


def daemon_cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (all its threads), from ``/proc``."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def mounted_read(
    a: argparse.Namespace, work: str, root: str, size: int, page_cache: bool = False
) -> tuple[float, float]:
    """One cold read of ``big.bin`` through a fresh mount: (MiB/s, daemon CPU s per GiB);
    ``page_cache``: with ``AIRFS_DIRECT_WRITES=0`` (the cache file written through it)."""
    from airfs.testing.mountfix import mounted

    cache, mp = os.path.join(work, "mcache"), os.path.join(work, "mnt")
    shutil.rmtree(cache, ignore_errors=True)
    os.makedirs(mp, exist_ok=True)
    emulate = ["--emulate-latency", str(a.latency),
               "--emulate-request-size", f"{a.origin_request_kib}K"]  # fmt: skip
    env = {"AIRFS_DIRECT_WRITES": "0"} if page_cache else None
    with mounted(root, mp, cache, "--fuse", "kernel", "--ttl", "30", *emulate, env=env) as m:
        c0 = daemon_cpu_s(m.pid)
        t = time.perf_counter()
        with open(os.path.join(mp, "big.bin"), "rb", buffering=0) as f:
            buf = bytearray(MiB)
            got = 0
            while n := f.readinto(buf):
                got += n
        dt = time.perf_counter() - t
        cpu = daemon_cpu_s(m.pid) - c0
    assert got == size, (got, size)
    return size / MiB / dt, cpu / (size / (1 << 30))


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
    """Recycle ``nbytes`` of page-cache memory first: writing into memory a VM never touched is
    slow where it is mapped in lazily (see readpath_micro.py)."""
    path = os.path.join(work, "prime.tmp")
    chunk = bytes(64 * MiB)
    with open(path, "wb") as f:
        for _ in range(max(1, nbytes // len(chunk))):
            f.write(chunk)
    os.unlink(path)


async def sequential(reader: Any, size: int, req: int, depth: int) -> float:
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
    lim = trio.CapacityLimiter(width)

    async def one(off: int) -> None:
        async with lim:
            assert await origin.read_range(obj.path, off, part, obj.version)

    async with trio.open_nursery() as n:
        for off in range(0, obj.size, part):
            n.start_soon(one, off)
    return obj.size / MiB / (time.perf_counter() - t)


async def main(a: argparse.Namespace) -> dict[str, Any]:
    work = os.path.abspath(a.dir or tempfile.mkdtemp(prefix="airfs-slowposix-"))
    if a.mount:
        from airfs.testing.mountfix import mount_from

        mount_from(work)  # the daemon imports the airfs this script imported
    root = os.path.join(work, "origin")
    os.makedirs(root, exist_ok=True)
    size = a.size_mib * MiB
    make_file(os.path.join(root, "big.bin"), size)
    sync = PerRequestOrigin(PosixOrigin(root), a.latency, a.origin_request_kib << 10)
    origin = AsyncOrigin(sync, concurrency=64)
    e = sync.stat("big.bin")
    obj = ObjectRef("big.bin", e.version, e.size)
    opts: dict[str, Any] = {"cache_size": 2 * size + 64 * MiB}
    if a.block_kib:
        opts["block_size"] = a.block_kib << 10
    if a.part_mib:
        opts["part_size"] = a.part_mib * MiB
    if a.max_window_mib:
        opts["max_window"] = a.max_window_mib * MiB
    cache = os.path.join(work, "cache")
    if a.prime:
        await trio.to_thread.run_sync(prime, work, 2 * size)
    cold: list[float] = []
    par: list[float] = []
    cpu_s_per_gib: list[float] = []
    stats: dict[str, Any] = {}
    pc_cold: list[float] = []
    pc_cpu: list[float] = []
    for _ in range(a.rounds):
        if a.baseline:
            par.append(round(await parallel_ranges(origin, obj, 8 * MiB, 8), 1))
        if a.mount:
            mibs, cpu_gib = await trio.to_thread.run_sync(mounted_read, a, work, root, size)
            cold.append(round(mibs, 1))
            cpu_s_per_gib.append(round(cpu_gib, 2))
            if a.ab:
                mibs, cpu_gib = await trio.to_thread.run_sync(
                    mounted_read, a, work, root, size, True
                )
                pc_cold.append(round(mibs, 1))
                pc_cpu.append(round(cpu_gib, 2))
            continue
        shutil.rmtree(cache, ignore_errors=True)
        async with CachedReadPath.running(origin, cache, **opts) as rp:
            r = rp.open(obj)
            ru0 = resource.getrusage(resource.RUSAGE_SELF)
            cold.append(round(await sequential(r, size, a.request_kib << 10, a.depth), 1))
            ru1 = resource.getrusage(resource.RUSAGE_SELF)
            cpu = ru1.ru_utime - ru0.ru_utime + ru1.ru_stime - ru0.ru_stime
            cpu_s_per_gib.append(round(cpu / (size / (1 << 30)), 2))
            r.close()
            st = rp.statistics()
            d = st if isinstance(st, dict) else st.to_dict()
            stats = {
                k: d.get(k)
                for k in ("origin_requests", "prefetch_window_max", "prefetch_waits",
                          "inflight_peak_bytes")
            }  # fmt: skip
    if not a.dir:
        shutil.rmtree(work, ignore_errors=True)
    return {
        "through": "an airfs mount (kernel transport)" if a.mount else "the read path, in-process",
        "latency_s": a.latency,
        "size_mib": a.size_mib,
        "request_kib": a.request_kib,
        "depth": a.depth,
        "opts": {k: v for k, v in opts.items() if k != "cache_size"},
        "cold_mib_s": cold,
        "parallel8x8MiB_mib_s": par,
        "cold_cpu_s_per_gib": cpu_s_per_gib,
        "ratio": round(statistics.median(cold) / statistics.median(par), 2) if par else None,
        "last_stats": stats,
        **(
            {
                "page_cache_cold_mib_s": pc_cold,
                "page_cache_cpu_s_per_gib": pc_cpu,
                "page_cache_ratio": round(statistics.median(pc_cold) / statistics.median(par), 2),
            }
            if pc_cold and par
            else {}
        ),
    }


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", help="work directory (default: a temporary one, removed after)")
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--latency", type=float, default=0.002)
    ap.add_argument("--request-kib", type=int, default=128, help="the reader's request size")
    ap.add_argument(
        "--origin-request-kib",
        type=int,
        default=128,
        help="the origin's request size: each costs --latency",
    )
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--block-kib", type=int, default=0, help="0: the read path's default")
    ap.add_argument("--part-mib", type=int, default=0, help="0: the read path's default")
    ap.add_argument("--max-window-mib", type=int, default=0, help="0: the read path's default")
    ap.add_argument("--no-prime", dest="prime", action="store_false")
    ap.add_argument("--mount", action="store_true", help="read through a real mount (module doc)")
    ap.add_argument(
        "--ab",
        action="store_true",
        help="with --mount: each round also reads with AIRFS_DIRECT_WRITES=0 (page-cache writes)",
    )
    ap.add_argument(
        "--no-baseline",
        dest="baseline",
        action="store_false",
        help="skip the parallel reads (to profile the cached read alone)",
    )
    print(json.dumps(trio.run(main, ap.parse_args()), indent=2))
