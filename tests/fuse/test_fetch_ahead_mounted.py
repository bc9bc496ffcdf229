"""Issue 23 through real mounts: a directory whose cold files are read one after another in its
listing's order (``cp -r``, ``tar``) has its next files fetched ahead into the cache; a reader
that jumps around has none fetched. Both origins; assertions on the daemon's counters."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import pytest

from airfs.testing.fixtures import Volume

pytestmark = pytest.mark.mount

KiB = 1 << 10


def files_at_origin(v: Volume, n: int) -> dict[str, bytes]:
    return v.origin_files("walk", {f"f{i:03d}.bin": os.urandom(40 * KiB + i) for i in range(n)})


def counters(v: Volume) -> tuple[int, int, dict[str, Any]]:
    st = v.m.status()
    return st["fs"]["fetched_ahead"], st["prefetch"]["warmed"], st["cache"]


def test_files_read_in_order_are_fetched_ahead(make_volume: Callable[..., Volume]) -> None:
    v = make_volume("--emulate-latency", "0.02")
    files = files_at_origin(v, 40)
    names = sorted(os.listdir(v.root / "walk"))  # the listing the walk follows
    assert names == sorted(files)
    for name in names:
        assert (v.root / "walk" / name).read_bytes() == files[name]
        time.sleep(0.02)  # the reader's own work on each file
    ahead, warmed, cache = counters(v)
    assert ahead >= 30, (ahead, warmed)
    assert warmed >= 20 and cache["warm_bytes"] >= 20 * 40 * KiB, (ahead, warmed, cache)


def test_files_read_out_of_order_are_not_fetched_ahead(
    make_volume: Callable[..., Volume],
) -> None:
    v = make_volume()
    files = files_at_origin(v, 30)
    names = sorted(os.listdir(v.root / "walk"))
    # 0, 10, 20, 1, 11, 21, ...: never the next name or the one after it
    names = [names[i + j] for i in range(10) for j in (0, 10, 20)]
    for name in names:
        assert (v.root / "walk" / name).read_bytes() == files[name]
    ahead, warmed, _ = counters(v)
    assert ahead == 0 and warmed == 0, (ahead, warmed)
