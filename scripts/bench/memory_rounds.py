"""The daemon's memory over repeated load rounds, S3 (SeaweedFS) and POSIX origins.

    PYTHONPATH=. python scripts/bench/memory_rounds.py [--rounds N] [--files N] [--big N]
        [--big-mib M] [--only s3|posix] [--env K=V ...]

For each origin kind: one real mount (``airfs.testing.mountfix``; S3 through a SeaweedFS
started by ``airfs.testing.seaweed``). Each round creates a tree (``--files`` small files of
4 KiB in 20 directories and ``--big`` files of ``--big-mib`` MiB), flushes it to the origin
(``airfs flush``), ``stat``s and lists everything, reads everything back, deletes the tree
and flushes again. After each round the daemon's ``VmRSS`` and ``VmHWM`` (``/proc/PID/status``)
are recorded, and again after a pause (``--pause`` seconds, idle). With ``--report DIR`` the
daemon writes a memory report (:mod:`airfs.daemon.memdebug`) after mounting and after each pause.
``--env K=V`` is passed to the daemon (e.g. ``MALLOC_ARENA_MAX=2``). Prints a table; numbers
go to docs/benchmarks.md ("Daemon memory over load rounds"). Never run in CI.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import tempfile
import time
from pathlib import Path

from airfs.daemon import memdebug
from airfs.testing.mountfix import mount, teardown
from airfs.testing.seaweed import seaweed_server


def vm(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM of ``pid`` in MiB."""
    out: dict[str, int] = {}
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "VmHWM"):
                out[k] = int(v.split()[0]) // 1024
    return out


def load_round(root: Path, files: int, big: int, big_mib: int, m_flush: object) -> None:
    tree = root / "tree"
    tree.mkdir()
    small = os.urandom(4096)
    for d in range(20):
        (tree / f"d{d:02d}").mkdir()
    for i in range(files):
        (tree / f"d{i % 20:02d}" / f"f{i:05d}").write_bytes(small)
    chunk = os.urandom(1 << 20)
    for b in range(big):
        with open(tree / f"big{b}", "wb") as f:
            for _ in range(big_mib):
                f.write(chunk)
    m_flush()  # type: ignore[operator]
    for dirpath, _dirs, names in os.walk(tree):
        for n in names:
            os.stat(os.path.join(dirpath, n))
    for dirpath, _dirs, names in os.walk(tree):
        for n in names:
            with open(os.path.join(dirpath, n), "rb") as f:
                while f.read(1 << 20):
                    pass
    shutil.rmtree(tree)
    m_flush()  # type: ignore[operator]


def run_kind(
    kind: str, args: argparse.Namespace, tmp: Path, extra_env: dict[str, str]
) -> list[str]:
    rows: list[str] = []
    (tmp / "mnt").mkdir()

    def report(pid: int) -> None:
        if args.report:
            os.kill(pid, signal.SIGUSR2)
            time.sleep(3)

    def body(origin: str, env: dict[str, str], margs: list[str]) -> None:
        m = mount(origin, tmp / "mnt", tmp / "cache", *margs, env={**env, **extra_env})
        try:
            first = vm(m.pid)
            report(m.pid)
            rows.append(f"| {kind} | mounted | {first['VmRSS']} | {first['VmHWM']} | |")
            print(rows[-1], flush=True)
            for r in range(1, args.rounds + 1):
                t = time.monotonic()
                load_round(m.mountpoint, args.files, args.big, args.big_mib, m.flush)
                after = vm(m.pid)
                time.sleep(args.pause)
                idle = vm(m.pid)
                report(m.pid)
                rows.append(
                    f"| {kind} | {r} | {after['VmRSS']} | {after['VmHWM']} | {idle['VmRSS']} "
                    f"| {time.monotonic() - t:.0f} s |"
                )
                print(rows[-1], flush=True)
        finally:
            teardown(m)

    if kind == "posix":
        (tmp / "origin").mkdir()
        body(str(tmp / "origin"), {}, [])
    else:
        with seaweed_server(tmp / "seaweed") as srv:
            body(srv.url("mem"), dict(srv.env), ["--s3-endpoint", srv.endpoint])
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--files", type=int, default=3000)
    p.add_argument("--big", type=int, default=3)
    p.add_argument("--big-mib", type=int, default=32)
    p.add_argument("--pause", type=float, default=10.0)
    p.add_argument("--only", choices=["s3", "posix"])
    p.add_argument("--env", action="append", default=[], help="K=V for the daemon")
    p.add_argument("--report", help="DIR: memory reports of the daemon (airfs/memdebug.py)")
    args = p.parse_args()
    extra_env = dict(kv.split("=", 1) for kv in args.env)
    if args.report:
        extra_env[memdebug.ENV] = os.path.abspath(args.report)
    kinds = [args.only] if args.only else ["s3", "posix"]
    rows = []
    for kind in kinds:
        with tempfile.TemporaryDirectory(prefix=f"airfs-mem-{kind}-") as tmp:
            rows += run_kind(kind, args, Path(tmp), extra_env)
    print(f"\nrounds of {args.files} x 4 KiB + {args.big} x {args.big_mib} MiB; env {extra_env}")
    print("| origin | round | VmRSS MiB | VmHWM MiB | VmRSS after pause | round took |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(r)


if __name__ == "__main__":
    main()
