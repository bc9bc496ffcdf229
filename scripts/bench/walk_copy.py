#!/usr/bin/env python3
"""One copy at a time over a directory of cold small files (``find | xargs -P 1 -n 32 cp``)
through a kernel-transport mount of a POSIX origin that emulates ``--latency`` seconds per
request: the row of issue 23's fetch-ahead (a directory read in its listing's order). With
``--before TREE`` the rounds alternate with mounts of that checkout (its daemon imports it).

    PYTHONPATH=$PWD .venv/bin/python scripts/bench/walk_copy.py --files 500 --rounds 4 \\
        --before /tmp/old-checkout

Prints each round (files/s, ``fs.fetched_ahead``, ``prefetch.warmed``) and a JSON summary.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from airfs.testing.mountfix import mount, mount_from, teardown


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", type=int, default=500)
    ap.add_argument("--kib", type=int, default=150)
    ap.add_argument("--latency", default="0.01", help="seconds per origin request")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--before", type=Path, help="another checkout, alternated with this one")
    a = ap.parse_args()
    before = a.before.resolve() if a.before else None
    work = Path(tempfile.mkdtemp(prefix="airfs-walk-"))
    mount_from(work)
    try:
        src = work / "origin" / "small"
        src.mkdir(parents=True)
        payload = os.urandom(a.kib << 10)
        for i in range(a.files):
            (src / f"{i:06d}.bin").write_bytes(payload)
        trees = ["after", "before"] if before else ["after"]
        res: dict[str, list[float]] = {t: [] for t in trees}
        for r in range(a.rounds):
            for label in trees if r % 2 == 0 else trees[::-1]:
                env = {"PYTHONPATH": str(before)} if label == "before" else None
                shutil.rmtree(work / "cache", ignore_errors=True)
                (work / "mnt").mkdir(exist_ok=True)
                m = mount(str(work / "origin"), work / "mnt", work / "cache", "--fuse", "kernel",
                          "--emulate-latency", a.latency, env=env)  # fmt: skip
                try:
                    dest = work / "dest"
                    shutil.rmtree(dest, ignore_errors=True)
                    dest.mkdir()
                    t0 = time.perf_counter()
                    cmd = f"find {work / 'mnt' / 'small'} -type f | xargs -P 1 -n 32 cp -t {dest}"
                    subprocess.run(["bash", "-c", cmd], check=True)
                    rate = a.files / (time.perf_counter() - t0)
                    st = m.status()
                    res[label].append(round(rate, 1))
                    print(f"round {r + 1} {label}: {rate:,.1f} files/s, fetched_ahead "
                          f"{st['fs'].get('fetched_ahead')}, warmed {st['prefetch']['warmed']}",
                          flush=True)  # fmt: skip
                finally:
                    m.umount()
                    teardown(m, check=False)
        print(json.dumps({"files": a.files, "latency_s": float(a.latency), "files_per_s": res}))
    finally:
        os.chdir("/")
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
