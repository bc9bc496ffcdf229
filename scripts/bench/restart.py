#!/usr/bin/env python3
"""Hand-over of a ``--restartable`` mount (issue 25): what a reader sees while the daemon is
replaced.

    .venv/bin/python scripts/bench/restart.py [--rounds 5] [--size-mb 256] [--origin DIR]

Mounts a POSIX origin (a temporary one with a file of ``--size-mb``, or ``--origin`` with a
file ``big`` in it) with ``--restartable --fuse kernel --no-cache``, starts a reader job
(:mod:`airfs.testing.jobs`: 1 MiB ``O_DIRECT`` reads, so each reaches the daemon, ``--pause``
apart, its cwd and a mapping in the mount), then
alternately ``airfs restart`` and ``kill -9`` of the daemon, ``--rounds`` of each. Reports:

* ``airfs restart``: the hand-over the command reports (request to the new daemon serving)
  and the gap the mount had (the old daemon's last answered request to the new one's first
  answer, seen by a prober asking ``statfs`` every 2 ms);
* crash take-over: ``kill -9`` to the first answer, the same prober;
* the reader's read latency: p50/p99/max over the run, and p99 of a run without hand-overs.

Every read must succeed and return the file's bytes (checked); the numbers are printed as a
JSON record and a table. Never run in CI.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

AIRFS = [sys.executable, "-m", "airfs.cli"]


def status_pid(mp: Path) -> int | None:
    p = subprocess.run([*AIRFS, "status", str(mp), "--json"], capture_output=True, text=True)
    if p.returncode != 0:
        return None
    return int(json.loads(p.stdout)["pid"])


class Prober:
    """``statfs`` of the mount every 2 ms (statfs always reaches the daemon): the gaps."""

    def __init__(self, mp: Path) -> None:
        self.mp = mp
        self.stop = False
        self.answers: list[float] = []  # monotonic times of answers
        self.t = threading.Thread(target=self.run, daemon=True)
        self.t.start()

    def run(self) -> None:
        while not self.stop:
            os.statvfs(self.mp)
            self.answers.append(time.monotonic())
            time.sleep(0.002)

    def first_after(self, t: float) -> float:
        """The first answer after ``t`` (waits for it)."""
        while True:
            later = [a for a in self.answers[-200:] if a > t]
            if later:
                return later[0]
            time.sleep(0.005)


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))] if s else 0.0


def summary(xs: list[float]) -> dict[str, float]:
    return {"median": statistics.median(xs), "max": max(xs)}


def reader(mp: Path, pause: float) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "airfs.testing.jobs", "reader", str(mp), "big", str(1 << 20),
         str(pause), "direct"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip


def finish(proc: subprocess.Popen[str], want: str) -> list[float]:
    out, _ = proc.communicate(timeout=1800)
    got = json.loads(out)
    if got["error"] or got["read"] != want or got["mmap"] != want:
        raise SystemExit(f"the reader failed: {got['error'] or 'bytes differ'}")
    return [x * 1000 for x in got["latencies"]]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--size-mb", type=int, default=256)
    ap.add_argument("--origin", default=None)
    ap.add_argument("--pause", type=float, default=0.08, help="between reads (s)")
    ap.add_argument(
        "--settle",
        type=float,
        default=2.5,
        help="after each hand-over (s): long enough for the holder's standby to be loaded",
    )
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="airfs-restart-bench-"))
    origin = Path(args.origin) if args.origin else tmp / "origin"
    if not args.origin:
        origin.mkdir()
        with open(origin / "big", "wb") as f:
            for _ in range(args.size_mb):
                f.write(os.urandom(1 << 20))
    want = hashlib.sha256((origin / "big").read_bytes()).hexdigest()
    mp = tmp / "mnt"
    mp.mkdir()
    subprocess.run(
        [*AIRFS, "mount", "--origin", str(origin), "--cache-dir", str(tmp / "cache"),
         "--restartable", "--fuse", "kernel", "--no-cache", "-q", str(mp)],
        check=True,
    )  # fmt: skip
    rec: dict[str, Any] = {}
    try:
        base = finish(reader(mp, args.pause), want)
        prober = Prober(mp)
        job = reader(mp, args.pause)
        time.sleep(0.5)
        restart_cmd: list[float] = []
        restart_gap: list[float] = []
        crash_gap: list[float] = []
        for _ in range(args.rounds):
            t0 = time.monotonic()
            p = subprocess.run([*AIRFS, "restart", str(mp)], capture_output=True, text=True)
            if p.returncode != 0:
                raise SystemExit(p.stderr)
            restart_cmd.append((time.monotonic() - t0) * 1000)
            # the gap: the longest stretch without an answer during the command
            ans = [a for a in prober.answers if t0 <= a <= time.monotonic()]
            pts = [t0, *ans]
            restart_gap.append(max(b - a for a, b in itertools.pairwise(pts)) * 1000)
            time.sleep(args.settle)
            pid = status_pid(mp)
            assert pid is not None
            t1 = time.monotonic()
            os.kill(pid, signal.SIGKILL)
            crash_gap.append((prober.first_after(t1) - t1) * 1000)
            time.sleep(args.settle)
        lat = finish(job, want)
        prober.stop = True
        rec = {
            "rounds": args.rounds,
            "restart_command_ms": {
                "median": statistics.median(restart_cmd),
                "max": max(restart_cmd),
            },
            "restart_gap_ms": {"median": statistics.median(restart_gap), "max": max(restart_gap)},
            "crash_takeover_ms": {"median": statistics.median(crash_gap), "max": max(crash_gap)},
            "reader_ms": {"p50": pct(lat, 0.5), "p99": pct(lat, 0.99), "max": max(lat)},
            "reader_without_handover_ms": {"p50": pct(base, 0.5), "p99": pct(base, 0.99)},
        }
    finally:
        subprocess.run([*AIRFS, "umount", str(mp)], capture_output=True)
        if str(mp) not in Path("/proc/mounts").read_text():
            shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps(rec))
    for k, v in rec.items():
        if isinstance(v, dict):
            print(f"{k:30s} " + "  ".join(f"{a} {b:8.1f}" for a, b in v.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
