"""``airfs mount --metrics``: a real mount serves Prometheus text at /metrics, and the values
move with real reads and writes through the mount."""

from __future__ import annotations

import ctypes
import json
import os
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from airfs.obs.metrics import HISTOGRAMS, METRICS
from airfs.testing.fixtures import Volume
from airfs.testing.mountfix import fuse_available, mount
from airfs.testing.seaweed import free_ports

pytestmark = [
    pytest.mark.mount,
    pytest.mark.skipif(not fuse_available(), reason="needs /dev/fuse and fusermount3"),
]

MiB = 1 << 20
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(port: int, path: str = "/metrics") -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
        assert r.headers["Content-Type"].startswith("text/plain")
        return str(r.read().decode())


def samples(port: int) -> Samples:
    out: Samples = {}
    for fam in text_string_to_metric_families(scrape(port)):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(s: Samples, name: str, **labels: str) -> float:
    return s.get((name, tuple(sorted(labels.items()))), 0.0)


def test_metrics_move_with_reads_and_writes(make_volume: Callable[..., Volume]) -> None:
    port = free_ports(1)[0]
    v = make_volume("--metrics", str(port))  # the address defaults to 127.0.0.1
    before = samples(port)
    names = {n for n, _ in before}
    assert all(n.startswith("airfs_") for n in names)
    documented = set(METRICS) | {
        h + suffix for h in HISTOGRAMS for suffix in ("_bucket", "_sum", "_count")
    }
    assert names <= documented  # every exported name is documented
    assert {h + "_count" for h in HISTOGRAMS} <= names  # both histograms, from the start
    for n in (
        "airfs_core_inodes",
        "airfs_writeback_pending_files",
        "airfs_writeback_committed_bytes_total",
        "airfs_origin_in_flight",
        "airfs_background_prefetch_submitted_total",
        "airfs_gc_collections_total",
        "airfs_gc_seconds_total",
    ):
        assert n in names, n
    for gen in "012":  # the daemon's collector, one sample per generation
        assert ("airfs_gc_collections_total", (("generation", gen),)) in before, gen

    data = os.urandom(3 * MiB)
    (v.root / "w.bin").write_bytes(data)
    v.m.flush()
    src = v.tmp / "src"
    src.write_bytes(os.urandom(2 * MiB))
    v.spec.view.put("r.bin", str(src))
    assert (v.root / "r.bin").read_bytes() == src.read_bytes()
    after = samples(port)

    def grew(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert grew("airfs_writeback_committed_files_total") >= 1
    assert grew("airfs_writeback_committed_bytes_total") >= 3 * MiB
    assert value(after, "airfs_writeback_pending_files") == 0
    assert grew("airfs_core_ops_total", op="create") >= 1
    # the bytes themselves may go to the staging file by kernel passthrough (no write op):
    # the close is the core's either way
    assert grew("airfs_core_ops_total", op="release") >= 1
    assert grew("airfs_origin_requests_total", op="put") >= 1
    assert grew("airfs_origin_requests_total", op="stat") >= 1
    assert grew("airfs_cache_origin_requests_total") >= 1  # the block cache's range reads
    assert grew("airfs_cache_origin_read_bytes_total") >= 2 * MiB
    # (a small cold file is fetched whole at open and then read by passthrough, without a
    # read request: the cache's read counter need not move)
    assert value(after, "airfs_core_inodes") >= 3  # the root and both files


def test_metrics_paths_and_methods(make_volume: Callable[..., Volume]) -> None:
    port = free_ports(1)[0]
    make_volume("--metrics", f"127.0.0.1:{port}")
    with pytest.raises(urllib.error.HTTPError) as ei:
        scrape(port, "/other")
    assert ei.value.code == 404
    ei.value.close()  # an HTTPError holds the response (and its socket) open
    req = urllib.request.Request(f"http://127.0.0.1:{port}/metrics", data=b"x", method="POST")
    with pytest.raises(urllib.error.HTTPError) as ei:
        urllib.request.urlopen(req, timeout=10)
    assert ei.value.code == 405
    ei.value.close()
    assert "airfs_core_ops_total" in scrape(port)  # still serving


@pytest.mark.parametrize(
    ("arg", "reason"),
    [
        ("70000", "port must be 1-65535"),
        ("0", "port must be 1-65535"),
        ("host.example:9100", "not an IP address"),
        ("127.0.0.1:http", "not [ADDRESS:]PORT"),
    ],
)
def test_bad_metrics_address_is_refused(tmp_path: Path, arg: str, reason: str) -> None:
    (tmp_path / "mnt").mkdir()
    p = subprocess.run(
        [sys.executable, "-m", "airfs.cli", "mount", "--metrics", arg, str(tmp_path / "mnt")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 2
    assert reason in p.stderr
    assert "Traceback" not in p.stderr


def test_port_in_use_fails_the_mount_with_a_reason(tmp_path: Path) -> None:
    (tmp_path / "origin").mkdir()
    (tmp_path / "mnt").mkdir()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        with pytest.raises(RuntimeError) as ei:
            mount(str(tmp_path / "origin"), tmp_path / "mnt", tmp_path / "cache", "--metrics",
                  f"127.0.0.1:{port}")  # fmt: skip
    msg = str(ei.value)
    assert f"--metrics 127.0.0.1:{port}: cannot listen" in msg
    assert "Traceback" not in msg.splitlines()[0]
    assert not os.path.ismount(tmp_path / "mnt")


def _statx_sync(fd: int) -> None:
    """``statx(fd, "", AT_EMPTY_PATH | AT_STATX_FORCE_SYNC)``: a stat the kernel must ask
    the file system for (one FUSE_GETATTR), whatever attributes it has cached."""
    buf = ctypes.create_string_buffer(256)
    if _libc.statx(fd, b"", 0x1000 | 0x2000, 0x7FF, buf) != 0:  # STATX_BASIC_STATS
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


_libc = ctypes.CDLL(None, use_errno=True)

def histograms(port: int, family: str) -> dict[str, dict[str, float]]:
    """``{op: {"count", "sum", le label: cumulative count, ...}}`` of one histogram family,
    the bucket labels in the order they were exported."""
    out: dict[str, dict[str, float]] = {}
    for fam in text_string_to_metric_families(scrape(port)):
        if fam.name != family:
            continue
        assert fam.type == "histogram"
        for s in fam.samples:
            h = out.setdefault(s.labels["op"], {})
            if s.name == f"{family}_bucket":
                h[s.labels["le"]] = s.value
            elif s.name == f"{family}_count":
                h["count"] = s.value
            elif s.name == f"{family}_sum":
                h["sum"] = s.value
    return out


def check_buckets(h: dict[str, float]) -> None:
    """Cumulative buckets, increasing bounds, ending at +Inf with the count."""
    les = [k for k in h if k not in ("count", "sum")]
    assert les[-1] == "+Inf" and h["+Inf"] == h["count"]
    bounds = [float(k) for k in les]
    assert bounds == sorted(bounds) and len(set(bounds)) == len(bounds)
    counts = [h[k] for k in les]
    assert counts == sorted(counts)


def test_latency_histograms_move_with_operations(
    make_volume: Callable[..., Volume], tmp_path: Path
) -> None:
    port = free_ports(1)[0]
    # every read and write reaches the daemon (no kernel passthrough of the staged file)
    v = make_volume("--metrics", str(port), "--no-passthrough")
    src = tmp_path / "src"
    src.write_bytes(os.urandom(16 * MiB))
    v.spec.view.put("r.bin", str(src))
    n = 12
    before = histograms(port, "airfs_fuse_op_seconds")
    fd = os.open(v.root / "w.bin", os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        for i in range(n):
            assert os.pwrite(fd, os.urandom(64 << 10), i * MiB) == 64 << 10
        for _ in range(n):
            _statx_sync(fd)
    finally:
        os.close(fd)
    fd = os.open(v.root / "r.bin", os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)  # no read-ahead: one request a read
        for i in range(n):
            assert os.pread(fd, 4096, i * MiB + 8192) == src.read_bytes()[
                i * MiB + 8192 : i * MiB + 12288
            ]
    finally:
        os.close(fd)
    v.m.flush()
    after = histograms(port, "airfs_fuse_op_seconds")
    ops = samples(port)
    for op in ("getattr", "read", "write"):
        grew = after[op]["count"] - before.get(op, {}).get("count", 0)
        assert grew >= n, (op, grew)
        assert after[op]["sum"] > before.get(op, {}).get("sum", 0)
        # every call counted when it started has ended, and was timed
        assert after[op]["count"] == value(ops, "airfs_core_ops_total", op=op)
    for h in after.values():
        check_buckets(h)
    origin = histograms(port, "airfs_origin_op_seconds")
    assert origin["put"]["count"] >= 1  # the commit of w.bin
    assert origin["put"]["count"] == value(ops, "airfs_origin_requests_total", op="put")
    assert origin["read"]["count"] >= 1  # the block cache's range reads of r.bin
    assert origin["read"]["sum"] > 0
    for h in origin.values():
        check_buckets(h)

    p = subprocess.run(
        [sys.executable, "-m", "airfs.cli", "status", "--json", str(v.root)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 0, p.stderr
    st = json.loads(p.stdout)
    lat = st["fs"]["latency"]["getattr"]
    assert lat["count"] >= n and lat["buckets"]["+Inf"] == lat["count"]
    assert 0 < lat["p50"] <= lat["p99"]
    assert st["origin_calls"]["latency"]["put"]["count"] >= 1
    p = subprocess.run(
        [sys.executable, "-m", "airfs.cli", "status", str(v.root)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 0, p.stderr
    line = next(x for x in p.stdout.splitlines() if x.startswith("latency "))
    assert "getattr " in line and "(p50/p99)" in line
    assert any(x.startswith("origin time ") and "put " in x for x in p.stdout.splitlines())
