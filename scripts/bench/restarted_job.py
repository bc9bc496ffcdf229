"""The first pass of a restarted job (issue 22), one origin at a time, with the daemon's
per-operation latencies and origin calls, and optionally a py-spy profile of the daemon.

A directory of N cached 150 KiB files is read once through a fresh ``--fuse kernel`` mount
(filling the cache), then, ``--rounds`` times: unmount, drop the page cache, mount again on
the same cache dir, and read every file with 16 threads (``transport_t.read_many``); the local
disk's rate over the origin directory (POSIX) comes last. Root only (mounts,
``drop_caches``). Never run in CI.

    PYTHONPATH=$PWD .venv/bin/python scripts/bench/restarted_job.py --origin posix --files 2000
    ... --origin s3 --files 1000 --profile /tmp/s3.txt      # py-spy raw stacks of the last round
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import transport_t as tt
from perfile_sys import drop_caches, s3_args, s3_upload

from airfs.testing.mountfix import mount, teardown

KiB = 1024


def rounds(origin: str, names: list[str], work: Path, extra: tuple[str, ...], a: argparse.Namespace,
           env: dict[str, str] | None = None) -> None:  # fmt: skip
    mp, cache = work / "mnt", work / "cache"
    mp.mkdir(exist_ok=True)
    shutil.rmtree(cache, ignore_errors=True)
    m = mount(origin, mp, cache, *extra, "--fuse", "kernel", env=env)
    paths = [mp / "small" / n for n in names]
    try:
        tt.read_many(paths, 16)
    finally:
        m.umount()
        teardown(m)
    for r in range(a.rounds):
        drop_caches()
        m = mount(origin, mp, cache, *extra, "--fuse", "kernel", env=env)
        spy = None
        try:
            if a.profile and r == a.rounds - 1:
                spy = subprocess.Popen(
                    [str(Path(sys.executable).parent / "py-spy"), "record", "-p", str(m.pid),
                     "-o", a.profile, "-f", "raw", "-r", "200", "--nonblocking", "--threads"],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                )  # fmt: skip
                time.sleep(1.0)
            rate = tt.read_many(paths, 16)
            if spy is not None:
                spy.send_signal(2)
                spy.wait()
            st = m.status()
            lat = {k: f"{v['count']} x p50 {v['p50'] * 1e6:.0f} us"
                   for k, v in st["fs"]["latency"].items()}  # fmt: skip
            calls, maps = st["origin_calls"]["calls"], st["cache"].get("index_map_loads")
            print(f"round {r}: {rate:,.0f} files/s; origin calls {calls}; "
                  f"index map loads {maps}; {lat}", flush=True)  # fmt: skip
        finally:
            m.umount()
            teardown(m)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--origin", choices=["posix", "s3"], default="posix")
    ap.add_argument("--files", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--profile", help="py-spy raw stacks of the last round's daemon")
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="airfs-rj-", dir="/var/tmp"))
    try:
        origin_dir = work / "origin"
        local = tt.small_tree(origin_dir, a.files, 150 * KiB)
        names = [p.name for p in local]
        if a.origin == "posix":
            rounds(str(origin_dir), names, work, (), a)
        else:
            from airfs.testing.seaweed import seaweed_server

            with seaweed_server(work / "seaweed") as srv:
                s3_upload(srv, "rj/small", names, local[0].read_bytes())
                rounds(srv.url("rj"), names, work, s3_args(srv), a, {**os.environ, **srv.env})
        drop_caches()
        print(f"local disk: {tt.read_many(local, 16):,.0f} files/s")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
