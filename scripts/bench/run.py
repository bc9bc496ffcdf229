#!/usr/bin/env python3
"""airfs benchmark suite: every scenario against its baselines, in the same run.

    .venv/bin/python scripts/bench/run.py [--quick] [--only SCENARIO ...] [--reps N]

Scenarios (ids for ``--only``): ``cold`` (1), ``cached`` (2), ``small`` (3), ``ckpt`` (4),
``smallwrite`` (5), ``s3cold`` (6), ``s3small`` (7), ``s3ckpt`` (8). ``cached`` reuses the cache
filled by ``cold``; asking for it alone runs a cold pass first. Prints a table and writes it, with
machine info and notes, to ``docs/benchmarks.md`` (``--output``). Needs root (drops the page
cache, raises read-ahead) and ``/dev/fuse``; installs rclone and s3fs with apt-get if missing and
skips a baseline it cannot get. Benchmarks never run in CI.

Everything listens on 127.0.0.1 only; every mount is torn down (``fusermount3 -u -z``, then the
daemon stopped by PID) even on errors.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from airfs.origin.latency import LatencyOrigin  # noqa: E402
from airfs.origin.posix import PosixOrigin  # noqa: E402
from airfs.testing import mountfix  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from readpath_micro import make_file  # noqa: E402

MiB = 1 << 20
GiB = 1 << 30
SMALL = 150 << 10
PY = sys.executable
SCENARIOS = ("cold", "cached", "small", "ckpt", "smallwrite", "s3cold", "s3small", "s3ckpt")


# -- results -----------------------------------------------------------------------------------


@dataclass
class Row:
    num: str
    scenario: str
    airfs: str
    baseline: str
    base_value: str
    ratio: float | None
    target: str
    met: bool | None
    samples: str = ""


@dataclass
class Bench:
    args: argparse.Namespace
    work: Path
    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    big_size: int = 0
    n_small: int = 0
    n_write: int = 0
    ckpt_size: int = 0
    latency: float = 0.01
    bandwidth: int | None = None
    reps: int = 3
    state: dict[str, Any] = field(default_factory=dict)

    def log(self, msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)

    def add(self, row: Row) -> None:
        self.rows.append(row)
        r = f"{row.ratio:.2f}x" if row.ratio is not None else "-"
        met = {True: "MET", False: "MISSED", None: "-"}[row.met]
        self.log(f"  => {row.num} {row.scenario}: airfs {row.airfs} | {row.baseline} "
                 f"{row.base_value} | {r} (target {row.target}) {met}")  # fmt: skip


def med(xs: list[float]) -> float:
    return statistics.median(xs)


def fmt_samples(xs: list[float], unit: str) -> str:
    return ", ".join(f"{x:.1f}" if x >= 10 else f"{x:.2f}" for x in xs) + f" {unit}"


def speed_row(b: Bench, num: str, scen: str, a: list[float], base: str, bv: list[float],
              unit: str, target: float) -> None:  # fmt: skip
    """Both lists are speeds (higher is better); ratio = airfs / baseline."""
    if not a or not bv:
        return
    ratio = med(a) / med(bv)
    b.add(Row(num, scen, f"{med(a):,.0f} {unit}", base, f"{med(bv):,.0f} {unit}", ratio,
              f">= {target:g}x", ratio >= target,
              f"airfs {fmt_samples(a, unit)}; {base} {fmt_samples(bv, unit)}"))  # fmt: skip


# -- system helpers ----------------------------------------------------------------------------


def drop_caches() -> None:
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def read_file(path: str | Path, bufsize: int = MiB) -> int:
    buf = bytearray(bufsize)
    mv = memoryview(buf)
    n = 0
    fd = os.open(path, os.O_RDONLY)
    try:
        while True:
            k = os.readv(fd, [mv])
            if not k:
                return n
            n += k
    finally:
        os.close(fd)


def timed_read(path: str | Path, size: int) -> float:
    """Sequential read of ``path``; MiB/s."""
    t = time.perf_counter()
    n = read_file(path)
    dt_ = time.perf_counter() - t
    if n != size:
        raise RuntimeError(f"{path}: read {n} bytes, expected {size}")
    return size / MiB / dt_


def read_many(paths: list[str], threads: int) -> float:
    """open/read/close every path with ``threads`` readers; files/s."""
    def one(p: str) -> int:
        with open(p, "rb", buffering=0) as f:
            n = 0
            while True:
                chunk = f.read(1 << 20)
                if not chunk:
                    return n
                n += len(chunk)

    t = time.perf_counter()
    with ThreadPoolExecutor(threads) as ex:
        sizes = list(ex.map(one, paths))
    dt_ = time.perf_counter() - t
    if any(s != SMALL for s in sizes):
        raise RuntimeError("short read in small-file pass")
    return len(paths) / dt_


def is_mounted(mp: str | Path) -> bool:
    return mountfix.is_mounted(mp)


def fresh_dir(p: Path) -> Path:
    if p.exists():
        shutil.rmtree(p)
    p.mkdir(parents=True)
    return p


def make_mp(b: Bench, name: str) -> Path:
    mp = b.work / "mnt" / name
    if is_mounted(mp):
        mountfix.fusermount_unmount(mp)
    mp.mkdir(parents=True, exist_ok=True)
    return mp


@contextlib.contextmanager
def airfs_mount(b: Bench, origin: str, name: str, cache: Path, *extra: str,
                env: dict[str, str] | None = None) -> Iterator[mountfix.Mounted]:  # fmt: skip
    mp = make_mp(b, name)
    m = mountfix.mount(origin, mp, cache, *extra, env=env, timeout=120)
    try:
        yield m
    finally:
        mountfix.teardown(m, check=False)  # benchmarks measure; tests judge


def latency_args(b: Bench) -> list[str]:
    out = ["--emulate-latency", str(b.latency)]
    if b.bandwidth:
        out += ["--emulate-bandwidth", str(b.bandwidth)]
    return out


@contextlib.contextmanager
def proc_mount(cmd: list[str], mp: Path, log: Path, env: dict[str, str] | None = None,
               timeout: float = 60) -> Iterator[subprocess.Popen[bytes]]:  # fmt: skip
    """Run a foreground FUSE daemon; wait for its mount; always unmount and stop it by PID."""
    full_env = {**os.environ, **(env or {})}
    full_env.pop("AWS_CA_BUNDLE", None)  # rclone 1.60 fails on it even for http endpoints
    with open(log, "ab") as lf:
        p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=lf, stderr=subprocess.STDOUT,
                             env=full_env, start_new_session=True)  # fmt: skip
    try:
        deadline = time.monotonic() + timeout
        while not is_mounted(mp):
            if p.poll() is not None:
                raise RuntimeError(f"{cmd[0]} exited {p.returncode}: " + log.read_text()[-1500:])
            if time.monotonic() > deadline:
                raise RuntimeError(f"{cmd[0]} did not mount within {timeout}s")
            time.sleep(0.05)
        yield p
    finally:
        mountfix.fusermount_unmount(mp)
        if is_mounted(mp):
            subprocess.run(["umount", "-l", str(mp)], capture_output=True)
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(10)


def passthrough(b: Bench, src: Path, name: str) -> contextlib.AbstractContextManager[Any]:
    mp = make_mp(b, name)
    cmd = [PY, str(REPO / "scripts/bench/passthrough.py"), str(src), str(mp)]
    return proc_mount(cmd, mp, b.work / "passthrough.log")


def have_rclone() -> bool:
    return shutil.which("rclone") is not None


def rclone_mount(b: Bench, remote: str, name: str, cache: Path, *extra: str,
                 env: dict[str, str] | None = None) -> contextlib.AbstractContextManager[Any]:  # fmt: skip
    mp = make_mp(b, name)
    conf = b.work / "rclone.conf"
    conf.touch()
    cmd = ["rclone", "mount", remote, str(mp), "--config", str(conf), "--vfs-cache-mode", "full",
           "--cache-dir", str(cache), *extra]  # fmt: skip
    return proc_mount(cmd, mp, b.work / "rclone.log", env=env)


def ensure_tools(b: Bench) -> None:
    missing = [pkg for tool, pkg in (("rclone", "rclone"), ("s3fs", "s3fs")) if not shutil.which(tool)]
    if missing:
        b.log(f"installing {missing} with apt-get")
        p = subprocess.run(["apt-get", "install", "-y", *missing], capture_output=True, text=True)
        if p.returncode != 0:
            subprocess.run(["apt-get", "update"], capture_output=True)
            subprocess.run(["apt-get", "install", "-y", *missing], capture_output=True)
    for tool in ("rclone", "s3fs"):
        if not shutil.which(tool):
            b.skipped.append(f"{tool}: not installed and apt-get install failed; its baseline is skipped")


# -- data --------------------------------------------------------------------------------------


def write_big(path: Path, size: int) -> None:
    make_file(str(path), size)


def small_names(n: int) -> list[str]:
    return [f"{i // 1000:03d}/{i:06d}.bin" for i in range(n)]


def write_small_tree(root: Path, n: int) -> None:
    marker = root.parent / f".small-complete-{n}"
    if marker.exists():
        return
    if root.exists():
        shutil.rmtree(root)
    payload = os.urandom(SMALL + 4096)
    for i, name in enumerate(small_names(n)):
        p = root / name
        p.parent.mkdir(parents=True, exist_ok=True)
        with open(p, "wb") as f:
            f.write(payload[i % 4096 : i % 4096 + SMALL])
    marker.touch()


def setup_origin(b: Bench) -> Path:
    origin = b.work / "origin"
    origin.mkdir(parents=True, exist_ok=True)
    if "origin_ready" not in b.state:
        b.log(f"origin data: {b.big_size / GiB:g} GiB file, {b.n_small} x 150 KiB files")
        write_big(origin / "big.bin", b.big_size)
        write_small_tree(origin / "small", b.n_small)
        b.state["origin_ready"] = True
    return origin


def lat_origin(b: Bench, root: Path) -> LatencyOrigin:
    return LatencyOrigin(PosixOrigin(str(root)), b.latency, b.bandwidth)


def parallel_ranges(read: Callable[[int, int], int], size: int, part: int = 8 * MiB,
                    threads: int = 16) -> float:  # fmt: skip
    """Read [0, size) as ``part``-sized ranges from ``threads`` threads; MiB/s."""
    offsets = list(range(0, size, part))
    t = time.perf_counter()
    with ThreadPoolExecutor(threads) as ex:
        got = sum(ex.map(lambda off: read(off, min(part, size - off)), offsets))
    dt_ = time.perf_counter() - t
    if got != size:
        raise RuntimeError(f"parallel ranges got {got} of {size} bytes")
    return size / MiB / dt_


# -- scenarios 1 and 2: big sequential read over the latency origin ----------------------------


def sc_cold(b: Bench) -> None:
    origin = setup_origin(b)
    big = origin / "big.bin"
    size = b.big_size
    cache = b.work / "cache-cold"
    b.log("1. cold sequential read, latency origin")
    # airfs
    a: list[float] = []
    for _ in range(b.reps):
        fresh_dir(cache)
        with airfs_mount(b, str(origin), "airfs", cache, *latency_args(b)) as m:
            drop_caches()
            read_file(big)  # the origin is "memory behind the link": prime its page cache
            a.append(timed_read(m.mountpoint / "big.bin", size))
            b.state["cold_status"] = m.status().get("cache")
    b.state["cold_cache"] = cache
    # parallel range reads straight from the same emulated origin
    lo = lat_origin(b, origin)
    par: list[float] = []
    for _ in range(b.reps):
        drop_caches()
        read_file(big)
        par.append(parallel_ranges(lambda off, n: len(lo.read_range("big.bin", off, n)), size))
    speed_row(b, "1a", "Cold sequential read (latency origin)", a, "parallel 16x8 MiB ranges",
              par, "MiB/s", 0.8)  # fmt: skip
    # uncapped variant (latency only): what the 2-core machine allows
    if b.bandwidth:
        ua: list[float] = []
        up: list[float] = []
        lo2 = LatencyOrigin(PosixOrigin(str(origin)), b.latency, None)
        for _ in range(max(1, b.reps - 1)):
            fresh_dir(cache.with_name("cache-uncapped"))
            with airfs_mount(b, str(origin), "airfs", cache.with_name("cache-uncapped"),
                             "--emulate-latency", str(b.latency)) as m:  # fmt: skip
                drop_caches()
                read_file(big)
                ua.append(timed_read(m.mountpoint / "big.bin", size))
            drop_caches()
            read_file(big)
            up.append(parallel_ranges(lambda off, n: len(lo2.read_range("big.bin", off, n)), size))
        shutil.rmtree(cache.with_name("cache-uncapped"), ignore_errors=True)
        b.add(Row("1a'", "Cold sequential read, latency only (no bandwidth cap; info)",
                  f"{med(ua):,.0f} MiB/s", "parallel 16x8 MiB ranges", f"{med(up):,.0f} MiB/s",
                  med(ua) / med(up), "(info)", None,
                  f"airfs {fmt_samples(ua, 'MiB/s')}; parallel {fmt_samples(up, 'MiB/s')}"))  # fmt: skip
    # rclone over the plain directory (no latency emulation possible), bandwidth-capped alike
    if have_rclone():
        rc: list[float] = []
        extra = ["--bwlimit", f"{b.bandwidth // MiB}M"] if b.bandwidth else []
        rcache = b.work / "rclone-cache-local"
        for _ in range(max(1, b.reps - 1)):
            fresh_dir(rcache)
            with rclone_mount(b, str(origin), "rclone", rcache, *extra):
                drop_caches()
                read_file(big)
                rc.append(timed_read(b.work / "mnt/rclone/big.bin", size))
        b.state["rclone_cache_local"] = rcache
        speed_row(b, "1b", "Cold sequential read (latency origin)", a,
                  "rclone full-cache, plain dir (no latency)", rc, "MiB/s", 2.0)  # fmt: skip


def sc_cached(b: Bench) -> None:
    origin = setup_origin(b)
    size = b.big_size
    cache = b.state.get("cold_cache")
    if cache is None or not Path(cache).exists():
        cache = b.work / "cache-cold"
        fresh_dir(cache)
        with airfs_mount(b, str(origin), "airfs", cache, *latency_args(b)) as m:
            read_file(m.mountpoint / "big.bin")
    b.log("2. cached sequential read after remount, page cache dropped")
    a: list[float] = []
    for _ in range(b.reps):
        with airfs_mount(b, str(origin), "airfs", cache, *latency_args(b)) as m:
            drop_caches()
            a.append(timed_read(m.mountpoint / "big.bin", size))
            st = m.status().get("cache", {})
            if st.get("origin_bytes_read"):
                b.notes.append(f"2: the remounted read still fetched {st['origin_bytes_read']} "
                               "bytes from the origin")  # fmt: skip
    pt: list[float] = []
    for _ in range(b.reps):
        with passthrough(b, origin, "pt"):
            drop_caches()
            pt.append(timed_read(b.work / "mnt/pt/big.bin", size))
    speed_row(b, "2a", "Cached sequential read after remount (page cache dropped)", a,
              "bare pyfuse3 pass-through (local dir)", pt, "MiB/s", 0.9)  # fmt: skip
    if have_rclone():
        rcache = b.state.get("rclone_cache_local")
        extra = ["--bwlimit", f"{b.bandwidth // MiB}M"] if b.bandwidth else []
        if rcache is None:
            rcache = b.work / "rclone-cache-local"
            fresh_dir(rcache)
            with rclone_mount(b, str(origin), "rclone", rcache, *extra):
                read_file(b.work / "mnt/rclone/big.bin")
        rc: list[float] = []
        for _ in range(max(1, b.reps - 1)):
            with rclone_mount(b, str(origin), "rclone", rcache, *extra):
                drop_caches()
                rc.append(timed_read(b.work / "mnt/rclone/big.bin", size))
        speed_row(b, "2b", "Cached sequential read after remount (page cache dropped)", a,
                  "rclone full-cache warm (remounted)", rc, "MiB/s", 3.0)  # fmt: skip


# -- scenario 3: small files over the latency origin --------------------------------------------


def warm_cli(mp: Path, path: Path, jobs: int = 256) -> tuple[float, str]:
    t = time.perf_counter()
    p = subprocess.run([*mountfix.airfs_cmd(), "warm", "-j", str(jobs), "-q", str(path)],
                       capture_output=True, text=True, timeout=3600)  # fmt: skip
    dt_ = time.perf_counter() - t
    if p.returncode != 0:
        raise RuntimeError(f"airfs warm failed: {p.stdout} {p.stderr}")
    return dt_, p.stdout.strip()


def sc_small(b: Bench) -> None:
    origin = setup_origin(b)
    names = small_names(b.n_small)
    b.log(f"3. small files: warm {b.n_small} x 150 KiB, then 32-reader pass")
    cache = b.work / "cache-small"
    a: list[float] = []
    rd: list[float] = []
    for i in range(max(1, b.reps - 1)):
        fresh_dir(cache)
        with airfs_mount(b, str(origin), "airfs", cache, *latency_args(b)) as m:
            drop_caches()
            dt_, out = warm_cli(m.mountpoint, m.mountpoint / "small")
            a.append(b.n_small / dt_)
            b.log(f"   airfs warm: {dt_:.2f} s ({out})")
            if i == 0:
                rd.append(read_many([str(m.mountpoint / "small" / n) for n in names], 32))
    # baseline: plain 256-thread copy from the same emulated origin
    lo = lat_origin(b, origin)
    base: list[float] = []
    for _ in range(max(1, b.reps - 1)):
        dst = fresh_dir(b.work / "copy-small")
        drop_caches()

        def copy(name: str, dst: Path = dst) -> None:
            data = lo.read_range("small/" + name, 0, SMALL)
            p = dst / name
            p.parent.mkdir(exist_ok=True)
            with open(p, "wb") as f:
                f.write(data)

        t = time.perf_counter()
        subdirs = [e.name for e in lo.list("small")]
        listed = [f"{d}/{e.name}" for d in subdirs for e in lo.list(f"small/{d}")]
        with ThreadPoolExecutor(256) as ex:
            list(ex.map(copy, listed))
        base.append(len(listed) / (time.perf_counter() - t))
    shutil.rmtree(b.work / "copy-small", ignore_errors=True)
    speed_row(b, "3a", f"Small files: airfs warm -j 256 ({b.n_small} x 150 KiB)", a,
              "256-thread copy from origin", base, "files/s", 0.8)  # fmt: skip
    # second pass: 32 readers through the bare pass-through over the local copy
    local = origin / "small"
    for n in names:  # the local copy sits in the page cache, as airfs's cache files do
        read_file(local / n)
    with passthrough(b, origin, "pt"):
        pt = [read_many([str(b.work / "mnt/pt/small" / n) for n in names], 32)]
    speed_row(b, "3b", "Small files: 32-reader pass after warm", rd,
              "bare pass-through (local copy)", pt, "files/s", 0.8)  # fmt: skip


# -- scenarios 4 and 5: writes over the latency origin ------------------------------------------


def state_dict(size: int) -> dict[str, Any]:
    import torch

    n = max(1, size // (64 * MiB))
    per = size // n // 4
    g = torch.Generator().manual_seed(0)
    return {f"layer{i}.weight": torch.rand(per, generator=g, dtype=torch.float32) for i in range(n)}


def torch_save(sd: dict[str, Any], path: Path) -> float:
    import torch

    t = time.perf_counter()
    torch.save(sd, str(path))
    return time.perf_counter() - t


def flush_cli(mp: Path) -> float:
    t = time.perf_counter()
    p = subprocess.run([*mountfix.airfs_cmd(), "flush", "-q", str(mp)], capture_output=True,
                       text=True, timeout=7200)  # fmt: skip
    if p.returncode != 0:
        raise RuntimeError(f"airfs flush failed: {p.stderr}")
    return time.perf_counter() - t


def ckpt_scenario(b: Bench, num: str, label: str, origin_arg: str, mount_args: list[str],
                  env: dict[str, str] | None, direct_put: Callable[[Path, str], None]) -> None:  # fmt: skip
    sd = b.state.get("sd")
    if sd is None:
        sd = b.state["sd"] = state_dict(b.ckpt_size)
    local = fresh_dir(b.work / "local")
    loc: list[float] = []
    put: list[float] = []
    for i in range(b.reps):
        p = local / f"ckpt{i}.pt"
        os.sync()
        loc.append(torch_save(sd, p))
        size = p.stat().st_size
        t = time.perf_counter()
        direct_put(p, f"direct-ckpt{i}.pt")
        put.append(size / MiB / (time.perf_counter() - t))
        p.unlink()
    cache = b.work / f"cache-{num}"
    ret: list[float] = []
    commit: list[float] = []
    e2e: list[float] = []
    fresh_dir(cache)
    with airfs_mount(b, origin_arg, "airfs", cache, *mount_args, env=env) as m:
        for i in range(b.reps):
            os.sync()
            dst = m.mountpoint / f"airfs-ckpt{i}.pt"
            r = torch_save(sd, dst)
            size = dst.stat().st_size
            f = flush_cli(m.mountpoint)
            ret.append(r)
            commit.append(size / MiB / f)
            e2e.append(size / MiB / (r + f))
        st = m.status().get("writeback", {})
        b.log(f"   writeback status: {st}")
    shutil.rmtree(cache, ignore_errors=True)
    ratio = med(ret) / med(loc)
    b.add(Row(f"{num}a", f"{label}: torch.save {b.ckpt_size / GiB:g} GiB, return time",
              f"{med(ret):.2f} s", "torch.save to local disk", f"{med(loc):.2f} s", ratio,
              "<= 1.5x (time)", ratio <= 1.5,
              f"airfs {fmt_samples(ret, 's')}; local {fmt_samples(loc, 's')}"))  # fmt: skip
    speed_row(b, f"{num}b", f"{label}: commit until `airfs flush` returns (after save)", commit,
              "direct copy of the file to the origin", put, "MiB/s", 0.8)  # fmt: skip
    b.notes.append(
        f"{num}: end to end (save + flush) airfs commits at {med(e2e):,.0f} MiB/s; saving "
        f"locally then copying would take {med(loc):.2f} s + "
        f"{b.ckpt_size / MiB / med(put):.2f} s = "
        f"{b.ckpt_size / MiB / (med(loc) + b.ckpt_size / MiB / med(put)):,.0f} MiB/s."
    )


def sc_ckpt(b: Bench) -> None:
    origin = setup_origin(b)
    b.log("4. torch.save into the mount, latency origin")
    lo = lat_origin(b, origin)
    try:
        ckpt_scenario(b, "4", "Latency origin", str(origin), latency_args(b), None,
                      lambda src, key: lo.put(key, str(src)) and None)  # fmt: skip
    finally:
        for p in origin.glob("*ckpt*.pt"):
            p.unlink()


def sc_smallwrite(b: Bench) -> None:
    origin = setup_origin(b)
    n = b.n_write
    b.log(f"5. write {n} x 150 KiB files")
    payload = os.urandom(SMALL)

    def write_all(root: Path) -> float:
        root.mkdir(parents=True, exist_ok=True)
        t = time.perf_counter()
        for i in range(n):
            with open(root / f"{i:06d}.bin", "wb") as f:
                f.write(payload)
        return n / (time.perf_counter() - t)

    loc: list[float] = []
    for i in range(b.reps):
        os.sync()
        loc.append(write_all(fresh_dir(b.work / "local" / f"w{i}")))
    shutil.rmtree(b.work / "local", ignore_errors=True)
    cache = fresh_dir(b.work / "cache-w")
    a: list[float] = []
    fl: list[float] = []
    try:
        with airfs_mount(b, str(origin), "airfs", cache, *latency_args(b)) as m:
            for i in range(1 if b.full else b.reps):  # type: ignore[attr-defined]
                os.sync()
                a.append(write_all(m.mountpoint / f"w5k-{i}"))
                fl.append(flush_cli(m.mountpoint))
            st = m.status()
            b.log(f"   fs ops: {st['fs'].get('ops')}; cache: {st.get('cache')}")
            b.state["w_status"] = st
    finally:
        for p in origin.glob("w5k-*"):
            shutil.rmtree(p, ignore_errors=True)
        shutil.rmtree(cache, ignore_errors=True)
    speed_row(b, "5", f"Write {n} x 150 KiB files until close", a, "local disk", loc,
              "files/s", 0.5)  # fmt: skip
    b.add(Row("5'", "... then until `airfs flush` returns (info)", f"{med(fl):.2f} s "
              f"({n / med(fl):,.0f} files/s)", "-", "-", None, "(info)", None,
              f"flush {fmt_samples(fl, 's')}"))  # fmt: skip


# -- scenarios 6-8: S3 (SeaweedFS on loopback) --------------------------------------------------


@contextlib.contextmanager
def s3_env(b: Bench) -> Iterator[Any]:
    from airfs.testing.seaweed import seaweed_server

    if "srv" in b.state:
        yield b.state["srv"]
        return
    with seaweed_server(fresh_dir(b.work / "seaweed")) as srv:
        b.state["srv"] = srv
        try:
            yield srv
        finally:
            b.state.pop("srv", None)
            b.state.pop("s3_ready", None)


def raw_store(srv: Any) -> Any:
    from obstore.store import S3Store

    return S3Store(srv.bucket, endpoint=srv.endpoint, access_key_id=srv.access_key,
                   secret_access_key=srv.secret_key, region="us-east-1",
                   client_options={"allow_http": True, "timeout": "600s",
                                   "pool_max_idle_per_host": "512"})  # fmt: skip


def s3_upload(b: Bench, srv: Any) -> None:
    if b.state.get("s3_ready"):
        return
    import obstore

    origin = setup_origin(b)
    store = raw_store(srv)
    b.log("   uploading the data set to SeaweedFS")
    t = time.perf_counter()
    obstore.put(store, "bench/big.bin", origin / "big.bin", use_multipart=True,
                chunk_size=16 * MiB, max_concurrency=8)  # fmt: skip
    names = small_names(b.n_small)
    with ThreadPoolExecutor(32) as ex:
        list(ex.map(lambda n: obstore.put(store, "bench/small/" + n,
                                          (origin / "small" / n).read_bytes()), names))  # fmt: skip
    b.log(f"   uploaded in {time.perf_counter() - t:.1f} s")
    b.state["s3_ready"] = True


def s3_mount_args(srv: Any) -> list[str]:
    return ["--s3-endpoint", srv.endpoint, "--s3-path-style"]


def sc_s3cold(b: Bench) -> None:
    import obstore

    b.log("6. S3 cold sequential read")
    with s3_env(b) as srv:
        s3_upload(b, srv)
        size = b.big_size
        cache = b.work / "cache-s3"
        a: list[float] = []
        for _ in range(b.reps):
            fresh_dir(cache)
            with airfs_mount(b, srv.url("bench"), "airfs", cache, *s3_mount_args(srv),
                             env=srv.env) as m:  # fmt: skip
                drop_caches()
                a.append(timed_read(m.mountpoint / "big.bin", size))
        shutil.rmtree(cache, ignore_errors=True)
        store = raw_store(srv)
        raw: list[float] = []
        for _ in range(b.reps):
            drop_caches()
            raw.append(parallel_ranges(
                lambda off, n: len(obstore.get_range(store, "bench/big.bin", start=off, length=n)),
                size))  # fmt: skip
        speed_row(b, "6a", "S3 cold sequential read", a, "raw parallel 16x8 MiB get_range", raw,
                  "MiB/s", 0.8)  # fmt: skip
        peers: dict[str, list[float]] = {}
        if have_rclone():
            env = {"RCLONE_CONFIG_SW_TYPE": "s3", "RCLONE_CONFIG_SW_PROVIDER": "Other",
                   "RCLONE_CONFIG_SW_ACCESS_KEY_ID": srv.access_key,
                   "RCLONE_CONFIG_SW_SECRET_ACCESS_KEY": srv.secret_key,
                   "RCLONE_CONFIG_SW_ENDPOINT": srv.endpoint,
                   "RCLONE_CONFIG_SW_REGION": "us-east-1",
                   "RCLONE_CONFIG_SW_FORCE_PATH_STYLE": "true"}  # fmt: skip
            rc: list[float] = []
            for _ in range(1 if b.full else b.reps):
                rcache = fresh_dir(b.work / "rclone-cache-s3")
                try:
                    with rclone_mount(b, f"sw:{srv.bucket}/bench", "rclone", rcache, env=env):
                        drop_caches()
                        rc.append(timed_read(b.work / "mnt/rclone/big.bin", size))
                except Exception as exc:
                    b.skipped.append(f"rclone S3: {exc}")
                    break
            shutil.rmtree(b.work / "rclone-cache-s3", ignore_errors=True)
            if rc:
                peers["rclone full-cache (S3)"] = rc
        if shutil.which("s3fs"):
            pw = b.work / "s3fs.passwd"
            pw.write_text(f"{srv.access_key}:{srv.secret_key}\n")
            pw.chmod(0o600)
            s3: list[float] = []
            for _ in range(1 if b.full else b.reps):
                mp = make_mp(b, "s3fs")
                cmd = ["s3fs", f"{srv.bucket}:/bench", str(mp), "-f", "-o", f"passwd_file={pw}",
                       "-o", f"url={srv.endpoint}", "-o", "use_path_request_style",
                       "-o", "endpoint=us-east-1"]  # fmt: skip
                try:
                    with proc_mount(cmd, mp, b.work / "s3fs.log"):
                        drop_caches()
                        s3.append(timed_read(mp / "big.bin", size))
                except Exception as exc:
                    b.skipped.append(f"s3fs: {exc}")
                    break
            if s3:
                peers["s3fs (defaults)"] = s3
        for name, v in peers.items():
            speed_row(b, "6b", "S3 cold sequential read", a, name, v, "MiB/s", 2.0)
        if peers:
            best = max(peers, key=lambda k: med(peers[k]))
            b.notes.append(f"6b: the better peer is {best} ({med(peers[best]):,.0f} MiB/s); "
                           "the target is against it.")  # fmt: skip


def sc_s3small(b: Bench) -> None:
    import obstore

    b.log(f"7. S3 small files: warm {b.n_small} x 150 KiB")
    with s3_env(b) as srv:
        s3_upload(b, srv)
        cache = b.work / "cache-s3small"
        a: list[float] = []
        secs: list[float] = []
        for _ in range(max(1, b.reps - 1)):
            fresh_dir(cache)
            with airfs_mount(b, srv.url("bench"), "airfs", cache, *s3_mount_args(srv),
                             env=srv.env) as m:  # fmt: skip
                drop_caches()
                dt_, out = warm_cli(m.mountpoint, m.mountpoint / "small")
                b.log(f"   airfs warm: {dt_:.2f} s ({out})")
                a.append(b.n_small / dt_)
                secs.append(dt_)
        shutil.rmtree(cache, ignore_errors=True)
        store = raw_store(srv)
        raw: list[float] = []
        for _ in range(max(1, b.reps - 1)):
            drop_caches()
            t = time.perf_counter()
            keys = [o["path"] for batch in obstore.list(store, prefix="bench/small/")
                    for o in batch]  # fmt: skip
            with ThreadPoolExecutor(256) as ex:
                got = list(ex.map(lambda k: len(obstore.get(store, k).bytes()), keys))
            raw.append(len(keys) / (time.perf_counter() - t))
            assert len(got) == b.n_small and all(g == SMALL for g in got)
        speed_row(b, "7", f"S3 small files: airfs warm -j 256 ({b.n_small} x 150 KiB)", a,
                  "raw 256-thread list + GET", raw, "files/s", 0.8)  # fmt: skip
        ok = med(secs) < 22.0 * b.n_small / 15375
        b.add(Row("7'", "S3 small files: warm wall time vs the seed's 22 s", f"{med(secs):.2f} s",
                  "seed's published figure" + ("" if b.n_small == 15375 else " (scaled)"),
                  f"{22.0 * b.n_small / 15375:.2f} s", med(secs) / (22.0 * b.n_small / 15375),
                  "< 22 s", ok, f"airfs {fmt_samples(secs, 's')}"))  # fmt: skip


def sc_s3ckpt(b: Bench) -> None:
    import obstore

    b.log("8. S3 torch.save")
    with s3_env(b) as srv:
        store = raw_store(srv)

        def put(src: Path, key: str) -> None:
            obstore.put(store, f"bench/ckpt/{key}", src, use_multipart=True,
                        chunk_size=16 * MiB, max_concurrency=8)  # fmt: skip

        ckpt_scenario(b, "8", "S3", srv.url("bench/ckpt"), s3_mount_args(srv), srv.env, put)


# -- report -------------------------------------------------------------------------------------


def machine_info() -> list[str]:
    def cmd(*c: str) -> str:
        try:
            return subprocess.run(c, capture_output=True, text=True, timeout=20).stdout.strip()
        except Exception:
            return "?"

    cpu = "?"
    for line in cmd("lscpu").splitlines():
        if line.startswith("Model name"):
            cpu = line.split(":", 1)[1].strip()
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GiB
    import pyfuse3
    import torch

    from airfs.testing.seaweed import find_weed

    try:
        weed = cmd(find_weed(), "version").splitlines()[0]
    except Exception:
        weed = "?"
    return [
        f"- CPU: {cpu}, {os.cpu_count()} cores; RAM {mem:.0f} GiB; kernel {platform.release()}",
        f"- Disk (work dir): {cmd('df', '-h', '--output=source,size', '/tmp').splitlines()[-1]}",
        f"- Python {platform.python_version()}, pyfuse3 {pyfuse3.__version__}, "
        f"torch {torch.__version__}",
        f"- rclone: {cmd('rclone', 'version').splitlines()[0] if have_rclone() else 'absent'}; "
        f"s3fs: {cmd('s3fs', '--version').splitlines()[0] if shutil.which('s3fs') else 'absent'}"
        f"; SeaweedFS: {weed}",
        f"- airfs commit: {cmd('git', '-C', str(REPO), 'rev-parse', '--short', 'HEAD')}",
    ]


def table(rows: list[Row]) -> str:
    out = ["| # | Scenario | airfs | Baseline | Baseline value | Ratio | Target | Met |",
           "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        ratio = f"{r.ratio:.2f}x" if r.ratio is not None else "-"
        met = {True: "yes", False: "**no**", None: "-"}[r.met]
        out.append(f"| {r.num} | {r.scenario} | {r.airfs} | {r.baseline} | {r.base_value} | "
                   f"{ratio} | {r.target} | {met} |")  # fmt: skip
    return "\n".join(out)


def write_doc(b: Bench, started: dt.datetime, elapsed: float) -> str:
    a = b.args
    mode = "quick (scaled down)" if a.quick else "full"
    lines = [
        "# airfs benchmarks",
        "",
        f"Generated by `.venv/bin/python scripts/bench/run.py"
        f"{' --quick' if a.quick else ''}{' --only ' + ' '.join(a.only) if a.only else ''}` "
        f"on {started:%Y-%m-%d %H:%M} UTC ({mode} run, {elapsed / 60:.1f} min). "
        "Benchmarks never run in CI; rerun the command to refresh this page.",
        "",
        "## Machine",
        "",
        *machine_info(),
        "",
        "## Setup",
        "",
        f"- Sizes: big file {b.big_size / GiB:g} GiB; small files {b.n_small:,} x 150 KiB; "
        f"written small files {b.n_write:,}; checkpoint {b.ckpt_size / GiB:g} GiB "
        f"(dict of float32 tensors of 64 MiB). Figures are medians of up to {b.reps} "
        "repetitions (the samples are listed below the table; slow peers ran fewer).",
        f"- Latency origin (scenarios 1-5): a local directory behind airfs's own emulation "
        f"(`--emulate-latency {b.latency}`"
        + (f" `--emulate-bandwidth {b.bandwidth // MiB}M`" if b.bandwidth else "")
        + f"): {b.latency * 1000:g} ms per request"
        + (f" and one link of {b.bandwidth // MiB} MiB/s shared by all requests (about "
           f"{b.bandwidth * 8 / 1e9:.1f} Gbit/s: a remote-like store)" if b.bandwidth else "")
        + ". Its file sits in the page cache (primed after the drop), so the origin is "
        "\"memory behind a link\". Baselines that read the origin directly use the same "
        "`LatencyOrigin(PosixOrigin(dir), ...)` in-process.",
        "- Cold means: fresh cache directory, `echo 3 > /proc/sys/vm/drop_caches`, origin "
        "re-primed. Cached (2) means: remounted on the filled cache dir, page cache dropped, so "
        "the read comes from the local disk for airfs and for the pass-through alike.",
        "- rclone cannot be given the emulated latency: in 1b/2b it mounts the plain directory "
        "(a local remote, no latency; `--bwlimit` set to the same link rate), which favours it. "
        "In 6b it mounts SeaweedFS over S3 like airfs does. s3fs runs with its defaults plus "
        "path-style requests.",
        "- S3 (6-8): SeaweedFS (`weed mini`) on 127.0.0.1, started by "
        "`airfs.testing.seaweed`; its data sits on the same disk and the same 2 CPU cores as "
        "everything else, so every S3 figure includes the server's CPU use.",
        "- Bare pass-through (2a, 3b): `scripts/bench/passthrough.py`, pyfuse3 + trio, "
        "`os.pread` per request, `keep_cache`, `read_ahead_kb` 1024, 1 s entry/attr timeouts.",
        "",
        "## Results",
        "",
        table(b.rows),
        "",
        "Ratio is airfs / baseline for speeds (higher is better) and airfs time / baseline "
        "time for the torch.save return time (lower is better).",
        "",
        "## What each number means",
        "",
        "- 1a: MiB/s of a sequential 1 MiB-buffer read of the big file through a fresh airfs "
        "mount, against 16 threads reading 8 MiB ranges straight from the same emulated origin "
        "(the most the origin gives). 1a' repeats it without the bandwidth cap (info only: "
        "then the limit is the 2 CPU cores, not the link).",
        "- 1b: the same airfs figure against rclone `--vfs-cache-mode full` reading the file "
        "cold.",
        "- 2a/2b: the second read after a remount, page cache dropped: airfs serves from its "
        "cache directory; the pass-through from the local original; rclone from its VFS cache.",
        "- 3a: files/s of `airfs warm -j 256 MOUNT/small` (CLI wall time, listing included) "
        "against 256 Python threads listing the origin and copying each file to local disk "
        "through `LatencyOrigin.read_range`.",
        "- 3b: files/s of 32 threads doing open/read/close on every file through the mount, "
        "after the warm (cache files in the page cache), against the same pass through the "
        "bare pass-through over the local copy (in the page cache too).",
        "- 4a/8a: seconds until `torch.save` returns (file closed) into the mount vs to the "
        "local disk. 4b/8b: MiB/s of the commit: file size / time from the save's return "
        "until `airfs flush` returns, against a direct copy of the same local file to the "
        "origin (4: `LatencyOrigin.put` through the same emulation, which copies and fsyncs; "
        "8: obstore multipart put, 16 MiB parts, 8 in flight). airfs may already have "
        "started committing while the save ran, which this figure credits to it; the "
        "end-to-end figure is in the notes.",
        "- 5: files/s of one thread creating, writing and closing each file through the mount "
        "vs to local disk (no fsync either side); 5' is the flush that follows.",
        "- 6a: MiB/s of a cold read through airfs over S3 vs 16 threads of 8 MiB "
        "`obstore.get_range`; 6b vs the peers' cold reads.",
        "- 7: files/s of `airfs warm -j 256` over S3 vs 256 threads listing the prefix and "
        "GETting every object with obstore; 7' compares the wall time with the 22 s the seed "
        "published for this data set.",
        "",
        "## Notes from this run",
        "",
        *[f"- {n}" for n in b.notes],
        *[f"- Skipped: {s}" for s in b.skipped],
        "",
        "## Samples",
        "",
        *[f"- {r.num}: {r.samples}" for r in b.rows if r.samples],
        "",
    ]
    if a.extra_notes:
        lines[lines.index("## Samples"):lines.index("## Samples")] = [
            "## Analysis", "", Path(a.extra_notes).read_text().strip(), ""]  # fmt: skip
    return "\n".join(lines)


# -- main ---------------------------------------------------------------------------------------


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="scaled-down sizes for a smoke run")
    ap.add_argument("--only", nargs="+", choices=SCENARIOS, metavar="SCENARIO",
                    help=f"run only these ({', '.join(SCENARIOS)})")  # fmt: skip
    ap.add_argument("--reps", type=int, help="repetitions (default 3, quick 1)")
    ap.add_argument("--work", default="/tmp/airfs-bench", help="work directory (kept for reuse)")
    ap.add_argument("--latency", type=float, default=0.01, help="emulated origin latency, s")
    ap.add_argument("--bandwidth-mib", type=int, default=500,
                    help="emulated origin link, MiB/s (0: uncapped)")  # fmt: skip
    ap.add_argument("--output", default=str(REPO / "docs/benchmarks.md"))
    ap.add_argument("--no-write", action="store_true", help="print only")
    ap.add_argument("--extra-notes", help="a markdown file added to the page as 'Analysis'")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("run.py needs root (drop_caches, read_ahead_kb, fusermount)", file=sys.stderr)
        return 2
    if not mountfix.fuse_available():
        print("no /dev/fuse or fusermount3", file=sys.stderr)
        return 2
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    b = Bench(args, work)
    b.full = not args.quick  # type: ignore[attr-defined]
    b.latency = args.latency
    b.bandwidth = args.bandwidth_mib * MiB if args.bandwidth_mib else None
    b.reps = args.reps or (1 if args.quick else 3)
    if args.quick:
        b.big_size, b.n_small, b.n_write, b.ckpt_size = 256 * MiB, 2000, 1000, 256 * MiB
    else:
        b.big_size, b.n_small, b.n_write, b.ckpt_size = 2 * GiB, 15375, 5000, GiB
    started = dt.datetime.now(dt.UTC)
    t0 = time.monotonic()
    ensure_tools(b)
    funcs = {"cold": sc_cold, "cached": sc_cached, "small": sc_small, "ckpt": sc_ckpt,
             "smallwrite": sc_smallwrite, "s3cold": sc_s3cold, "s3small": sc_s3small,
             "s3ckpt": sc_s3ckpt}  # fmt: skip
    wanted = [s for s in SCENARIOS if not args.only or s in args.only]
    stack = contextlib.ExitStack()
    with stack:
        if any(s.startswith("s3") for s in wanted):
            pass  # the S3 server is started by the first S3 scenario and kept for the others
        for name in wanted:
            try:
                if name.startswith("s3") and "srv" not in b.state:
                    stack.enter_context(s3_env(b))
                funcs[name](b)
            except Exception as exc:
                traceback.print_exc()
                b.rows.append(Row("!", f"{name}: FAILED", f"{type(exc).__name__}: "
                                  f"{str(exc).splitlines()[0][:150] if str(exc) else ''}",
                                  "-", "-", None, "-", None))  # fmt: skip
    elapsed = time.monotonic() - t0
    print()
    print(table(b.rows))
    for n in b.notes + [f"skipped: {s}" for s in b.skipped]:
        print(" -", n)
    if not args.no_write:
        Path(args.output).write_text(write_doc(b, started, elapsed))
        print(f"\nwrote {args.output} ({elapsed / 60:.1f} min)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
