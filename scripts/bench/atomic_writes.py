#!/usr/bin/env python3
"""Atomic writes and name operations right after a close, on S3 (SeaweedFS on loopback):
airfs (and ``--before TREE``: airfs imported from another checkout, as ``airfs-before``),
s3fs, rclone mount and the local disk, side by side, interleaved per round.

Rows: *atomic writes/s* -- a temporary file written (``--small-kib``), closed and
``os.replace``d over its target, ``--atomic`` times in one directory (what git, pip, JSON
writers and checkpoint savers do); *rename / unlink just after close* -- a ``--big-mib`` file
written, closed, and 0.2 s later renamed (or deleted): the seconds the rename or unlink takes;
*unlink during an upload* -- the same unlink while the previous file's commit uploads;
*directory rename during uploads* -- ``--dir-files`` files of ``--big-mib`` written into a
temporary directory (a trainer's checkpoint), renamed into place 1 s after the last close
(airfs: their commits are uploading then): the seconds the rename takes.

    .venv/bin/python scripts/bench/atomic_writes.py --rounds 3 --before /tmp/before

Peers run with their default write paths (s3fs: a PUT at close, rename = copy + delete;
rclone: ``--vfs-cache-mode writes``). Not run in CI.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from airfs.testing.mountfix import mount, mount_from, teardown

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cold_s3 import log, proc_mount, rclone_remote

MiB, KiB = 1 << 20, 1 << 10


def atomic_writes(d: Path, n: int, data: bytes) -> float:
    """Atomic writes per second: ``n`` temporary files written, closed, renamed over one
    target."""
    t0 = time.perf_counter()
    for i in range(n):
        tmp = d / f".target.{i}.tmp"
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, d / "target")
    return n / (time.perf_counter() - t0)


def write_file(p: Path, mib: int, chunk: bytes) -> None:
    with open(p, "wb") as f:
        for _ in range(mib):
            f.write(chunk)


def after_close(d: Path, mib: int, chunk: bytes, op: str) -> float:
    """Seconds a rename (``op == "rename"``) or unlink of a ``mib`` MiB file takes 0.2 s
    after its close."""
    p = d / f"{op}.tmp"
    write_file(p, mib, chunk)
    time.sleep(0.2)
    t0 = time.perf_counter()
    if op == "rename":
        os.rename(p, d / f"{op}.final")
    else:
        os.unlink(p)
    return time.perf_counter() - t0


def unlink_during_upload(d: Path, mib: int, chunk: bytes) -> float:
    """A ``mib`` MiB file renamed into place (its commit then uploads it), a second one
    written and deleted 0.2 s after its close: the unlink's seconds."""
    write_file(d / "first.tmp", mib, chunk)
    os.rename(d / "first.tmp", d / "first")
    return after_close(d, mib, chunk, "unlink2")


def dir_rename_busy(d: Path, files: int, mib: int, chunk: bytes, r: int) -> float:
    """Seconds a rename of a directory of ``files`` new files of ``mib`` MiB takes 1 s after
    the last one was closed."""
    tmp = d / f"tmp-checkpoint-{r}"
    tmp.mkdir()
    for i in range(files):
        write_file(tmp / f"part-{i}.bin", mib, chunk)
    time.sleep(1.0)
    t0 = time.perf_counter()
    os.rename(tmp, d / f"checkpoint-{r}")
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--atomic", type=int, default=300, help="atomic writes per round")
    ap.add_argument("--small-kib", type=int, default=4)
    ap.add_argument("--big-mib", type=int, default=256)
    ap.add_argument("--dir-files", type=int, default=3)
    ap.add_argument("--only", default="local,airfs,s3fs,rclone")
    ap.add_argument("--before", type=Path, help="also mount airfs from this checkout")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    from airfs.testing.seaweed import seaweed_server

    work = Path(tempfile.mkdtemp(prefix="airfs-atomic-")).resolve()
    mount_from(work)
    systems = [s for s in a.only.split(",") if s]
    if a.before:
        systems.insert(systems.index("airfs") + 1 if "airfs" in systems else 0, "airfs-before")
        a.before = a.before.resolve()
    for peer in ("s3fs", "rclone"):
        if peer in systems and not shutil.which(peer):
            log(f"{peer} is not installed: skipped")
            systems.remove(peer)
    rows = ("atomic", "rename", "unlink", "unlink_busy", "dir_busy")
    vals: dict[str, dict[str, list[float]]] = {s: {r: [] for r in rows} for s in systems}
    small = os.urandom(a.small_kib * KiB)
    chunk = os.urandom(MiB)
    try:
        with seaweed_server(work / "sw") as srv:
            pw = work / "s3fs.passwd"
            pw.write_text(f"{srv.access_key}:{srv.secret_key}\n")
            pw.chmod(0o600)
            (work / "rclone.conf").touch()
            rclone_env = rclone_remote(srv)

            def measure(system: str, d: Path) -> None:
                v = vals[system]
                v["atomic"].append(atomic_writes(d, a.atomic, small))
                v["rename"].append(after_close(d, a.big_mib, chunk, "rename"))
                v["unlink"].append(after_close(d, a.big_mib, chunk, "unlink"))
                v["unlink_busy"].append(unlink_during_upload(d, a.big_mib, chunk))
                v["dir_busy"].append(
                    dir_rename_busy(d, a.dir_files, a.big_mib, chunk, len(v["dir_busy"]))
                )

            def one(system: str, r: int) -> None:
                mp = work / "mnt" / system
                prefix = f"r{r}-{system}"
                if system == "local":
                    d = work / "local" / prefix
                    d.mkdir(parents=True)
                    measure(system, d)
                    shutil.rmtree(d)
                    return
                mp.mkdir(parents=True, exist_ok=True)
                if system.startswith("airfs"):
                    env = dict(srv.env)
                    if system == "airfs-before":
                        env["PYTHONPATH"] = str(a.before)
                    cache = work / f"cache-{system}"
                    shutil.rmtree(cache, ignore_errors=True)
                    m = mount(srv.url(prefix), mp, cache, "--fuse", "kernel", "--s3-endpoint",
                              srv.endpoint, "--s3-path-style", env=env)  # fmt: skip
                    try:
                        measure(system, mp)
                    finally:
                        m.umount()
                        teardown(m, check=False)
                    return
                if system == "s3fs":
                    cmd = ["s3fs", f"{srv.bucket}:/{prefix}", str(mp), "-f",
                           "-o", f"passwd_file={pw}",
                           "-o", f"url={srv.endpoint}", "-o", "use_path_request_style",
                           "-o", "endpoint=us-east-1"]  # fmt: skip
                    env2: dict[str, str] = {}
                else:
                    cmd = ["rclone", "mount", f"sw:{srv.bucket}/{prefix}", str(mp), "--config",
                           str(work / "rclone.conf"), "--vfs-cache-mode", "writes",
                           "--cache-dir", str(work / f"cache-rclone-{r}")]  # fmt: skip
                    env2 = rclone_env
                if system == "s3fs":  # its prefix must exist
                    import obstore
                    from obstore.store import S3Store

                    store = S3Store(srv.bucket, endpoint=srv.endpoint,
                                    access_key_id=srv.access_key,
                                    secret_access_key=srv.secret_key, region="us-east-1",
                                    client_options={"allow_http": True})  # fmt: skip
                    obstore.put(store, f"{prefix}/", b"")
                with proc_mount(cmd, mp, work / f"{system}.log", env2):
                    measure(system, mp)

            for r in range(a.rounds):
                order = systems[r % len(systems) :] + systems[: r % len(systems)]
                for s in order:
                    log(f"round {r + 1}: {s}")
                    one(s, r)
                    v = vals[s]
                    log(f"  atomic {v['atomic'][-1]:,.0f}/s, rename {v['rename'][-1]:.3f} s, "
                        f"unlink {v['unlink'][-1]:.3f} s, "
                        f"unlink during upload {v['unlink_busy'][-1]:.3f} s, "
                        f"dir rename during uploads {v['dir_busy'][-1]:.3f} s")  # fmt: skip
    finally:
        shutil.rmtree(work, ignore_errors=True)
    labels = {
        "atomic": f"{a.small_kib} KiB atomic writes (write, close, os.replace), per s",
        "rename": f"rename of a {a.big_mib} MiB file 0.2 s after its close (s)",
        "unlink": f"unlink of a {a.big_mib} MiB file 0.2 s after its close (s)",
        "unlink_busy": f"the same unlink while another {a.big_mib} MiB file uploads (s)",
        "dir_busy": f"rename of a directory of {a.dir_files} new {a.big_mib} MiB files, 1 s "
        "after the last close (s)",
    }
    lines = [
        f"Run {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, median of {a.rounds} rounds.",
        "",
        "| row | " + " | ".join(systems) + " |",
        "| --- |" + " ---: |" * len(systems),
    ]
    for r in rows:
        cells = [f"{statistics.median(vals[s][r]):,.3g}" for s in systems]
        lines.append(f"| {labels[r]} | " + " | ".join(cells) + " |")
    lines += ["", "Samples:", ""]
    for s in systems:
        parts = "; ".join(r + " " + ", ".join(f"{x:.3g}" for x in vals[s][r]) for r in rows)
        lines.append(f"- {s}: {parts}")
    report = "\n".join(lines) + "\n"
    print(report)
    if a.out:
        a.out.write_text(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
