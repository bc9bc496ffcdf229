#!/usr/bin/env python3
"""Profile the daemon's cold S3 read path with py-spy (``pip install -e '.[bench]'``).

Starts SeaweedFS on loopback, uploads one ``--mib`` MiB object, mounts it (``--fuse``), reads
it once sequentially while ``py-spy record`` samples the daemon, and prints the read speed and
the functions holding most samples (self and inclusive), all threads together.

    .venv/bin/python scripts/bench/profile_cold.py --mib 512 --fuse kernel
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from airfs.testing.mountfix import mount, teardown

MiB = 1 << 20


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mib", type=int, default=512)
    ap.add_argument("--fuse", default="kernel")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--rate", type=int, default=200, help="samples per second")
    a, extra = ap.parse_known_args()
    import obstore
    from obstore.store import S3Store

    from airfs.testing.seaweed import seaweed_server

    work = Path(tempfile.mkdtemp(prefix="airfs-prof-"))
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    try:
        src = work / "src.bin"
        with open(src, "wb") as f:
            chunk = os.urandom(16 * MiB)
            for _ in range(a.mib // 16):
                f.write(chunk)
        (work / "sw").mkdir()
        with seaweed_server(work / "sw") as srv:
            store = S3Store(srv.bucket, endpoint=srv.endpoint, access_key_id=srv.access_key,
                            secret_access_key=srv.secret_key, region="us-east-1",
                            client_options={"allow_http": True, "timeout": "600s"})  # fmt: skip
            obstore.put(store, "p/big.bin", src, use_multipart=True, chunk_size=16 * MiB)
            (work / "mnt").mkdir()
            m = mount(srv.url("p"), work / "mnt", work / "cache", "--fuse", a.fuse,
                      "--s3-endpoint", srv.endpoint, "--s3-path-style", *extra,
                      env=srv.env)  # fmt: skip
            try:
                raw = work / "profile.txt"
                rec = subprocess.Popen([spy, "record", "-p", str(m.pid), "-r", str(a.rate),
                                        "-f", "raw", "-o", str(raw), "--threads",
                                        "--nonblocking"],
                                       stdout=subprocess.DEVNULL,
                                       stderr=subprocess.PIPE)  # fmt: skip
                time.sleep(1.0)
                fd = os.open(work / "mnt" / "big.bin", os.O_RDONLY)
                n, t0 = 0, time.perf_counter()
                while b := os.read(fd, MiB):
                    n += len(b)
                dt = time.perf_counter() - t0
                os.close(fd)
                rec.send_signal(2)
                rec.wait(30)
                print(f"cold read {n / MiB / dt:,.0f} MiB/s ({n / MiB:.0f} MiB, {a.fuse})")
            finally:
                m.umount()
                teardown(m, check=False)
        own: collections.Counter[str] = collections.Counter()
        incl: collections.Counter[str] = collections.Counter()
        total = 0
        for line in raw.read_text().splitlines():
            stack, _, count = line.rpartition(" ")
            c = int(count)
            frames = [fr.split(" (")[0] for fr in stack.split(";")[1:]]  # no thread name
            if not frames:
                continue
            total += c
            own[frames[-1]] += c
            for fr in set(frames):
                incl[fr] += c
        print(f"{total} samples")
        print("self:")
        for name, c in own.most_common(a.top):
            print(f"  {100 * c / total:5.1f}%  {name}")
        print("inclusive:")
        for name, c in incl.most_common(a.top):
            print(f"  {100 * c / total:5.1f}%  {name}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
