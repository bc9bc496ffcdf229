"""Issue 23's small-file row with the daemon's counters: N cold small objects in one S3
directory (SeaweedFS on loopback, ``airfs/testing/seaweed.py``) copied out of a fresh airfs
mount with the seed's ``find | xargs -P JOBS -n 32 cp``, and what it cost: files/s, CPU
seconds of the daemon, of SeaweedFS and of the whole machine, origin requests by kind, FUSE
requests by kind and the daemon's revalidation counters (``airfs status --json``).

``cold_s3.py`` measures the same row side by side with s3fs and rclone; this one says where a
run's requests and CPU went (the stop-33 diagnosis in ``docs/benchmarks.md``). Run it from
any directory: the mount imports the ``airfs`` this script imports.

    PYTHONPATH=$PWD .venv/bin/python scripts/bench/small_copy.py --files 15000 --rounds 2
    ... --airfs-args "--ttl 300"      # names kept as long as the peers keep theirs
    ... --warm --rounds 3             # `airfs warm -j 256` instead, beside a raw 256-thread GET
    ... --py-spy /tmp/prof            # a py-spy profile of the daemon per round (SPY_ARGS:
                                      # its options, default "--gil -r 200"; it slows the run)
    ... --before /tmp/before          # each round also mounts from that checkout (its daemon
                                      # imports airfs from there), the order alternating
    ... --cache-fs 8192               # the cache directories on a new ext4 file system (a loop
                                      # image of 8 GiB, made and removed here)

``--cache-fs``: this machine's root file system is an ext4 *without a journal* that has seen
many files come and go; there, ext4 checks every free inode it considers against the inode
table for a recent deletion (``recently_deleted``, journal-less mode only), and creating a
file costs ~0.3 ms of kernel time (15,000 empty files: 4.5 s of system time, against 0.3 s on
a new ext4 with its journal). A warm creates a cache file per object, so on the root file
system a quarter of the daemon's CPU went there (``perf``, stop 40). A node's cache disk is
its own file system: ``--cache-fs`` measures that case; without it, the root's.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from airfs.testing.mountfix import airfs_cmd, mount, mount_from, teardown

KiB = 1 << 10


def proc_cpu(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (0 when it is gone)."""
    try:
        f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def named_cpu(comm: str) -> float:
    """CPU seconds of every process named ``comm`` (SeaweedFS's ``weed``)."""
    total = 0.0
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                st = Path(f"/proc/{d}/stat").read_text()
            except OSError:
                continue
            if st[st.index("(") + 1 : st.rindex(")")] == comm:
                total += proc_cpu(int(d))
    return total


def machine_cpu() -> tuple[float, float]:
    """(busy, all) CPU seconds of the machine so far."""
    v = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    hz = os.sysconf("SC_CLK_TCK")
    return (sum(v) - v[3] - v[4]) / hz, sum(v) / hz


def drop_caches() -> None:
    """``sync`` and drop the kernel's caches. On a journal-less ext4 (this VM's root) a new
    inode is not taken from those deleted in the last 30-180 s while their inode table block
    is cached (``recently_deleted``): after a round's 15,000 cache files are removed, each
    file the next round creates scans past them (~1 ms of system CPU per file, measured)."""
    subprocess.run(["sync"], check=True)
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def one_round(
    srv: Any,
    work: Path,
    files: int,
    jobs: int,
    extra: list[str],
    *,
    warm: bool,
    spy: Path | None,
    drop: bool,
    tree: Path | None = None,
    cache_root: Path | None = None,
) -> dict[str, Any]:
    """One fresh mount and empty cache: the copy (or ``airfs warm -j JOBS``) and its costs;
    ``spy``: a py-spy profile of the daemon meanwhile (``--gil``: what holds the GIL);
    ``tree``: the daemon (and ``airfs warm``) import ``airfs`` from that checkout;
    ``cache_root``: where the cache directory is made (default: ``work``)."""
    mp, cache, dest = work / "mnt", (cache_root or work) / "cache", work / "dest"
    mp.mkdir(exist_ok=True)
    shutil.rmtree(cache, ignore_errors=True)
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir()
    if drop:
        drop_caches()
    env = dict(srv.env)
    if tree is not None:
        env["PYTHONPATH"] = str(tree)
    m = mount(srv.url("bench"), mp, cache, "--fuse", "kernel", "--s3-endpoint", srv.endpoint,
              "--s3-path-style", *extra, env=env)  # fmt: skip
    try:
        spy_p = None
        if spy is not None:
            args = os.environ.get("SPY_ARGS", "--gil -r 200").split()  # py-spy's options
            cmd = ["py-spy", "record", *args, "-f", "raw", "-o", str(spy), "-p", str(m.pid)]
            spy_p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(1.0)
        d0, w0, s0 = proc_cpu(m.pid), named_cpu("weed"), machine_cpu()
        t0 = time.perf_counter()
        if warm:
            subprocess.run([*airfs_cmd(), "warm", "-q", "-j", str(jobs), str(mp / "small")],
                           check=True, env={**os.environ, **env})  # fmt: skip
        else:
            cmd = f"find {mp}/small -type f | xargs -P {jobs} -n 32 cp -t {dest}"
            subprocess.run(["bash", "-c", cmd], check=True)
        dt = time.perf_counter() - t0
        d1, w1, s1 = proc_cpu(m.pid), named_cpu("weed"), machine_cpu()
        if spy_p is not None:
            spy_p.send_signal(2)
            spy_p.wait(60)
        if not warm and len(os.listdir(dest)) != files:
            raise RuntimeError(f"copied {len(os.listdir(dest))} of {files} files")
        st = json.loads(subprocess.run([*airfs_cmd(), "status", "--json", str(mp)],
                                       capture_output=True, check=True).stdout)  # fmt: skip
    finally:
        m.umount()
        teardown(m, check=False)
    fs = st["fs"]
    return {
        "files_s": round(files / dt, 1),
        "seconds": round(dt, 1),
        "cpu_daemon_s": round(d1 - d0, 1),
        "cpu_weed_s": round(w1 - w0, 1),
        "machine_busy": f"{s1[0] - s0[0]:.1f} of {s1[1] - s0[1]:.1f} s",
        "origin_calls": st["origin_calls"]["calls"],
        "fuse_ops": fs["ops"],
        "relists": fs["relists"],
        "fast_opens": fs["fast_opens"],
        "fetched_at_lookup": st["cache"].get("fetched_at_lookup"),
        "warm_bytes": st["cache"].get("warm_bytes"),
        "index_flushes": st["cache"].get("index_flushes"),
        "latency_p50_s": {k: v["p50"] for k, v in fs["latency"].items()},
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", type=int, default=15000)
    ap.add_argument("--kib", type=int, default=150)
    ap.add_argument("--jobs", type=int, default=256, help="xargs -P of the copy")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--airfs-args", default="", help="more `airfs mount` options")
    ap.add_argument("--json", type=Path, help="write the rounds here too")
    ap.add_argument("--warm", action="store_true",
                    help="`airfs warm -j JOBS` instead of the copy, and a raw JOBS-thread GET "
                         "of the same objects in the same run (issue 23's warm row)")  # fmt: skip
    ap.add_argument("--drop-caches", action="store_true",
                    help="sync and drop the kernel's caches before each round, after the last "
                         "round's files are removed (see drop_caches)")  # fmt: skip
    ap.add_argument("--py-spy", type=Path, help="a --gil raw profile of the daemon per round "
                    "(FILE.N)")  # fmt: skip
    ap.add_argument("--cache-fs", type=int, metavar="MIB",
                    help="put the cache on a new ext4 (a loop image of MIB MiB; module doc)")
    ap.add_argument("--before", type=Path,
                    help="another checkout: each round mounts from it too (order alternating)")
    a = ap.parse_args()

    import obstore
    from obstore.store import S3Store

    from airfs.testing.seaweed import seaweed_server

    work = Path(tempfile.mkdtemp(prefix="airfs-small-copy-")).resolve()
    if a.json is not None:
        a.json = a.json.resolve()
    mount_from(work)
    rounds = []
    cache_root: Path | None = None
    try:
        if a.cache_fs:
            img, cache_root = work / "cache.img", work / "cachefs"
            cache_root.mkdir()
            with open(img, "wb") as f:
                f.truncate(a.cache_fs << 20)
            subprocess.run(["mkfs.ext4", "-q", "-F", str(img)], check=True)
            subprocess.run(["mount", "-o", "loop", str(img), str(cache_root)], check=True)
        with seaweed_server(work / "sw") as srv:
            store = S3Store(srv.bucket, endpoint=srv.endpoint, access_key_id=srv.access_key,
                            secret_access_key=srv.secret_key, region="us-east-1",
                            client_options={"allow_http": True})  # fmt: skip
            payload = os.urandom(a.kib * KiB)
            names = [f"bench/small/{i:06d}.bin" for i in range(a.files)]
            with ThreadPoolExecutor(32) as ex:
                list(ex.map(lambda n: obstore.put(store, n, payload), names))
            trees: list[Path | None] = [None] if a.before is None else [None, a.before.resolve()]
            for r in range(a.rounds):
                spy = None if a.py_spy is None else a.py_spy.with_name(f"{a.py_spy.name}.{r + 1}")
                for tree in trees if r % 2 == 0 else trees[::-1]:
                    extra = a.airfs_args.split()
                    got = one_round(srv, work, a.files, a.jobs, extra, warm=a.warm, spy=spy,
                                    drop=a.drop_caches, tree=tree,
                                    cache_root=cache_root)  # fmt: skip
                    got["tree"] = "this" if tree is None else "before"
                    if a.warm:
                        os.sync()  # the cache's writeback is not the raw GETs' to wait for
                        t0 = time.perf_counter()
                        with ThreadPoolExecutor(a.jobs) as ex:
                            list(ex.map(lambda n: bytes(obstore.get(store, n).bytes()), names))
                        got["raw_files_s"] = round(a.files / (time.perf_counter() - t0), 1)
                        got["ratio_raw"] = round(got["files_s"] / got["raw_files_s"], 2)
                    rounds.append(got)
                    print(f"round {r + 1}: {json.dumps(got)}", flush=True)
    finally:
        if cache_root is not None and os.path.ismount(cache_root):
            subprocess.run(["umount", str(cache_root)], check=False)
        shutil.rmtree(work, ignore_errors=True)
    if a.json is not None:
        a.json.write_text(json.dumps(rounds, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
