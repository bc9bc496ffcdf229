"""Latency histograms: the bucket math, the Prometheus exposition, and what the core and the
origin wrapper record (no kernel mount: a core over a memory origin, a cache over a faulty one)."""

from __future__ import annotations

import math
import os
import threading
from pathlib import Path
from typing import Any, cast

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.utils import floatToGoString

from airfs.cache import CachedReadPath
from airfs.core.inodes import ROOT_INO
from airfs.core.readpath import ObjectRef
from airfs.daemon.build import build
from airfs.obs.histogram import BOUNDS, Latencies, LatencyHistogram, bucket_label
from airfs.obs.metrics import Snapshot, registry
from airfs.origin.aio import AsyncOrigin
from airfs.origin.base import NotFound, Origin, Transient
from airfs.testing.memory import FaultyOrigin, MemoryOrigin

# -- bucket math ----------------------------------------------------------------------------


def test_bounds_span_local_disk_to_s3() -> None:
    assert BOUNDS[0] == 10e-6 and BOUNDS[-1] == 10.0
    assert list(BOUNDS) == sorted(set(BOUNDS))
    assert 50e-6 in BOUNDS and 0.05 in BOUNDS  # a local disk's and an S3 request's size


def test_an_observation_on_a_bound_is_in_that_bucket() -> None:
    lat = Latencies((0.001, 0.01, 0.1))
    for dt in (0.0, 0.001, 0.0010001, 0.01, 0.05, 0.1, 0.1000001, 7.0):
        lat.observe("x", dt)
    h = lat.snapshot()["x"]
    # (0, 1ms]: 0 and 1ms; (1ms, 10ms]: 1.0001ms and 10ms; (10ms, 100ms]: 50ms, 100ms; +Inf
    assert h.counts == (2, 2, 2, 2)
    assert h.count == 8
    assert h.sum == pytest.approx(0.0 + 0.001 + 0.0010001 + 0.01 + 0.05 + 0.1 + 0.1000001 + 7)


def test_cumulative_buckets_end_at_inf_with_the_count() -> None:
    lat = Latencies()
    values = [1e-6, 3e-5, 3e-5, 2e-4, 0.004, 0.3, 0.3, 42.0]
    for v in values:
        lat.observe("op", v)
    cum = lat.snapshot()["op"].cumulative()
    assert len(cum) == len(BOUNDS) + 1
    assert [b for b, _ in cum[:-1]] == list(BOUNDS)
    assert cum[-1] == (math.inf, len(values))
    counts = [n for _, n in cum]
    assert counts == sorted(counts)  # cumulative: never decreasing
    for bound, n in cum:
        assert n == sum(1 for v in values if v <= bound)


def test_quantiles_interpolate_within_the_bucket() -> None:
    lat = Latencies((0.001, 0.0025, 0.005))
    for _ in range(100):
        lat.observe("x", 0.002)  # all in (1 ms, 2.5 ms]
    h = lat.snapshot()["x"]
    assert h.quantile(0.5) == pytest.approx(0.001 + 0.0015 * 0.5)
    assert h.quantile(1.0) == pytest.approx(0.0025)
    assert h.quantile(0.0) == pytest.approx(0.001)
    lat.observe("slow", 0.0005)
    lat.observe("slow", 99.0)
    slow = lat.snapshot()["slow"]
    assert slow.quantile(0.25) == pytest.approx(0.0005)  # half way into (0, 1 ms]
    assert slow.quantile(0.99) == 0.005  # in +Inf: the highest finite bound
    # p50 and p99 of a spread: 90 fast, 10 slow
    lat2 = Latencies((0.001, 0.01, 0.1))
    for _ in range(90):
        lat2.observe("y", 0.0005)
    for _ in range(10):
        lat2.observe("y", 0.05)
    y = lat2.snapshot()["y"]
    assert y.quantile(0.5) == pytest.approx(0.001 * 50 / 90)
    assert y.quantile(0.99) == pytest.approx(0.01 + 0.09 * 9 / 10)


def test_empty_and_bad_input() -> None:
    h = LatencyHistogram((0.1,), (0, 0), 0.0)
    assert h.count == 0 and h.quantile(0.5) is None
    assert h.to_dict()["p50"] is None
    with pytest.raises(ValueError, match="quantile must be within"):
        h.quantile(1.5)
    with pytest.raises(ValueError, match="counts for"):
        LatencyHistogram((0.1, 1.0), (1, 2), 0.1)
    with pytest.raises(ValueError, match="increasing"):
        Latencies((0.1, 0.1))
    with pytest.raises(ValueError, match="positive and finite"):
        Latencies((0.1, math.inf))


def test_snapshots_are_frozen_copies() -> None:
    lat = Latencies()
    lat.observe("a", 0.001)
    first = lat.snapshot()["a"]
    lat.observe("a", 0.001)
    assert first.count == 1 and lat.snapshot()["a"].count == 2
    with pytest.raises(AttributeError):
        first.sum = 5.0  # type: ignore[misc]


def test_to_dict_and_labels_match_prometheus() -> None:
    for b in BOUNDS:
        assert bucket_label(b) == floatToGoString(b)  # type: ignore[no-untyped-call]
    assert bucket_label(math.inf) == "+Inf"
    lat = Latencies()
    lat.observe("a", 0.0002)
    lat.observe("a", 0.02)
    d = lat.snapshot()["a"].to_dict()
    assert d["count"] == 2 and d["sum"] == pytest.approx(0.0202)
    assert list(d["buckets"])[-1] == "+Inf" and d["buckets"]["+Inf"] == 2
    assert d["buckets"]["0.00025"] == 1 and d["buckets"]["0.025"] == 2
    assert 0.0001 < d["p50"] <= 0.00025 and 0.01 < d["p99"] <= 0.025


def test_prometheus_histogram_families() -> None:
    lat = Latencies()
    for v in (1e-5, 2e-4, 2e-4, 0.3, 30.0):
        lat.observe("getattr", v)
    core = type("C", (), {"latency": lat.snapshot()})()
    origin_lat = Latencies()
    origin_lat.observe("stat", 0.02)
    origin = type("O", (), {"latency": origin_lat.snapshot(), "in_flight": 0, "down": False})()
    snap = Snapshot(core, None, None, origin, None, None)
    text = generate_latest(registry(lambda: snap)).decode()
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    fam = fams["airfs_fuse_op_seconds"]
    assert fam.type == "histogram"
    got = {(s.name, s.labels.get("le")): s.value for s in fam.samples}
    assert got[("airfs_fuse_op_seconds_count", None)] == 5
    assert got[("airfs_fuse_op_seconds_sum", None)] == pytest.approx(1e-5 + 4e-4 + 0.3 + 30)
    assert got[("airfs_fuse_op_seconds_bucket", "+Inf")] == 5
    assert got[("airfs_fuse_op_seconds_bucket", "1e-05")] == 1
    assert got[("airfs_fuse_op_seconds_bucket", "0.00025")] == 3
    assert got[("airfs_fuse_op_seconds_bucket", "10.0")] == 4
    o = {(s.name, s.labels.get("le")): s.value for s in fams["airfs_origin_op_seconds"].samples}
    assert o[("airfs_origin_op_seconds_count", None)] == 1
    assert o[("airfs_origin_op_seconds_bucket", "0.01")] == 0
    assert o[("airfs_origin_op_seconds_bucket", "0.025")] == 1


# -- what the core and the origin wrapper record -------------------------------------------


async def test_core_records_every_operation_it_serves(tmp_path: Path) -> None:
    mem = MemoryOrigin()
    mem.put_bytes("a", b"hello")
    async with build(mem, str(tmp_path / "cache"), ttl=60, attempts=1) as b:
        fs = b.fs
        ino = (await fs.lookup(ROOT_INO, "a")).ino
        for _ in range(7):
            await fs.getattr(ino)
        with pytest.raises(OSError):
            await fs.lookup(ROOT_INO, "missing")  # errors are timed too
        fh, _ = await fs.open(ino, os.O_RDONLY)
        assert await fs.read(fh, 0, 5) == b"hello"
        await fs.release(fh)
        st = fs.statistics()
    lat = st.latency
    assert lat["getattr"].count == 7 == st.ops["getattr"]
    assert lat["lookup"].count == 2 == st.ops["lookup"]
    assert lat["read"].count == 1 and lat["open"].count == 1 and lat["release"].count == 1
    assert all(h.sum > 0 for h in lat.values())
    assert st.to_dict()["latency"]["getattr"]["count"] == 7


async def test_origin_attempts_are_each_one_observation(tmp_path: Path) -> None:
    mem = MemoryOrigin()
    mem.put_bytes("a", b"x")
    faulty = FaultyOrigin(mem)
    ao = AsyncOrigin(cast(Origin, faulty), attempts=3, base_delay=0.001)
    await ao.stat("a")
    faulty.fail["stat"] = lambda: Transient("flaky")
    with pytest.raises(Transient):
        await ao.stat("a")
    faulty.fail.clear()
    with pytest.raises(NotFound):
        await ao.stat("gone")
    st = ao.statistics()
    assert st.calls["stat"] == 5 and st.retries["stat"] == 2 and st.errors["stat"] == 4
    assert st.latency["stat"].count == 5  # per attempt, failed ones included
    assert st.latency["stat"].sum == pytest.approx(st.seconds["stat"], abs=0.001)  # rounded
    assert st.to_dict()["latency"]["stat"]["buckets"]["+Inf"] == 5


class Counting:
    """Wraps an origin; counts ``read_range`` attempts and failures (any thread)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.url = inner.url
        self.attempts = 0
        self.failures = 0
        self._lock = threading.Lock()

    def read_range(self, *args: Any) -> bytes:
        with self._lock:
            self.attempts += 1
        try:
            return bytes(self.inner.read_range(*args))
        except Exception:
            with self._lock:
                self.failures += 1
            raise

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


async def test_block_cache_range_reads_are_origin_reads(tmp_path: Path) -> None:
    mem = MemoryOrigin()
    mem.put_bytes("f", os.urandom(300 << 10))
    faulty = FaultyOrigin(mem)
    counting = Counting(faulty)
    ao = AsyncOrigin(cast(Origin, counting), attempts=2, base_delay=0.001)
    e = mem.stat("f")
    obj = ObjectRef("f", e.version, e.size)
    async with CachedReadPath.running(ao, str(tmp_path / "c"), cache_size=1 << 30) as rp:
        faulty.fail["read_range"] = lambda: Transient("flaky")
        r = rp.open(obj)
        with pytest.raises(Transient):
            await r.read(0, 4096)
        r.close()
        faulty.fail.clear()
        r = rp.open(obj)
        assert await r.read(0, 4096) == mem.read_range("f", 0, 4096)
        r.close()
        await rp.aclose()  # every fetch has ended
    st = ao.statistics()
    assert counting.failures >= 2 and counting.attempts > counting.failures
    # each request the cache sent is one call and one observation; each failed one an error
    assert st.calls["read"] == counting.attempts
    assert st.errors["read"] == counting.failures
    assert st.retries["read"] >= 1
    assert st.latency["read"].count == counting.attempts
