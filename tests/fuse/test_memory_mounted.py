"""Through a real mount, POSIX and S3 origins: what the daemon holds per file goes when the
files go (issue 11, "Memory"). Not an RSS threshold (that would be flaky): the tables that grew
with every load round before the fix, read from ``airfs status``, come back to their size
after a round of create, read, delete."""

from __future__ import annotations

import os
import shutil
import time
from typing import Any

from airfs.testing.fixtures import Volume


def settled(volume: Volume) -> dict[str, Any]:
    """``airfs status`` once every write is committed and every commit's bookkeeping (the
    cache's adopt of the committed bytes) is done."""
    volume.m.flush()
    deadline = time.monotonic() + 60
    while True:
        st = volume.m.status()
        if st["writeback"]["uploading"] == 0 and st["writeback"]["pending_files"] == 0:
            return st
        assert time.monotonic() < deadline, f"commits still running: {st['writeback']}"
        time.sleep(0.05)


def test_a_create_and_delete_round_leaves_the_tables_as_they_were(volume: Volume) -> None:
    root = volume.root
    before = settled(volume)
    for rnd in range(2):
        tree = root / "tree"
        for d in range(3):
            (tree / f"d{d}").mkdir(parents=True)
            for i in range(15):
                (tree / f"d{d}" / f"f{i}").write_bytes(os.urandom(3000 + i))
        mid = settled(volume)
        assert mid["cache"]["cache_objects"] == before["cache"]["cache_objects"] + 45
        for d in range(3):
            for i in range(15):
                assert len((tree / f"d{d}" / f"f{i}").read_bytes()) == 3000 + i
        shutil.rmtree(tree)
        after = settled(volume)
        assert after["cache"]["cache_objects"] == before["cache"]["cache_objects"], rnd
        assert after["fs"]["inodes"] == before["fs"]["inodes"], rnd
