#!/usr/bin/env python3
"""Benchmark: an image-classification input pipeline and DCP checkpoints over a directory.

    .venv/bin/python scripts/bench/torch_pipeline.py DATA_DIR [--files 20000] [--json out.json]

DATA_DIR is the volume under test: a plain directory, or a directory on an airfs mount. The
script makes ``DATA_DIR/bench-images`` (``--files`` files of ~100 KiB: raw 3x184x184 uint8
images, in 100 class directories) unless it is already there, then measures:

1. **Input pipeline**, two epochs each, images/s:
   - ``airfs``: ``VolumeDataset`` -> decoding wrapper -> ``airfs.data.DataLoader``. Before
     epoch 1 the dataset's local cache is emptied (off a mount), so epoch 1 copies every file.
   - ``stock``: a map-style dataset over the same paths -> ``torch.utils.data.DataLoader``
     (``shuffle=True``, torch's defaults otherwise), reading the directory directly.
   Decoding is ``torch.frombuffer`` + ``interpolate`` to 3x64x64 (torch ops, no PIL); with
   ``--step-ms`` the consumer also sleeps that long per batch, standing in for the GPU step.
   Before each pipeline's epoch 1 the kernel page cache of the source files is dropped
   (``posix_fadvise(DONTNEED)``, per file; on a mount this does not empty the daemon's cache).
2. **DCP checkpoint** of ``--ckpt-gib`` GiB sharded over 2 ranks (gloo, CPU, 127.0.0.1):
   for torch's ``FileSystemWriter`` and airfs's ``VolumeWriter``, the time from the call until
   ``latest_checkpoint`` sees the checkpoint complete, for ``dcp.save`` and ``dcp.async_save``,
   and how long ``async_save`` blocks the caller.

Results are printed as a table; ``--json`` writes them too.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import socket
import sys
import tempfile
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset, IterableDataset

SIDE = 184  # 3 * 184 * 184 = 101,568 bytes, about 100 KiB
OUT_SIDE = 64
CLASSES = 100


# ------------------------------------------------------------------------------ data set


def make_images(root: Path, count: int) -> list[Path]:
    """``count`` raw images under ``root`` (kept if already there)."""
    paths = [root / f"c{i % CLASSES:03d}" / f"img{i:06d}.raw" for i in range(count)]
    missing = [p for p in paths if not p.exists()]
    if missing:
        print(f"writing {len(missing)} files of {3 * SIDE * SIDE} bytes under {root} ...")
        for d in {p.parent for p in missing}:
            d.mkdir(parents=True, exist_ok=True)
        for p in missing:
            p.write_bytes(os.urandom(3 * SIDE * SIDE))
    return paths


def decode(path: str) -> tuple[torch.Tensor, int]:
    """Raw CHW bytes -> float image resized to 3x64x64, and the class from the directory."""
    with open(path, "rb") as f:
        raw = bytearray(f.read())
    img = torch.frombuffer(raw, dtype=torch.uint8).reshape(1, 3, SIDE, SIDE).float() / 255
    img = F.interpolate(img, size=(OUT_SIDE, OUT_SIDE), mode="bilinear", align_corners=False)
    return img[0], int(os.path.basename(os.path.dirname(path))[1:])


class Decoded(IterableDataset):
    """The seed document's wrapper shape: paths in, tensors out."""

    def __init__(self, paths: IterableDataset) -> None:
        self.paths = paths

    def __iter__(self):
        for p in self.paths:
            yield decode(p)


class StockImages(Dataset):
    """What one writes without airfs: a list of paths, read where they are."""

    def __init__(self, paths: list[str]) -> None:
        self.paths = paths

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return decode(self.paths[i])


def drop_page_cache(paths: list[Path]) -> None:
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def run_epochs(loader: Any, epochs: int, step_s: float, set_epoch: Any = None) -> list[dict]:
    out = []
    for epoch in range(epochs):
        if set_epoch is not None:
            set_epoch(epoch)
        n = 0
        t0 = time.perf_counter()
        for images, _labels in loader:
            n += images.shape[0]
            if step_s:
                time.sleep(step_s)
        dt = time.perf_counter() - t0
        out.append({"epoch": epoch + 1, "images": n, "seconds": dt, "images_per_s": n / dt})
    return out


def bench_pipeline(args: argparse.Namespace, files: list[Path]) -> dict:
    from airfs.control.client import find_mount
    from airfs.data import DataLoader, VolumeDataset

    root = Path(args.data_dir) / "bench-images"
    step_s = args.step_ms / 1000
    results: dict[str, Any] = {"on_mount": find_mount(str(root)) is not None}

    cache_dir = args.cache_dir or tempfile.mkdtemp(prefix="airfs-bench-cache-")
    shutil.rmtree(cache_dir, ignore_errors=True)
    drop_page_cache(files)
    ds = VolumeDataset(root, cache_dir=cache_dir, pattern="*.raw")
    loader = DataLoader(Decoded(ds), batch_size=args.batch, num_workers=args.workers)
    results["airfs"] = run_epochs(loader, args.epochs, step_s, ds.set_epoch)
    st = loader.stats()
    results["airfs_stats"] = {
        "consumer_wait_s": st.wait_s,
        "fetch_wait_s": st.fetch_wait_s,
        "origin_copies": st.origin_copies,
        "cache_hits": st.cache_hits,
    }
    del loader
    shutil.rmtree(cache_dir, ignore_errors=True)

    drop_page_cache(files)
    stock = torch.utils.data.DataLoader(
        StockImages(sorted(map(str, files))),
        batch_size=args.batch,
        shuffle=True,
        num_workers=args.workers or 2,
    )
    results["stock"] = run_epochs(stock, args.epochs, step_s)
    return results


# ------------------------------------------------------------------------------ checkpoints


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ckpt_rank(rank: int, world: int, port: int, args: dict, queue: Any) -> None:
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard

    from airfs.data.checkpoint import VolumeWriter, latest_checkpoint

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=600),
    )
    mesh = init_device_mesh("cpu", (world,))
    total = int(args["gib"] * (1 << 30))
    tensors = 8
    rows = total // 4 // tensors // 1024 // world  # float32, 1024 columns
    gen = torch.Generator().manual_seed(rank)
    state = {
        f"layer{i}": DTensor.from_local(
            torch.rand(rows, 1024, generator=gen), mesh, [Shard(0)], run_check=False
        )
        for i in range(tensors)
    }
    parent = Path(args["dir"])
    writers = {"torch FileSystemWriter": dcp.FileSystemWriter, "airfs VolumeWriter": VolumeWriter}
    results = []
    for mode in ("save", "async_save"):
        for name, cls in writers.items():
            path = parent / f"{name.split()[1]}-{mode}"
            dist.barrier()
            seen = threading.Event()
            t0 = time.perf_counter()
            seen_at: list[float] = []

            def poll(
                path: Path = path,
                t0: float = t0,
                seen: threading.Event = seen,
                seen_at: list[float] = seen_at,
            ) -> None:
                while not seen.is_set():
                    if latest_checkpoint(parent) == str(path):
                        seen_at.append(time.perf_counter() - t0)
                        return
                    time.sleep(0.002)

            poller = threading.Thread(target=poll) if rank == 0 else None
            if poller:
                poller.start()
            if mode == "save":
                dcp.save(state, storage_writer=cls(str(path)))
                blocked = time.perf_counter() - t0
            else:
                fut = dcp.async_save(state, storage_writer=cls(str(path)))
                blocked = time.perf_counter() - t0
                fut.result()
            done = time.perf_counter() - t0
            if poller:
                poller.join(60)
                seen.set()
                results.append(
                    {
                        "writer": name,
                        "mode": mode,
                        "caller_blocked_s": blocked,
                        "call_done_s": done,
                        "visible_s": seen_at[0] if seen_at else None,
                    }
                )
            dist.barrier()
            if rank == 0:
                shutil.rmtree(path)
    if rank == 0:
        queue.put(results)
    dist.barrier()
    dist.destroy_process_group()


def bench_checkpoint(args: argparse.Namespace) -> list[dict]:
    ckdir = Path(args.data_dir) / "bench-checkpoints"
    shutil.rmtree(ckdir, ignore_errors=True)
    ckdir.mkdir(parents=True)
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = _free_port()
    conf = {"gib": args.ckpt_gib, "dir": str(ckdir)}
    procs = [ctx.Process(target=_ckpt_rank, args=(r, 2, port, conf, queue)) for r in range(2)]
    for p in procs:
        p.start()
    results = queue.get(timeout=1800)
    for p in procs:
        p.join(120)
        if p.exitcode != 0:
            raise RuntimeError(f"checkpoint rank exited with {p.exitcode}")
    shutil.rmtree(ckdir, ignore_errors=True)
    return results


# ------------------------------------------------------------------------------------ main


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("data_dir", help="the volume directory to benchmark (plain or airfs mount)")
    ap.add_argument("--files", type=int, default=20_000)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument(
        "--workers", type=int, default=None, help="DataLoader workers (default: airfs's)"
    )
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--step-ms", type=float, default=0.0, help="simulated compute per batch")
    ap.add_argument("--cache-dir", default=None, help="VolumeDataset local cache (default: temp)")
    ap.add_argument("--ckpt-gib", type=float, default=1.0)
    ap.add_argument("--skip-data", action="store_true")
    ap.add_argument("--skip-ckpt", action="store_true")
    ap.add_argument("--json", default=None, help="also write the results here")
    args = ap.parse_args(argv)

    from airfs.data.loader import default_num_workers

    if args.workers is None:
        args.workers = default_num_workers()
    out: dict[str, Any] = {
        "data_dir": args.data_dir,
        "files": args.files,
        "batch": args.batch,
        "workers": args.workers,
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
    }
    if not args.skip_data:
        files = make_images(Path(args.data_dir) / "bench-images", args.files)
        out["pipeline"] = pipe = bench_pipeline(args, files)
        print(f"\ninput pipeline: {args.files} files, batch {args.batch}, {args.workers} workers")
        print(f"{'loader':<8} {'epoch':>5} {'images/s':>10} {'seconds':>9}")
        for name in ("airfs", "stock"):
            for r in pipe[name]:
                print(f"{name:<8} {r['epoch']:>5} {r['images_per_s']:>10.0f} {r['seconds']:>9.2f}")
        print("airfs loader:", json.dumps(pipe["airfs_stats"]))
    if not args.skip_ckpt:
        out["checkpoint"] = ck = bench_checkpoint(args)
        print(f"\nDCP checkpoint: {args.ckpt_gib} GiB over 2 ranks")
        print(f"{'writer':<24} {'mode':<11} {'blocked s':>9} {'done s':>8} {'visible s':>9}")
        for r in ck:
            vis = f"{r['visible_s']:.2f}" if r["visible_s"] is not None else "never"
            print(
                f"{r['writer']:<24} {r['mode']:<11} {r['caller_blocked_s']:>9.2f} "
                f"{r['call_done_s']:>8.2f} {vis:>9}"
            )
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
