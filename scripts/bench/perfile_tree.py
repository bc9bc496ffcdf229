"""``perfile.py``'s tree rows: ``readdir`` of a flat directory (100k entries), ``ls -l`` of it and
``find`` over a tree (1M entries in 10k directories), airfs on both transports (POSIX origin)
against the local disk, each pass after a restart with the page cache dropped.

Every pass is a child process with a deadline (``--op-timeout``): one that does not finish in
time is killed and recorded as an upper bound (entries / deadline, shown as ``< x``); that
system is not run again for that operation (the bound is repeated), so one pathological case
costs one deadline, not one per repetition.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from perfile_sys import Local, System, airfs_pair, interleave, running
from transport_t import log

#: a child that lists a directory with ``os.scandir`` and prints the count and its own time
SCANDIR = (
    "import os, sys, time; t = time.perf_counter(); "
    "n = sum(1 for _ in os.scandir(sys.argv[1])); print(n, time.perf_counter() - t)"
)


def make_tree(work: Path, flat: int, dirs: int, files: int) -> Path:
    """``flat`` empty files in ``flat/`` and ``dirs`` x ``files`` in ``tree/`` (100 directories
    per parent), kept between runs (a ``.done`` marker)."""
    root = work / f"o-tree-{flat}-{dirs}x{files}"
    done = root / ".done"
    if done.exists():
        return root
    log(f"  making {flat:,} entries and {dirs:,} x {files:,} (slow) ...")
    (root / "flat").mkdir(parents=True, exist_ok=True)
    for i in range(flat):
        os.close(os.open(root / "flat" / f"e{i:07d}", os.O_CREAT | os.O_WRONLY, 0o644))
    for j in range(dirs):
        d = root / "tree" / f"d{j // 100:03d}" / f"d{j:05d}"
        d.mkdir(parents=True, exist_ok=True)
        for i in range(files):
            os.close(os.open(d / f"f{i:04d}", os.O_CREAT | os.O_WRONLY, 0o644))
    done.touch()
    return root


class Ops:
    """The three passes, each with the deadline; ``upper`` collects (op, system) pairs whose
    figure is a bound."""

    def __init__(self, flat: int, tree_entries: int, timeout: float, notes: list[str]) -> None:
        self.expect = {"readdir": flat, "ls -l": flat, "find": tree_entries}
        self.timeout, self.notes = timeout, notes
        self.upper: dict[str, set[str]] = {op: set() for op in self.expect}

    def run(self, op: str, s: System, cmd: list[str]) -> tuple[bytes, float] | None:
        if s.name in self.upper[op]:
            return None
        t0 = time.perf_counter()
        try:
            p = subprocess.run(cmd, stdout=subprocess.PIPE, check=True, timeout=self.timeout)
        except subprocess.TimeoutExpired:
            self.upper[op].add(s.name)
            self.notes.append(f"{op} on {s.name} did not finish within {self.timeout:g} s "
                              f"(killed; the figure is an upper bound)")  # fmt: skip
            log(f"  {op} on {s.name}: timed out after {self.timeout:g} s")
            return None
        return p.stdout, time.perf_counter() - t0

    def bound(self, op: str) -> float:
        return self.expect[op] / self.timeout

    def readdir(self, s: System, _rep: int) -> float:
        got = self.run("readdir", s, [sys.executable, "-c", SCANDIR, str(s.root / "flat")])
        if got is None:
            return self.bound("readdir")
        n, dt = got[0].split()
        return int(n) / float(dt)

    def ls_l(self, s: System, _rep: int) -> float:
        got = self.run("ls -l", s, ["ls", "-l", str(s.root / "flat")])
        if got is None:
            return self.bound("ls -l")
        return (got[0].count(b"\n") - 1) / got[1]

    def find(self, s: System, _rep: int) -> float:
        got = self.run("find", s, ["find", str(s.root / "tree")])
        if got is None:
            return self.bound("find")
        return got[0].count(b"\n") / got[1]


def tree_rows(c: Any) -> None:
    """Measure and add the three rows to ``c`` (``perfile.Ctx``); each row is added as soon as
    it is measured."""
    a = c.a
    log("tree: readdir, ls -l, find")
    origin = make_tree(c.work, a.flat, a.tree_dirs, a.tree_files)
    parents = -(-a.tree_dirs // 100)
    ops = Ops(a.flat, a.tree_dirs * a.tree_files + a.tree_dirs + parents + 1, a.op_timeout,
              c.notes)  # fmt: skip
    note = "after a remount, page cache dropped"
    rows = [
        ("readdir", "readdir", ops.readdir, f"readdir of {a.flat:,} entries ({note})"),
        ("ls-l", "ls -l", ops.ls_l, f"ls -l of {a.flat:,} entries ({note})"),
        ("find", "find", ops.find, f"find over {a.tree_dirs * a.tree_files:,} entries in "
                                   f"{a.tree_dirs:,} directories ({note})"),
    ]  # fmt: skip
    systems: list[System] = airfs_pair(str(origin), c.work, "tree")
    with running(systems):
        every = [*systems, Local(origin)]
        for key, op, fn, scenario in rows:
            vals = interleave(every, fn, a.tree_reps)
            c.add(key, "tree", op, scenario, "entries/s", vals, None,
                  upper=tuple(sorted(ops.upper[op])))  # fmt: skip
