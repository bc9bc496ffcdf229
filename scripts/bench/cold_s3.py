#!/usr/bin/env python3
"""Issue 23: cold reads from S3 side by side in one run — airfs, s3fs, rclone mount and raw
ranged GETs of the same objects on the same SeaweedFS (``airfs/testing/seaweed.py``, loopback).

``--before TREE`` adds ``airfs-before``: the same mount with its daemon importing ``airfs``
from another checkout, measured in the same rounds.

Every round (``--rounds``, the order of the systems rotating each round) gives each system a
fresh mount with an empty cache and measures, cold:

- ``big``: one ``--big-mib`` object read sequentially (``read`` calls of ``--read-kib``,
  1 MiB by default), MiB/s;
- ``four``: ``--four-mib`` objects, 4 of them, read sequentially by 4 threads at once (1 MiB
  ``read`` calls), MiB/s of all four together (``--four-mib 0`` skips it);
- ``small``: ``--small`` objects of ``--small-kib`` copied out of the mount with the seed's
  recipe, ``find DIR -type f | xargs -P JOBS -n 32 cp -t DEST``, files/s.

For airfs (and airfs-before), ``--cached-p99`` also reads 200 more small objects once
(cached), then times whole-file reads of them by one thread (open, read, close) for 2 s with
nothing else running and again during the cold read of a second big object (after the rows
above, which run alone): p50 and p99 of each, "a cold read never stalls other work"; a second
thread reads copies of the same files from the local disk at the same
time, the control (what the machine's load alone does to a read's latency).

``raw`` is the same client library airfs uses (obstore): 16 threads of 8 MiB ``get_range`` for
the big object, ``--jobs`` threads of one GET per small object. The report gives each round's
values and the ratios measured in the same round (medians over the rounds).

The peers are Debian's packages, not needed by the tests: ``apt-get install -y s3fs rclone``
(``AIRFS_BENCH_PEERS=1 scripts/setup.sh`` installs them). s3fs runs with ``parallel_count=16,
multireq_max=16`` (its documented parallel-read flags); rclone with ``--vfs-cache-mode full
--vfs-read-chunk-size 8M --buffer-size 64M``. A missing peer is skipped and said so.

    .venv/bin/python scripts/bench/cold_s3.py --big-mib 1024 --small 2000 --rounds 3 \\
        --out /tmp/cold_s3.md --json /tmp/cold_s3.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from airfs.testing.mountfix import airfs_cmd, fusermount_unmount, mount, mount_from, teardown

MiB, KiB = 1 << 20, 1 << 10
SYSTEMS = ("airfs", "s3fs", "rclone", "raw")


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def read_speed(path: Path, size: int = MiB) -> float:
    """MiB/s of one sequential read of ``path`` in ``read``s of ``size`` bytes."""
    fd = os.open(path, os.O_RDONLY)
    try:
        n, t0 = 0, time.perf_counter()
        while chunk := os.read(fd, size):
            n += len(chunk)
        return n / MiB / (time.perf_counter() - t0)
    finally:
        os.close(fd)


def read_four(paths: list[Path]) -> float:
    """Read ``paths`` sequentially, one thread each, all at once; MiB/s of all of them."""
    t0 = time.perf_counter()
    with ThreadPoolExecutor(len(paths)) as ex:
        n = sum(ex.map(lambda p: read_all(p), paths))
    return n / MiB / (time.perf_counter() - t0)


def read_all(path: Path) -> int:
    fd = os.open(path, os.O_RDONLY)
    try:
        n = 0
        while chunk := os.read(fd, MiB):
            n += len(chunk)
        return n
    finally:
        os.close(fd)


class CachedReads:
    """Whole-file reads of cached files by one thread, timed (ms), while ``running``: the
    whole read (``times``) and its phases (``phases``: ``open`` -- the path's lookups and the
    open --, ``read`` and ``close``)."""

    def __init__(self, paths: list[Path]) -> None:
        self.paths = paths
        self.times: list[float] = []
        self.phases: dict[str, list[float]] = {"open": [], "read": [], "close": []}
        self.running = True
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        i = 0
        ph = self.phases
        while self.running:
            t0 = time.perf_counter()
            fd = os.open(self.paths[i % len(self.paths)], os.O_RDONLY)
            t1 = time.perf_counter()
            try:
                while os.read(fd, MiB):
                    pass
            finally:
                t2 = time.perf_counter()
                os.close(fd)
            t3 = time.perf_counter()
            self.times.append((t3 - t0) * 1e3)
            ph["open"].append((t1 - t0) * 1e3)
            ph["read"].append((t2 - t1) * 1e3)
            ph["close"].append((t3 - t2) * 1e3)
            i += 1

    def __enter__(self) -> CachedReads:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.running = False
        self.thread.join()

    def p(self, q: float, phase: str = "") -> float:
        xs = sorted(self.phases[phase] if phase else self.times)
        return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` (all its threads) so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def copy_out(src: Path, dest: Path, jobs: int, expect: int) -> float:
    """The seed's recipe; files/s."""
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    t0 = time.perf_counter()
    cmd = f"find {src} -type f | xargs -P {jobs} -n 32 cp -t {dest}"
    subprocess.run(["bash", "-c", cmd], check=True)
    dt = time.perf_counter() - t0
    got = len(os.listdir(dest))
    if got != expect:
        raise RuntimeError(f"copied {got} of {expect} files out of {src}")
    shutil.rmtree(dest, ignore_errors=True)
    return expect / dt


def rclone_remote(srv: Any) -> dict[str, str]:
    """The environment that defines rclone's remote ``sw:`` as the SeaweedFS server ``srv``."""
    return {
        "RCLONE_CONFIG_SW_TYPE": "s3", "RCLONE_CONFIG_SW_PROVIDER": "Other",
        "RCLONE_CONFIG_SW_ACCESS_KEY_ID": srv.access_key,
        "RCLONE_CONFIG_SW_SECRET_ACCESS_KEY": srv.secret_key,
        "RCLONE_CONFIG_SW_ENDPOINT": srv.endpoint, "RCLONE_CONFIG_SW_REGION": "us-east-1",
        "RCLONE_CONFIG_SW_FORCE_PATH_STYLE": "true",
    }  # fmt: skip


@contextlib.contextmanager
def proc_mount(cmd: list[str], mp: Path, logf: Path, env: dict[str, str]) -> Iterator[None]:
    """A peer's foreground FUSE daemon: wait for its mount; always unmount, stop it by PID."""
    mp.mkdir(parents=True, exist_ok=True)
    full = {**os.environ, **env}
    full.pop("AWS_CA_BUNDLE", None)
    with open(logf, "ab") as lf:
        p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=lf, stderr=subprocess.STDOUT,
                             env=full, start_new_session=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not os.path.ismount(mp):
            if p.poll() is not None:
                raise RuntimeError(f"{cmd[0]} exited {p.returncode}: {logf.read_text()[-800:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{cmd[0]} did not mount within 60 s")
            time.sleep(0.05)
        yield
    finally:
        fusermount_unmount(mp)
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(10)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--big-mib", type=int, default=1024)
    ap.add_argument("--read-kib", type=int, default=1024,
                    help="size of each read of the big object (the tar-like streaming of a "
                         "shard reads 10 KiB at a time)")  # fmt: skip
    ap.add_argument("--small", type=int, default=2000, help="number of small objects")
    ap.add_argument("--small-kib", type=int, default=150)
    ap.add_argument("--four-mib", type=int, default=512,
                    help="size of each of the 4 objects read at once (0: skip that row)")
    ap.add_argument("--cached-p99", action="store_true",
                    help="airfs: latency of cached reads alone and during the cold big read")
    ap.add_argument("--jobs", type=int, default=64, help="xargs -P of the copy, raw GET threads")
    ap.add_argument("--warm", action="store_true",
                    help="also `airfs warm -j JOBS` of the small files on a fresh mount and empty "
                         "cache (row warm; raw: its small row, JOBS threads of GETs)")  # fmt: skip
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--airfs-args", default="",
                    help="more `airfs mount` options for the airfs systems (e.g. '--ttl 300': "
                         "names and listings kept as long as rclone's dir cache)")  # fmt: skip
    ap.add_argument("--only", default=",".join(SYSTEMS))
    ap.add_argument("--work", type=Path, help="work directory (default: a temporary one)")
    ap.add_argument("--out", type=Path, help="markdown report")
    ap.add_argument("--json", type=Path, help="raw values")
    ap.add_argument("--label", default="busy shared 2-core machine")
    ap.add_argument("--chart", type=Path, help="PNG of the medians and rounds (matplotlib)")
    ap.add_argument("--replot", type=Path, help="only draw --chart from this --json file")
    ap.add_argument("--before", type=Path,
                    help="also mount airfs from this checkout (system airfs-before: its daemon "
                         "imports airfs from there), for a before/after in the same run")
    a = ap.parse_args()
    if a.replot:
        if not a.chart:
            ap.error("--replot needs --chart")
        chart(json.loads(a.replot.read_text())["values"], a.chart, a.label)
        return 0

    import obstore
    from obstore.store import S3Store

    from airfs.testing.seaweed import seaweed_server

    work = a.work or Path(tempfile.mkdtemp(prefix="airfs-cold-s3-"))
    work.mkdir(parents=True, exist_ok=True)
    # airfs-before's mounts must import --before, not the checkout this runs from
    for name in ("out", "json", "chart", "before"):
        if getattr(a, name) is not None:
            setattr(a, name, getattr(a, name).resolve())
    work = work.resolve()
    mount_from(work)
    systems = [s for s in a.only.split(",") if s]
    if a.before:
        systems.insert(1, "airfs-before")
    for peer in ("s3fs", "rclone"):
        if peer in systems and not shutil.which(peer):
            log(f"{peer} is not installed (apt-get install -y {peer}): skipped")
            systems.remove(peer)
    size = a.big_mib * MiB
    vals: dict[str, dict[str, list[float]]] = {
        s: {"big": [], "four": [], "small": [], "warm": []} for s in systems
    }
    #: airfs and airfs-before (--cached-p99): per round, cached whole-file reads' p50/p99 (ms)
    #: alone and during the cold big read
    lat: dict[str, list[dict[str, float]]] = {s: [] for s in systems if s.startswith("airfs")}
    #: the airfs daemons' CPU seconds per GiB of the big read (steadier than MiB/s when busy)
    cpu: dict[str, list[float]] = {s: [] for s in systems if s.startswith("airfs")}
    try:
        (work / "sw").mkdir(exist_ok=True)
        with seaweed_server(work / "sw") as srv:
            store = S3Store(srv.bucket, endpoint=srv.endpoint, access_key_id=srv.access_key,
                            secret_access_key=srv.secret_key, region="us-east-1",
                            client_options={"allow_http": True, "timeout": "600s"})  # fmt: skip
            log(f"uploading {a.big_mib} MiB + {a.small} x {a.small_kib} KiB")
            src = work / "big.src"
            with open(src, "wb") as f:
                chunk = os.urandom(16 * MiB)
                for _ in range(max(1, a.big_mib // 16)):
                    f.write(chunk)
            for name in ["bench/big.bin", *(["bench/big2.bin"] if a.cached_p99 else [])]:
                obstore.put(store, name, src, use_multipart=True, chunk_size=16 * MiB,
                            max_concurrency=8)  # fmt: skip
            src.unlink()
            four = [f"bench/four/{i}.bin" for i in range(4)] if a.four_mib else []
            if four:
                src4 = work / "four.src"
                with open(src4, "wb") as f:
                    chunk = os.urandom(16 * MiB)
                    for _ in range(max(1, a.four_mib // 16)):
                        f.write(chunk)
                for name in four:
                    obstore.put(store, name, src4, use_multipart=True, chunk_size=16 * MiB,
                                max_concurrency=8)  # fmt: skip
                src4.unlink()
            size4 = max(1, a.four_mib // 16) * 16 * MiB
            payload = os.urandom(a.small_kib * KiB)
            names = [f"bench/small/{i:06d}.bin" for i in range(a.small)]
            warm_names = [f"bench/warm/{i:03d}.bin" for i in range(200 if a.cached_p99 else 0)]
            with ThreadPoolExecutor(32) as ex:  # the warm ones apart: the small row stays cold
                list(ex.map(lambda n: obstore.put(store, n, payload), names + warm_names))
            pw = work / "s3fs.passwd"
            pw.write_text(f"{srv.access_key}:{srv.secret_key}\n")
            pw.chmod(0o600)
            rclone_env = rclone_remote(srv)
            (work / "rclone.conf").touch()

            def warm_rate(system: str, mp: Path, env: dict[str, str]) -> float:
                """``airfs warm -j JOBS`` of the small files, fresh mount, empty cache."""
                cache = work / f"cache-{system}-warm"
                shutil.rmtree(cache, ignore_errors=True)
                m = mount(srv.url("bench"), mp, cache, "--fuse", "kernel", "--s3-endpoint",
                          srv.endpoint, "--s3-path-style", *a.airfs_args.split(),
                          env=env)  # fmt: skip
                try:
                    cli = [*airfs_cmd(), "warm", "-q", "-j", str(a.jobs)]
                    t0 = time.perf_counter()
                    subprocess.run([*cli, str(mp / "small")], check=True, env={**os.environ, **env},
                                   capture_output=True)  # fmt: skip
                    return float(a.small / (time.perf_counter() - t0))
                finally:
                    m.umount()
                    teardown(m, check=False)

            def one(system: str) -> None:
                mp = work / "mnt" / system
                dest = work / "dest"
                if system == "raw":
                    t0 = time.perf_counter()
                    with ThreadPoolExecutor(16) as ex:
                        got = sum(ex.map(lambda off: len(obstore.get_range(
                            store, "bench/big.bin", start=off, length=min(8 * MiB, size - off))),
                            range(0, size, 8 * MiB)))  # fmt: skip
                    assert got == size
                    vals[system]["big"].append(size / MiB / (time.perf_counter() - t0))
                    if four:
                        ranges = [(n, off) for n in four for off in range(0, size4, 8 * MiB)]
                        t0 = time.perf_counter()
                        with ThreadPoolExecutor(16) as ex:
                            got = sum(ex.map(lambda r: len(obstore.get_range(
                                store, r[0], start=r[1], length=min(8 * MiB, size4 - r[1]))),
                                ranges))  # fmt: skip
                        assert got == 4 * size4
                        vals[system]["four"].append(got / MiB / (time.perf_counter() - t0))
                    t0 = time.perf_counter()
                    with ThreadPoolExecutor(a.jobs) as ex:
                        list(ex.map(lambda n: bytes(obstore.get(store, n).bytes()), names))
                    vals[system]["small"].append(a.small / (time.perf_counter() - t0))
                    if a.warm:
                        vals[system]["warm"].append(vals[system]["small"][-1])
                    return
                ctx: contextlib.AbstractContextManager[Any]
                env = dict(srv.env)
                if system == "airfs-before":
                    env["PYTHONPATH"] = str(a.before)
                if system.startswith("airfs"):
                    cache = work / f"cache-{system}"
                    shutil.rmtree(cache, ignore_errors=True)
                    mp.mkdir(parents=True, exist_ok=True)
                    m = mount(srv.url("bench"), mp, cache, "--fuse", "kernel", "--s3-endpoint",
                              srv.endpoint, "--s3-path-style", *a.airfs_args.split(),
                              env=env)  # fmt: skip

                    @contextlib.contextmanager
                    def airfs_ctx() -> Iterator[None]:
                        try:
                            if a.cached_p99:
                                warm = sorted((mp / "warm").iterdir())
                                # the control: the same files on the local disk, read by a
                                # second thread at the same time (what the machine's load
                                # alone does to a read's latency)
                                local_dir = work / "warm-local"
                                local_dir.mkdir(exist_ok=True)
                                for p_ in warm:
                                    (local_dir / p_.name).write_bytes(p_.read_bytes())
                                local = sorted(local_dir.iterdir())
                                with CachedReads(warm) as alone, CachedReads(local) as l_alone:
                                    time.sleep(2.0)
                            c0 = cpu_seconds(m.pid)
                            big = read_speed(mp / "big.bin", a.read_kib * 1024)
                            vals[system]["big"].append(big)
                            cpu[system].append((cpu_seconds(m.pid) - c0) / (size / (1 << 30)))
                            if four:
                                vals[system]["four"].append(
                                    read_four([mp / "four" / f"{i}.bin" for i in range(4)]))
                            if a.cached_p99:
                                # a second big object, so that the rows above run alone
                                with CachedReads(warm) as during, CachedReads(local) as l_during:
                                    read_all(mp / "big2.bin")
                                lat[system].append({"alone_p50": alone.p(0.5),
                                            "alone_p99": alone.p(0.99),
                                            "during_p50": during.p(0.5),
                                            "during_p99": during.p(0.99),
                                            "during_n": len(during.times),
                                            "during_open_p99": during.p(0.99, "open"),
                                            "during_read_p99": during.p(0.99, "read"),
                                            "during_close_p99": during.p(0.99, "close"),
                                            "local_alone_p99": l_alone.p(0.99),
                                            "local_during_p50": l_during.p(0.5),
                                            "local_during_p99": l_during.p(0.99)})  # fmt: skip
                            yield
                        finally:
                            m.umount()
                            teardown(m, check=False)

                    ctx = airfs_ctx()
                elif system == "s3fs":
                    ctx = proc_mount(
                        ["s3fs", f"{srv.bucket}:/bench", str(mp), "-f", "-o", f"passwd_file={pw}",
                         "-o", f"url={srv.endpoint}", "-o", "use_path_request_style",
                         "-o", "endpoint=us-east-1", "-o", "parallel_count=16",
                         "-o", "multireq_max=16"],
                        mp, work / "s3fs.log", {})  # fmt: skip
                else:
                    rcache = work / "cache-rclone"
                    shutil.rmtree(rcache, ignore_errors=True)
                    ctx = proc_mount(
                        ["rclone", "mount", f"sw:{srv.bucket}/bench", str(mp), "--config",
                         str(work / "rclone.conf"), "--vfs-cache-mode", "full", "--cache-dir",
                         str(rcache), "--vfs-read-chunk-size", "8M", "--buffer-size", "64M"],
                        mp, work / "rclone.log", rclone_env)  # fmt: skip
                with ctx:
                    if system in ("s3fs", "rclone"):
                        vals[system]["big"].append(read_speed(mp / "big.bin", a.read_kib * 1024))
                        if four:
                            vals[system]["four"].append(
                                read_four([mp / "four" / f"{i}.bin" for i in range(4)]))
                    vals[system]["small"].append(copy_out(mp / "small", dest, a.jobs, a.small))
                if a.warm and system.startswith("airfs"):
                    vals[system]["warm"].append(warm_rate(system, mp, env))

            for r in range(a.rounds):
                order = systems[r % len(systems) :] + systems[: r % len(systems)]
                for s in order:
                    log(f"round {r + 1}: {s}")
                    one(s)
                    four_s = f"four {vals[s]['four'][-1]:,.1f} MiB/s, " if four else ""
                    log(f"  big {vals[s]['big'][-1]:,.1f} MiB/s, {four_s}"
                        f"small {vals[s]['small'][-1]:,.1f} files/s")  # fmt: skip
    finally:
        if not a.work:
            shutil.rmtree(work, ignore_errors=True)
    report = render(a, vals)
    if a.chart:
        chart(vals, a.chart, a.label)
    for s_, c in cpu.items():
        if c:
            report += (f"\n{s_} daemon CPU per GiB of the big read: "
                       + ", ".join(f"{x:.2f}" for x in c) + " s\n")  # fmt: skip
    for s_, ls in lat.items():
        if not ls:
            continue
        report += (f"\n{s_}, cached 150 KiB whole-file reads by one thread (ms), per round: "
                   + "; ".join(f"alone p50 {x['alone_p50']:.2f} p99 {x['alone_p99']:.2f}, "
                               f"during the cold read p50 {x['during_p50']:.2f} "
                               f"p99 {x['during_p99']:.2f} ({x['during_n']:.0f} reads: p99 "
                               f"of open {x['during_open_p99']:.2f}, read "
                               f"{x['during_read_p99']:.2f}, close {x['during_close_p99']:.2f}); "
                               f"the same files on the local disk, read at the same time: "
                               f"alone p99 {x['local_alone_p99']:.2f}, during p50 "
                               f"{x['local_during_p50']:.2f} p99 {x['local_during_p99']:.2f}"
                               for x in ls) + "\n")  # fmt: skip
    print(report)
    if a.out:
        a.out.write_text(report)
    if a.json:
        a.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(a).items()},
                                      "values": vals, "daemon_cpu_s_per_gib": cpu,
                                      "cached_read_ms": lat},
                                     indent=1))  # fmt: skip
    return 0


def chart(vals: dict[str, dict[str, list[float]]], path: Path, label: str) -> None:
    """Two panels (big object MiB/s, small files/s): a bar per system at the median of the
    rounds, a dot per round."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(vals)
    panels = [("big", "one big object, cold sequential (MiB/s)")]
    if any(vals[n].get("four") for n in names):
        panels.append(("four", "4 objects, 4 readers at once (MiB/s)"))
    panels.append(("small", "small files, find | xargs cp (files/s)"))
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4))
    for ax, (key, title) in zip(axes, panels, strict=True):
        meds = [statistics.median(vals[n].get(key) or [0.0]) for n in names]
        ax.bar(names, meds, color=["#2a7" if n == "airfs" else "#999" for n in names])
        for i, n in enumerate(names):
            ax.plot([i] * len(vals[n].get(key, [])), vals[n].get(key, []), "k.", markersize=5)
        ax.set_title(title, fontsize=10)
        ax.tick_params(axis="x", labelrotation=20)
    fig.suptitle(f"issue 23, cold reads from S3 (SeaweedFS, loopback); {label}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def render(a: argparse.Namespace, vals: dict[str, dict[str, list[float]]]) -> str:
    med = {s: {k: statistics.median(v) for k, v in d.items() if v} for s, d in vals.items()}
    extra = f"; airfs mounted with `{a.airfs_args}`" if a.airfs_args else ""
    out = [f"{a.label}; {a.rounds} interleaved rounds; SeaweedFS on the same cores{extra}.", "",
           "| cold, fresh mount | " + " | ".join(vals) + " |",
           "| --- |" + " ---: |" * len(vals)]  # fmt: skip
    rows = [("big", f"one {a.big_mib} MiB object, sequential (MiB/s)")]
    if any(d.get("four") for d in vals.values()):
        rows.append(("four", f"4 x {a.four_mib} MiB objects, 4 readers at once (MiB/s)"))
    rows.append(("small", f"{a.small} x {a.small_kib} KiB, find | xargs -P {a.jobs} cp (files/s)"))
    if any(d.get("warm") for d in vals.values()):
        rows.append(("warm", f"the same, airfs warm -j {a.jobs} (raw: {a.jobs} GET threads)"))
    for key, title in rows:
        out.append(f"| {title} | " + " | ".join(
            f"{med[s].get(key, float('nan')):,.1f}" for s in vals) + " |")  # fmt: skip
    if "airfs" in vals:
        out += ["", "airfs / other, per round (the median of the rounds' ratios):", "",
                "| row | " + " | ".join(f"airfs / {s}" for s in vals if s != "airfs") + " |",
                "| --- |" + " ---: |" * (len(vals) - 1)]  # fmt: skip
        for key, _ in rows:
            cells = []
            for s in vals:
                if s == "airfs":
                    continue
                mine, theirs = vals["airfs"].get(key, []), vals[s].get(key, [])
                rs = [x / y for x, y in zip(mine, theirs, strict=False) if y]
                cells.append(f"{statistics.median(rs):.2f}x" if rs else "-")
            out.append(f"| {key} | " + " | ".join(cells) + " |")
    out += ["", "Samples:", ""]
    for s, d in vals.items():
        out.append(f"- {s}: big " + ", ".join(f"{x:,.1f}" for x in d["big"])
                   + ("; four " + ", ".join(f"{x:,.1f}" for x in d["four"]) if d.get("four")
                      else "")
                   + "; small " + ", ".join(f"{x:,.1f}" for x in d["small"])
                   + ("; warm " + ", ".join(f"{x:,.1f}" for x in d["warm"]) if d.get("warm")
                      else ""))  # fmt: skip
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
