"""Parallel ``cp --parents`` into a mount (the seed's small-files recipe, in reverse): racing
``mkdir`` calls of one name have one winner, and every loser's next lookup finds the
directory, so nothing is lost and a retry completes the copy.

``cp --parents`` itself is racy on any file system: it ``stat``s each parent and calls
``mkdir`` when it is missing, and reports "cannot make directory ... File exists" when another
``cp`` made it in between (on local disk too; a mount's slower requests widen the window).
"""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import re
import subprocess
from pathlib import Path

import pytest

from airfs.testing.fixtures import Volume

pytestmark = pytest.mark.mount

#: one cp's complaint (the output of parallel cps interleaves; a whole match is one's)
FAILED_DIR = re.compile(r"cannot make directory '([^'\n]+)': File exists")


def _tree(src: Path, n: int) -> dict[str, str]:
    sums = {}
    for i in range(n):
        rel = Path(f"a{i % 4}", f"b{i % 5}", f"c{i % 3}", f"f{i}.bin")
        data = os.urandom(100 + i)
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes(data)
        sums[str(rel)] = hashlib.sha256(data).hexdigest()
    return sums


def _copy(src: Path, dst: Path, names: list[str], parallel: int = 64) -> str:
    """The recipe: one ``cp --parents`` per file, 64 at a time; returns cp's complaints."""
    p = subprocess.run(
        ["xargs", "-0", "-P", str(parallel), "-I", "{}", "cp", "--parents", "{}", f"{dst}/"],
        input="\0".join(names),
        cwd=src,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return p.stderr


def test_parallel_cp_parents_losers_find_the_directory(volume: Volume, tmp_path: Path) -> None:
    src = tmp_path / "src"
    sums = _tree(src, 300 if volume.spec.kind == "posix" else 120)  # S3 mkdirs are slower
    dst = volume.root / "copy"
    dst.mkdir()
    errors = _copy(src, dst, sorted(sums))
    # only the race's own complaint (lines of parallel cps may interleave), nothing else
    for other in ("No such file", "Input/output", "Stale", "Permission", "not connected"):
        assert other not in errors, errors
    for d in FAILED_DIR.findall(errors):
        assert Path(d).is_dir(), d  # the loser's next lookup finds the winner's directory
    missing = [rel for rel in sums if not (dst / rel).exists()]
    assert _copy(src, dst, missing, parallel=1) == ""  # a retry finds every directory
    for rel, digest in sums.items():
        assert hashlib.sha256((dst / rel).read_bytes()).hexdigest() == digest, rel


def _mkdir_race(root: str) -> tuple[int, list[str]]:
    won, wrong = 0, []
    for i in range(120):
        for p in (os.path.join(root, f"d{i % 30}"), os.path.join(root, f"d{i % 30}", f"e{i % 4}")):
            try:
                os.mkdir(p)
                won += 1
            except FileExistsError:
                try:
                    if not os.path.isdir(p) or not os.stat(p):
                        wrong.append(p)
                except FileNotFoundError:
                    wrong.append(p)
    return won, wrong


def test_racing_mkdir_one_winner_losers_see_it(volume: Volume) -> None:
    """16 processes make the same 90 directories at once: each name is made exactly once,
    and every EEXIST is followed by a lookup that finds a directory."""
    root = volume.root / "race"
    root.mkdir()
    with multiprocessing.get_context("fork").Pool(16) as pool:
        results = pool.map(_mkdir_race, [str(root)] * 16)
    assert sum(w for w, _ in results) == 30 + 60  # d0..d29, and 60 distinct (d, e) pairs
    assert [p for _, wrong in results for p in wrong] == []
