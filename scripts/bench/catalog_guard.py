"""What governance costs (issue 14): the guard's check in-process, and small-file
open+read+close through a real mount of a directory origin, ungoverned vs governed (a user
with READ VOLUME, run as root here: root is an admin, so the catalog is consulted but every
check passes; ``--as-user NAME`` runs the loop as that user instead).

    python scripts/bench/catalog_guard.py [--files 2000] [--as-user NAME]

Prints one line per figure; short by design (the machine is shared)."""

from __future__ import annotations

import argparse
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import trio

from airfs.catalog.guard import CatalogGuard
from airfs.catalog.model import Who
from airfs.catalog.store import CatalogCache, CatalogStore
from airfs.core.context import Caller
from airfs.origin.posix import PosixOrigin
from airfs.testing.mountfix import mounted

ROOT = Who(frozenset({"root"}), is_root=True)


def setup_catalog(origin: str, user: str) -> None:
    store = CatalogStore(PosixOrigin(origin))
    store.run(ROOT, "init", {})
    for cmd, name in (("create-catalog", "main"), ("create-schema", "main.raw"),
                      ("create-volume", "main.raw.v")):  # fmt: skip
        store.run(ROOT, cmd, {"name": name})
    for priv, kind, name in (("USE CATALOG", "catalog", "main"), ("USE SCHEMA", "schema",
                             "main.raw"), ("READ VOLUME", "volume", "main.raw.v")):  # fmt: skip
        store.run(ROOT, "grant", {"privilege": priv, "type": kind, "name": name,
                                  "principal": user})  # fmt: skip


def in_process(origin: str, n: int) -> float:
    guard = CatalogGuard(CatalogCache(CatalogStore(PosixOrigin(origin)), ttl=1.0))
    caller = Caller(os.getuid(), os.getgid(), os.getpid())

    async def main() -> float:
        await guard.check(caller, "open_read", "main/raw/v/f0")
        t0 = time.perf_counter()
        for i in range(n):
            await guard.check(caller, "open_read", f"main/raw/v/f{i % 100}")
        return (time.perf_counter() - t0) / n * 1e6

    return trio.run(main)


LOOP = """
import os, sys, time
d = sys.argv[1]
names = sorted(os.listdir(d))
t0 = time.perf_counter()
for rep in range(3):
    for n in names:
        with open(os.path.join(d, n), "rb") as f:
            f.read()
print(3 * len(names) / (time.perf_counter() - t0))
"""


def files_per_s(mnt: Path, user: str | None) -> float:
    cmd = [sys.executable, "-c", LOOP, str(mnt / "main/raw/v")]
    if user is not None:
        pw = pwd.getpwnam(user)
        pre = f"import os; os.setgroups([]); os.setgid({pw.pw_gid}); os.setuid({pw.pw_uid})\n"
        cmd = [sys.executable, "-c", pre + LOOP, str(mnt / "main/raw/v")]
    return float(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)


def make_origin(path: Path, n: int) -> None:
    (path / "main/raw/v").mkdir(parents=True)
    for i in range(n):
        (path / "main/raw/v" / f"f{i:05d}").write_bytes(b"x" * 4096)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=2000)
    ap.add_argument("--as-user")
    args = ap.parse_args()
    user = args.as_user or "root"
    base = Path(tempfile.mkdtemp(prefix="airfs-bench-cat-", dir="/tmp"))
    base.chmod(0o755)
    for name in ("plain", "governed"):
        make_origin(base / name, args.files)
        (base / f"mnt-{name}").mkdir()
    setup_catalog(str(base / "governed"), user)
    per_check = in_process(str(base / "governed"), 100_000)
    rates = {}
    for name in ("plain", "governed"):
        with mounted(str(base / name), base / f"mnt-{name}", base / f"cache-{name}") as m:
            rates[name] = files_per_s(m.mountpoint, args.as_user)
    print(f"guard.check in-process (governed, caller {user}): {per_check:.1f} us/check")
    print(f"4 KiB files open+read+close, ungoverned: {rates['plain']:,.0f} files/s")
    ratio = rates["governed"] / rates["plain"]
    print(
        f"4 KiB files open+read+close, governed:   {rates['governed']:,.0f} files/s ({ratio:.2f}x)"
    )
    shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
