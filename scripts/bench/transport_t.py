#!/usr/bin/env python3
"""Issue 12's T1-T9: the kernel transport (with passthrough where the daemon may use it) and
the pyfuse3 adapter side by side, each row against its baseline measured in the same run
(A/B interleaved per repetition). Sizes are scaled to a shared 2-core machine (``--scale``
and the size options; the defaults are what ``docs/benchmarks.md`` reports).

    .venv/bin/python scripts/bench/transport_t.py --out /tmp/t.md   # root: mounts, passthrough

T1 cached sequential read after remount (page cache of the cache file and of the mount
dropped) vs reading the cache file itself; T2 the same read again (page cache warm) vs a read
of the cache file from the page cache; T3 32 readers over cached small files vs the same pass
over a local copy; T4 ``torch.save`` into the mount until it returns vs to local disk; T5 small
files written until close vs local disk; T6/T7 the torch pipeline epoch 2 (cached) vs the stock
DataLoader on local disk and epoch 1 vs the stock DataLoader over a plain (``--no-cache``)
mount; T8 ``stat`` of cached entries after the TTL expired vs local disk; T9 S3 (SeaweedFS on
loopback) cold sequential read vs raw parallel range GETs and the peers that are installed.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from airfs.testing.mountfix import Mounted, mount, teardown

MiB = 1 << 20
TRANSPORTS = ("kernel", "pyfuse3")
Row = dict[str, Any]


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def drop_file(path: str | Path, *, sync: bool = False) -> None:
    """Drop ``path``'s pages from the page cache (written back first with ``sync``: dirty
    pages are not dropped)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        if sync:
            os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def cache_files(cache: Path) -> list[str]:
    return [p for p in glob.glob(str(cache / "blocks/data/*/*")) if os.path.isfile(p)]


def read_speed(path: str | Path) -> float:
    fd = os.open(path, os.O_RDONLY)
    try:
        n, t0 = 0, time.perf_counter()
        while chunk := os.read(fd, MiB):
            n += len(chunk)
        return n / MiB / (time.perf_counter() - t0)
    finally:
        os.close(fd)


def read_many(paths: list[Path], threads: int) -> float:
    def work(part: list[Path]) -> None:
        for p in part:
            with open(p, "rb", buffering=0) as f:
                while f.read(MiB):
                    pass

    t0 = time.perf_counter()
    ts = [threading.Thread(target=work, args=(paths[i::threads],)) for i in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return len(paths) / (time.perf_counter() - t0)


@contextlib.contextmanager
def mounted(origin: str, mp: Path, cache: Path, *extra: str, env: dict[str, str] | None = None
            ) -> Iterator[Mounted]:  # fmt: skip
    mp.mkdir(parents=True, exist_ok=True)
    m = mount(origin, mp, cache, *extra, env=env)
    try:
        yield m
    finally:
        with contextlib.suppress(Exception):
            m.umount()
        teardown(m, check=False)


class Bench:
    def __init__(self, a: argparse.Namespace, work: Path) -> None:
        self.a = a
        self.work = work
        self.rows: list[Row] = []
        self.negotiated = ""
        self.notes: list[str] = []

    def mp(self, name: str) -> Path:
        return self.work / "mnt" / name

    def row(self, num: str, scen: str, vals: dict[str, list[float]], base: str,
            bv: list[float], unit: str, target: float, higher: bool = True) -> None:  # fmt: skip
        med = statistics.median
        r: Row = {"num": num, "scen": scen, "base": base, "bv": med(bv), "unit": unit,
             "target": target, "higher": higher, "vals": {k: med(v) for k, v in vals.items()},
             "samples": {**{k: v for k, v in vals.items()}, base: bv}}  # fmt: skip
        self.rows.append(r)
        ratios = {k: v / r["bv"] for k, v in r["vals"].items()}
        log(f"  {num} {scen}: " + ", ".join(f"{k} {v:,.1f}" for k, v in r["vals"].items())
            + f" | {base} {r['bv']:,.1f} {unit} | " + ", ".join(f"{k} {x:.2f}x"
                                                          for k, x in ratios.items()))  # fmt: skip

    def note_fuse(self, m: Mounted) -> None:
        f = m.status().get("fuse") or {}
        if f.get("protocol") and not self.negotiated:
            self.negotiated = (f"FUSE {f['protocol']}, max_write {f['max_write'] >> 10} KiB, "
                               f"passthrough {'on' if f.get('passthrough') else 'off'}; "
                               + " ".join(f["flags"]))  # fmt: skip


# -- T1, T2 ------------------------------------------------------------------------------------


def t1_t2(b: Bench) -> None:
    log("T1/T2 cached sequential read")
    origin = b.work / "o-big"
    origin.mkdir(exist_ok=True)
    big = origin / "big.bin"
    if not big.exists():
        with open(big, "wb") as f:
            chunk = os.urandom(16 * MiB)
            for _ in range(b.a.big_mib // 16):
                f.write(chunk)
    t1: dict[str, list[float]] = {t: [] for t in TRANSPORTS}
    t2: dict[str, list[float]] = {t: [] for t in TRANSPORTS}
    b1: list[float] = []
    b2: list[float] = []
    for t in TRANSPORTS:
        cache = b.work / f"cache-big-{t}"
        shutil.rmtree(cache, ignore_errors=True)
        with mounted(str(origin), b.mp(t), cache, "--fuse", t) as m:
            read_speed(m.mountpoint / "big.bin")  # fills the cache
            read_speed(m.mountpoint / "big.bin")  # kernel: passthrough (verified, recorded)
    for _ in range(b.a.reps):
        for t in TRANSPORTS:
            cache = b.work / f"cache-big-{t}"
            with mounted(str(origin), b.mp(t), cache, "--fuse", t) as m:
                b.note_fuse(m)
                files = cache_files(cache)
                for p in files:
                    drop_file(p, sync=True)
                drop_file(m.mountpoint / "big.bin")
                t1[t].append(read_speed(m.mountpoint / "big.bin"))
                t2[t].append(read_speed(m.mountpoint / "big.bin"))
            cf = max(files, key=os.path.getsize)
            drop_file(cf, sync=True)
            b1.append(read_speed(cf))
            b2.append(read_speed(cf))
    b.row("T1", "cached sequential read after remount, page cache dropped", t1,
          "read of the cache file itself", b1, "MiB/s", 0.9)  # fmt: skip
    b.row("T2", "the same read again (page cache warm)", t2,
          "read of the cache file from the page cache", b2, "MiB/s", 0.9)  # fmt: skip


# -- T3, T5, T8 --------------------------------------------------------------------------------


def small_tree(root: Path, n: int, size: int) -> list[Path]:
    d = root / "small"
    if not d.exists():
        d.mkdir(parents=True)
        blob = os.urandom(size)
        for i in range(n):
            (d / f"f{i:05d}").write_bytes(blob)
    return sorted(d.iterdir())


def t3(b: Bench) -> None:
    log("T3 32 readers over cached small files")
    origin = b.work / "o-small"
    local = small_tree(origin, b.a.small_files, 150 << 10)
    vals: dict[str, list[float]] = {t: [] for t in TRANSPORTS}
    base: list[float] = []
    for t in TRANSPORTS:
        cache = b.work / f"cache-small-{t}"
        shutil.rmtree(cache, ignore_errors=True)
        with mounted(str(origin), b.mp(t), cache, "--fuse", t) as m:
            paths = [m.mountpoint / "small" / p.name for p in local]
            read_many(paths, 32)  # into the cache
            for _ in range(b.a.reps):
                vals[t].append(read_many(paths, 32))
                base.append(read_many(local, 32))
    b.row("T3", f"32 readers, open/read/close of {len(local):,} cached 150 KiB files", vals,
          "the same pass over a local copy", base, "files/s", 0.3)  # fmt: skip


def write_files(d: Path, n: int, size: int) -> float:
    d.mkdir(parents=True)
    blob = os.urandom(size)
    t0 = time.perf_counter()
    for i in range(n):
        fd = os.open(d / f"w{i:05d}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        os.write(fd, blob)
        os.close(fd)
    return n / (time.perf_counter() - t0)


def t5(b: Bench) -> None:
    log("T5 small files written until close")
    origin = b.work / "o-write"
    origin.mkdir(exist_ok=True)
    local = b.work / "local-write"
    vals: dict[str, list[float]] = {t: [] for t in TRANSPORTS}
    base: list[float] = []
    for t in TRANSPORTS:
        with mounted(str(origin), b.mp(t), b.work / f"cache-w-{t}", "--fuse", t) as m:
            for r in range(b.a.reps):
                vals[t].append(write_files(m.mountpoint / f"{t}-{r}", b.a.write_files, 150 << 10))
                shutil.rmtree(local, ignore_errors=True)
                base.append(write_files(local, b.a.write_files, 150 << 10))
                m.flush()
    b.row("T5", f"{b.a.write_files:,} x 150 KiB files written until close", vals, "local disk",
          base, "files/s", 0.5)  # fmt: skip


def t8(b: Bench) -> None:
    log("T8 stat after the TTL")
    origin = b.work / "o-stat"
    d = origin / "many"
    if not d.exists():
        d.mkdir(parents=True)
        for i in range(b.a.stat_files):
            (d / f"e{i:05d}").write_bytes(b"")
    local = sorted(d.iterdir())
    vals: dict[str, list[float]] = {t: [] for t in TRANSPORTS}
    base: list[float] = []

    def stats(paths: list[Path]) -> float:
        t0 = time.perf_counter()
        for p in paths:
            os.stat(p)
        return len(paths) / (time.perf_counter() - t0)

    for t in TRANSPORTS:
        with mounted(str(origin), b.mp(t), b.work / f"cache-s-{t}", "--fuse", t) as m:
            paths = [m.mountpoint / "many" / p.name for p in local]
            os.listdir(m.mountpoint / "many")
            stats(paths)
            for _ in range(b.a.reps):
                time.sleep(1.2)  # the 1 s TTL expired
                vals[t].append(stats(paths))
                base.append(stats(local))
    b.row("T8", f"stat() of {len(local):,} cached entries after the TTL expired", vals,
          "local disk", base, "stats/s", 0.0)  # fmt: skip


# -- T4, T6, T7 (torch) ------------------------------------------------------------------------


def t4(b: Bench) -> None:
    import torch

    log("T4 torch.save until it returns")
    n = b.a.ckpt_mib // 64
    sd = {f"t{i}": torch.rand(16 * MiB) for i in range(n)}  # 64 MiB float32 tensors
    origin = b.work / "o-ckpt"
    origin.mkdir(exist_ok=True)
    local = b.work / "local-ckpt"
    local.mkdir(exist_ok=True)
    vals: dict[str, list[float]] = {t: [] for t in TRANSPORTS}
    base: list[float] = []

    def save(path: Path) -> float:
        t0 = time.perf_counter()
        torch.save(sd, path)
        return time.perf_counter() - t0

    for t in TRANSPORTS:
        with mounted(str(origin), b.mp(t), b.work / f"cache-c-{t}", "--fuse", t) as m:
            for r in range(b.a.reps):
                vals[t].append(save(m.mountpoint / f"{t}-{r}.pt"))
                base.append(save(local / f"{r}.pt"))
                m.flush()
    b.row("T4", f"torch.save {b.a.ckpt_mib} MiB until it returns (time)", vals,
          "torch.save to local disk", base, "s", 1.15, higher=False)  # fmt: skip


def t6_t7(b: Bench) -> None:
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import torch_pipeline as tp

    from airfs.data import DataLoader, VolumeDataset

    log("T6/T7 torch pipeline")
    origin = b.work / "o-img"
    tp.make_images(origin / "img", b.a.images)
    emulate = ["--emulate-latency", "0.01", "--emulate-bandwidth", "500M"]

    def drop() -> None:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")

    def epochs(make: Callable[[], Any], set_epoch: Callable[[int], None] | None) -> list[float]:
        loader, out = make(), []
        for e in range(2):
            if set_epoch is not None:
                set_epoch(e)
            drop()
            count, t0 = 0, time.perf_counter()
            for images, _ in loader:
                count += images.shape[0]
            out.append(count / (time.perf_counter() - t0))
        return out

    def stock(root: Path) -> Callable[[], Any]:
        paths = sorted(str(p) for p in root.rglob("*.raw"))
        return lambda: torch.utils.data.DataLoader(tp.StockImages(paths), batch_size=64,
                                                   shuffle=True, num_workers=2)  # fmt: skip

    e1: dict[str, list[float]] = {}
    e2: dict[str, list[float]] = {}
    for t in TRANSPORTS:
        cache = Path(tempfile.mkdtemp(prefix=f"img-{t}-", dir=b.work))
        with mounted(str(origin), b.mp(t), cache, "--fuse", t, *emulate) as m:
            ds = VolumeDataset(m.mountpoint / "img", pattern="*.raw")
            def make(ds: Any = ds) -> Any:
                return DataLoader(tp.Decoded(ds), batch_size=64, num_workers=2)

            r = epochs(make, ds.set_epoch)
            e1[t], e2[t] = [r[0]], [r[1]]
    with mounted(str(origin), b.mp("plain"), b.work / "cache-plain", *emulate, "--no-cache") as m:
        plain = epochs(stock(m.mountpoint / "img"), None)
    local = epochs(stock(origin / "img"), None)
    b.row("T6", f"torch pipeline epoch 2, all cached ({b.a.images:,} images)", e2,
          "stock DataLoader on local disk (epoch 2)", [local[1]], "images/s", 0.8)  # fmt: skip
    b.row("T7", "the same, epoch 1", e1, "stock DataLoader over a plain --no-cache mount",
          [plain[0]], "images/s", 5.0)  # fmt: skip


# -- T9 (S3) -----------------------------------------------------------------------------------


def t9(b: Bench) -> None:
    import obstore
    from obstore.store import S3Store

    from airfs.testing.seaweed import seaweed_server

    log("T9 S3 cold sequential read")
    size = b.a.s3_mib * MiB
    src = b.work / "s3src.bin"
    with open(src, "wb") as f:
        chunk = os.urandom(16 * MiB)
        for _ in range(b.a.s3_mib // 16):
            f.write(chunk)
    sw = b.work / "seaweed"
    shutil.rmtree(sw, ignore_errors=True)
    sw.mkdir()
    with seaweed_server(sw) as srv:
        store = S3Store(srv.bucket, endpoint=srv.endpoint, access_key_id=srv.access_key,
                        secret_access_key=srv.secret_key, region="us-east-1",
                        client_options={"allow_http": True, "timeout": "600s"})  # fmt: skip
        obstore.put(store, "bench/big.bin", src, use_multipart=True, chunk_size=16 * MiB,
                    max_concurrency=8)  # fmt: skip
        vals: dict[str, list[float]] = {t: [] for t in TRANSPORTS}
        raw: list[float] = []

        def get(off: int) -> int:
            return len(obstore.get_range(store, "bench/big.bin", start=off,
                                         length=min(8 * MiB, size - off)))  # fmt: skip

        for _ in range(b.a.reps):
            for t in TRANSPORTS:
                cache = b.work / f"cache-s3-{t}"
                shutil.rmtree(cache, ignore_errors=True)
                with mounted(srv.url("bench"), b.mp(t), cache, "--fuse", t, "--s3-endpoint",
                             srv.endpoint, "--s3-path-style", env=srv.env) as m:  # fmt: skip
                    vals[t].append(read_speed(m.mountpoint / "big.bin"))
            t0 = time.perf_counter()
            with ThreadPoolExecutor(16) as ex:
                got = sum(ex.map(get, range(0, size, 8 * MiB)))
            assert got == size
            raw.append(size / MiB / (time.perf_counter() - t0))
        b.row("T9", f"S3 cold {b.a.s3_mib} MiB sequential read", vals,
              "raw parallel 16x8 MiB get_range", raw, "MiB/s", 0.8)  # fmt: skip
        peers = {n: shutil.which(n) for n in ("s3fs", "rclone")}
        if peers["s3fs"]:
            pw = b.work / "s3fs.passwd"
            pw.write_text(f"{srv.access_key}:{srv.secret_key}\n")
            pw.chmod(0o600)
            s3: list[float] = []
            for _ in range(b.a.reps):
                mp = b.mp("s3fs")
                mp.mkdir(parents=True, exist_ok=True)
                p = subprocess.Popen(["s3fs", f"{srv.bucket}:/bench", str(mp), "-f", "-o",
                                      f"passwd_file={pw}", "-o", f"url={srv.endpoint}", "-o",
                                      "use_path_request_style", "-o", "endpoint=us-east-1"],
                                     stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)  # fmt: skip
                try:
                    deadline = time.monotonic() + 20
                    while not os.path.ismount(mp) and time.monotonic() < deadline:
                        time.sleep(0.1)
                    s3.append(read_speed(mp / "big.bin"))
                finally:
                    subprocess.run(["fusermount3", "-u", "-z", str(mp)], capture_output=True)
                    p.terminate()
                    p.wait(20)
            b.row("T9", "S3 cold sequential read", vals, "s3fs (defaults)", s3, "MiB/s", 1.2)
        else:
            b.notes.append("T9: s3fs is not installed here; not measured.")
        b.notes.append("T9: rclone is not run by this script (run.py's scenario 6b mounts it).")


# -- report ------------------------------------------------------------------------------------


def table(b: Bench) -> str:
    out = ["| # | scenario | kernel | pyfuse3 | baseline | baseline value | kernel ratio | "
           "pyfuse3 ratio | target | kernel met |",
           "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in b.rows:
        ratios = {k: v / r["bv"] for k, v in r["vals"].items()}
        k = ratios.get("kernel")
        if r["target"] == 0:
            tgt, met = "report", "-"
        elif r["higher"]:
            tgt, met = f">= {r['target']:g}x", ("yes" if k is not None and k >= r["target"]
                                               else "**no**")  # fmt: skip
        else:
            tgt, met = f"<= {r['target']:g}x (time)", ("yes" if k is not None and
                                                      k <= r["target"] else "**no**")  # fmt: skip
        u = r["unit"]
        out.append(f"| {r['num']} | {r['scen']} | {r['vals'].get('kernel', 0):,.1f} {u} | "
                   f"{r['vals'].get('pyfuse3', 0):,.1f} {u} | {r['base']} | {r['bv']:,.1f} {u} |"
                   f" {ratios.get('kernel', 0):.2f}x | {ratios.get('pyfuse3', 0):.2f}x | {tgt} |"
                   f" {met} |")  # fmt: skip
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default="T1,T3,T4,T5,T6,T8,T9",
                    help="comma-separated scenarios (T1 covers T2, T6 covers T7)")  # fmt: skip
    ap.add_argument("--big-mib", type=int, default=512)
    ap.add_argument("--small-files", type=int, default=2000)
    ap.add_argument("--write-files", type=int, default=1000)
    ap.add_argument("--ckpt-mib", type=int, default=256)
    ap.add_argument("--images", type=int, default=1000)
    ap.add_argument("--stat-files", type=int, default=10000)
    ap.add_argument("--s3-mib", type=int, default=512)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--work", default=None)
    ap.add_argument("--out", default=None)
    ap.add_argument("--json", default=None, help="the rows as JSON too (for scripts/bench/ab.py)")
    a = ap.parse_args()
    work = Path(a.work or tempfile.mkdtemp(prefix="airfs-t-"))
    b = Bench(a, work)
    started = time.monotonic()
    fns = {"T1": t1_t2, "T3": t3, "T4": t4, "T5": t5, "T6": t6_t7, "T8": t8, "T9": t9}
    for name in a.only.split(","):
        try:
            fns[name.strip()](b)
        except Exception as exc:  # one failing scenario does not lose the others
            log(f"{name} failed: {exc!r}")
            b.notes.append(f"{name} failed in this run: {exc!r}")
    text = (f"Run {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
            f"{(time.monotonic() - started) / 60:.1f} min, median of {a.reps}. "
            f"Kernel transport: {b.negotiated or 'n/a'}.\n\n" + table(b) + "\n\n"
            + "\n".join(f"- {n}" for n in b.notes) + "\n\nSamples:\n\n"
            + "\n".join(f"- {r['num']} {k}: " + ", ".join(f"{x:,.1f}" for x in v)
                        for r in b.rows for k, v in r["samples"].items()) + "\n")  # fmt: skip
    print(text)
    if a.out:
        Path(a.out).write_text(text)
    if a.json:
        keep = ("num", "scen", "vals", "base", "bv", "unit", "higher")
        Path(a.json).write_text(json.dumps([{k: r[k] for k in keep} for r in b.rows]))
    if not a.work:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
