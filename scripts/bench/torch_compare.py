#!/usr/bin/env python3
"""Benchmark for the torch package against its baselines, in one run (issue 6).

    .venv/bin/python scripts/bench/torch_compare.py [--files 5000] [--latency 0.01] [--out F]

An origin directory holds ``--files`` raw images of ~100 KiB (see ``torch_pipeline.py``); it
is served with the emulated remote latency (``--emulate-latency``, ``--emulate-bandwidth``) by

* an airfs mount (block cache, prefetch): ``VolumeDataset`` + ``airfs.data.DataLoader``;
* an airfs ``--no-cache`` mount over the same latency origin, standing for a plain network
  mount (every read goes to the origin; the kernel page cache still helps): a stock
  ``torch.utils.data.DataLoader`` over the same files;
* and the local directory itself, the limit, with the stock loader.

The kernel page cache is dropped before every epoch (a data set larger than RAM), which
leaves airfs's on-disk block cache in place. Then a DCP checkpoint of ``--ckpt-gib`` GiB over
2 ranks: ``VolumeWriter`` through the airfs mount (time until ``latest_checkpoint`` sees it,
i.e. committed at the origin) against torch's ``FileSystemWriter`` straight to the origin
directory, and how long ``async_save`` blocks. Needs root (drop_caches, mounts).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch_pipeline as tp

from airfs.data import DataLoader, VolumeDataset
from airfs.testing.mountfix import mount, teardown


def drop_caches() -> None:
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def epochs(make_loader: Any, n: int, set_epoch: Any = None) -> list[float]:
    loader = make_loader()
    out = []
    for epoch in range(n):
        if set_epoch is not None:
            set_epoch(epoch)
        drop_caches()
        count, t0 = 0, time.perf_counter()
        for images, _ in loader:
            count += images.shape[0]
        out.append(count / (time.perf_counter() - t0))
    return out


def stock(root: Path, batch: int, workers: int) -> Any:
    paths = sorted(str(p) for p in root.rglob("*.raw"))
    return lambda: torch.utils.data.DataLoader(
        tp.StockImages(paths), batch_size=batch, shuffle=True, num_workers=workers
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", type=int, default=5000)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--latency", type=float, default=0.01)
    ap.add_argument("--bandwidth", default="500M")
    ap.add_argument("--ckpt-gib", type=float, default=1.0)
    ap.add_argument("--work", default="/tmp/airfs-torch-bench")
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    a = ap.parse_args()
    work = Path(a.work)
    origin = work / "origin"
    tp.make_images(origin / "bench-images", a.files)
    emulate = ["--emulate-latency", str(a.latency), "--emulate-bandwidth", a.bandwidth]
    res: dict[str, Any] = {
        "files": a.files,
        "batch": a.batch,
        "workers": a.workers,
        "latency_s": a.latency,
        "bandwidth": a.bandwidth,
    }

    for name in ("airfs", "plain"):
        mnt = work / f"mnt-{name}"
        mnt.mkdir(exist_ok=True)
        cache = Path(tempfile.mkdtemp(prefix=f"airfs-{name}-", dir=work))
        extra = emulate + (["--no-cache"] if name == "plain" else [])
        m = mount(str(origin), mnt, cache, *extra)
        try:
            root = mnt / "bench-images"
            if name == "airfs":
                ds = VolumeDataset(root, pattern="*.raw")
                res["airfs_mount"] = epochs(
                    lambda ds=ds: DataLoader(
                        tp.Decoded(ds), batch_size=a.batch, num_workers=a.workers
                    ),
                    2,
                    ds.set_epoch,
                )
                res["airfs_status_cache"] = {
                    k: m.status()["cache"][k] for k in ("origin_bytes_read", "hit_bytes")
                }
            else:
                res["stock_plain_mount"] = epochs(stock(root, a.batch, a.workers), 2)
        finally:
            teardown(m, check=False)
        print(json.dumps(res, indent=1), flush=True)
    res["stock_local_disk"] = epochs(stock(origin / "bench-images", a.batch, a.workers), 2)
    print(json.dumps(res, indent=1), flush=True)

    # DCP: VolumeWriter through the mount vs FileSystemWriter straight to the origin directory
    mnt = work / "mnt-airfs"
    m = mount(str(origin), mnt, Path(tempfile.mkdtemp(prefix="airfs-ckpt-", dir=work)), *emulate)
    try:
        ns = argparse.Namespace(data_dir=str(mnt), ckpt_gib=a.ckpt_gib)
        res["dcp_airfs_mount"] = [r for r in tp.bench_checkpoint(ns) if "Volume" in r["writer"]]
    finally:
        teardown(m, check=False)
    ns = argparse.Namespace(data_dir=str(origin), ckpt_gib=a.ckpt_gib)
    res["dcp_origin_dir"] = [r for r in tp.bench_checkpoint(ns) if "Volume" not in r["writer"]]
    print(json.dumps(res, indent=1))
    if a.out:
        Path(a.out).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
