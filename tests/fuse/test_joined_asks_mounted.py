"""Through the kernel, on both origins: after the TTL, the requests many path walkers send
at once about the same names (a ``LOOKUP`` or ``GETATTR`` each) cost one origin question per
name, not one per request (:meth:`~airfs.core.revalidate.Revalidation.origin_entry`); every
walker gets the right answer, a change made at the origin included. Counted with ``airfs
status``; the emulated latency only keeps each question in flight while the others come."""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from airfs.testing.fixtures import Volume

pytestmark = pytest.mark.mount

WALKERS = 32


def counts(v: Volume) -> tuple[int, int, int]:
    """(origin questions about names: stat, stat_many and list calls; kernel requests about
    names: lookup and getattr; questions joined)."""
    st: dict[str, Any] = v.m.status()
    calls = st["origin_calls"]["calls"]
    ops = st["fs"]["ops"]
    asked = sum(int(calls.get(k, 0)) for k in ("stat", "stat_many", "list"))
    requests = int(ops.get("lookup", 0)) + int(ops.get("getattr", 0))
    return asked, requests, int(st["fs"]["joined_asks"])


def test_walkers_after_the_ttl_share_one_question_per_name(make_volume: Any) -> None:
    v: Volume = make_volume("--ttl", "0.5", "--emulate-latency", "0.1")
    v.spec.view.mkdir("d")
    v.origin_put("d/f", b"x")
    p = v.root / "d" / "f"
    assert os.stat(p).st_size == 1
    time.sleep(0.7)  # the TTL is over
    v.origin_put("d/f", b"changed")
    a0, r0, j0 = counts(v)
    barrier = threading.Barrier(WALKERS)

    def walk(_: int) -> int:
        barrier.wait()
        return os.stat(p).st_size

    with ThreadPoolExecutor(WALKERS) as ex:
        sizes = list(ex.map(walk, range(WALKERS)))
    assert sizes == [7] * WALKERS
    a1, r1, j1 = counts(v)
    # the kernel asked about d and f many times; the origin was asked a few times
    assert r1 - r0 >= WALKERS // 2, (r0, r1)
    assert j1 - j0 >= WALKERS // 2, (j0, j1)
    assert a1 - a0 <= 6, (a0, a1, r0, r1)
