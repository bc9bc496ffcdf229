"""LatencyOrigin: per-request latency and an aggregate bandwidth cap."""

from __future__ import annotations

import threading
import time

import pytest

from airfs.origin.latency import LatencyOrigin
from airfs.origin.posix import PosixOrigin
from airfs.testing.memory import MemoryOrigin


def test_latency_per_request_and_passthrough() -> None:
    mo = MemoryOrigin()
    mo.put_bytes("a", b"hello world")
    lo = LatencyOrigin(mo, latency_s=0.05)
    t = time.monotonic()
    assert lo.read_range("a", 6, 5) == b"world"
    assert lo.stat("a").size == 11
    elapsed = time.monotonic() - t
    assert elapsed >= 0.1  # two requests, 50 ms each
    assert lo.calls["read_range"] == 1 and lo.calls["stat"] == 1
    assert lo.bytes_read == 5 and mo.bytes_read == 5


def test_latency_is_paid_in_parallel() -> None:
    mo = MemoryOrigin()
    mo.put_bytes("a", b"x" * 100)
    lo = LatencyOrigin(mo, latency_s=0.1)
    threads = [threading.Thread(target=lo.read_range, args=("a", 0, 10)) for _ in range(8)]
    t = time.monotonic()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    elapsed = time.monotonic() - t
    assert 0.1 <= elapsed < 0.7  # not 8 x 100 ms: requests overlap
    assert lo.calls["read_range"] == 8


def test_bandwidth_cap_is_shared_by_all_threads(tmp_path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "f").write_bytes(b"y" * (256 << 10))
    lo = LatencyOrigin(PosixOrigin(str(tmp_path)), latency_s=0.0, bandwidth_bps=4 << 20)
    out: list[int] = []

    def job() -> None:
        out.append(len(lo.read_range("f", 0, 256 << 10)))

    threads = [threading.Thread(target=job) for _ in range(4)]
    t = time.monotonic()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    elapsed = time.monotonic() - t
    # 1 MiB in total through a 4 MiB/s link: at least 0.25 s however many threads share it
    assert elapsed >= 0.24
    assert out == [256 << 10] * 4
    assert lo.bytes_read == 1 << 20


def test_put_pays_bandwidth(tmp_path) -> None:  # type: ignore[no-untyped-def]
    src = tmp_path / "src"
    src.write_bytes(b"z" * (200 << 10))
    root = tmp_path / "root"
    root.mkdir()
    lo = LatencyOrigin(PosixOrigin(str(root)), latency_s=0.0, bandwidth_bps=1 << 20)
    t = time.monotonic()
    entry = lo.put("obj", str(src))
    assert time.monotonic() - t >= 0.18
    assert entry.size == 200 << 10 and lo.calls["put"] == 1


def test_bad_arguments() -> None:
    with pytest.raises(ValueError):
        LatencyOrigin(MemoryOrigin(), latency_s=-1)
    with pytest.raises(ValueError):
        LatencyOrigin(MemoryOrigin(), bandwidth_bps=0)


def test_request_size_splits_a_read_into_requests_in_a_row(tmp_path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "f").write_bytes(b"z" * (512 << 10))
    lo = LatencyOrigin(PosixOrigin(str(tmp_path)), latency_s=0.03, request_bytes=128 << 10)
    t = time.monotonic()
    assert len(lo.read_range("f", 0, 512 << 10)) == 512 << 10  # 4 requests of 128 KiB
    four = time.monotonic() - t
    t = time.monotonic()
    assert lo.read_range("f", 0, 10) == b"z" * 10  # a short read is still one request
    one = time.monotonic() - t
    assert 0.12 <= four < 0.5 and 0.03 <= one < 0.1
    assert lo.calls["read_range"] == 2
    with pytest.raises(ValueError, match="request_bytes"):
        LatencyOrigin(PosixOrigin(str(tmp_path)), latency_s=0.01, request_bytes=0)


def test_reads_into_a_buffer_take_the_same_time(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """``into_reads`` is passed on from the inner origin, with the delays of ``read_range``
    (a cache that reads its big parts into its own buffers is slowed as much)."""
    (tmp_path / "f").write_bytes(b"q" * (512 << 10))
    lo = LatencyOrigin(PosixOrigin(str(tmp_path)), latency_s=0.03, request_bytes=128 << 10)
    assert lo.capabilities.into_reads
    assert not LatencyOrigin(MemoryOrigin(), latency_s=0.01).capabilities.into_reads
    buf = bytearray(600 << 10)
    t = time.monotonic()
    assert lo.read_range_into("f", 0, memoryview(buf)) == 512 << 10  # 4 requests of 128 KiB
    took = time.monotonic() - t
    assert bytes(buf[: 512 << 10]) == b"q" * (512 << 10) and 0.12 <= took < 0.5
    assert lo.calls["read_range"] == 1 and lo.bytes_read == 512 << 10
