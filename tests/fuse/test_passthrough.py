"""FUSE passthrough of local bytes on the kernel transport (root: CAP_SYS_ADMIN), mounted for
real: cached and staged files are served by the kernel from the cache or staging file, the
per-inode mode never mixes a passthrough open with a daemon-served one, passthrough writes are
journaled and committed like any others, and a cache file is verified before it is passed
through.

Assertions use the daemon's own counters (``airfs status --json``: ``fuse.passthrough_opens``,
``fs.ops.read``...), never timings.
"""

from __future__ import annotations

import glob
import hashlib
import mmap
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from airfs.testing.fixtures import Volume
from airfs.testing.mountfix import airfs_cmd, teardown

pytestmark = pytest.mark.mount

MiB = 1 << 20


@pytest.fixture
def pvolume(
    make_volume: Callable[..., Volume], monkeypatch: pytest.MonkeyPatch
) -> Callable[..., Volume]:
    """A volume on the kernel transport with passthrough negotiated (else the test skips)."""
    monkeypatch.setenv("AIRFS_TEST_FUSE", "kernel")

    def make(*extra: str) -> Volume:
        v = make_volume(*extra)
        if not v.m.status()["fuse"].get("passthrough"):
            pytest.skip("passthrough not negotiated (needs kernel 6.9+ and CAP_SYS_ADMIN)")
        return v

    return make


def put_origin(v: Volume, rel: str, data: bytes) -> None:
    if v.spec.dir is not None:
        dst = v.spec.dir / rel
        tmp = dst.parent / f".tmp-{os.getpid()}"
        tmp.write_bytes(data)
        os.replace(tmp, dst)
        return
    src = v.tmp / "src"
    src.write_bytes(data)
    v.spec.view.put(rel, str(src))


def status(v: Volume) -> dict[str, Any]:
    return v.m.status()


def counts(v: Volume) -> tuple[int, int, int]:
    """(passthrough opens, daemon-served reads, daemon-served writes) so far."""
    s = status(v)
    ops = s["fs"]["ops"]
    return s["fuse"].get("passthrough_opens", 0), ops.get("read", 0), ops.get("write", 0)


def sha_in_subprocess(path: Path) -> str:
    """Read ``path`` whole in another process."""
    code = "import hashlib,sys;print(hashlib.sha256(open(sys.argv[1],'rb').read()).hexdigest())"
    p = subprocess.run(
        [sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=60
    )
    assert p.returncode == 0, p.stderr
    return p.stdout.strip()


def warm(path: Path) -> None:
    p = subprocess.run(
        [*airfs_cmd(), "warm", "--quiet", str(path)], capture_output=True, text=True, timeout=120
    )
    assert p.returncode == 0, p.stderr


def test_cached_file_is_read_by_the_kernel(pvolume: Callable[..., Volume]) -> None:
    v = pvolume()
    data = os.urandom(12 * MiB + 5)  # above the small-file limit: cold opens are daemon-served
    put_origin(v, "big.bin", data)
    assert (v.root / "big.bin").read_bytes() == data  # cold: daemon-served, fills the cache
    p0, r0, _ = counts(v)
    with open(v.root / "big.bin", "rb") as f:
        assert f.read() == data
        with mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as m:
            assert m[-4096:] == data[-4096:]
    p1, r1, _ = counts(v)
    assert p1 == p0 + 1 and r1 == r0, (p0, p1, r0, r1)  # no read reached the daemon
    assert status(v)["fuse"]["backing_verifications"] >= 1
    # concurrent opens of one inode share one backing file (the kernel's rule)
    with open(v.root / "big.bin", "rb") as a, open(v.root / "big.bin", "rb") as b:
        fuse = status(v)["fuse"]
        assert fuse["passthrough_handles"] == 2 and fuse["backing_files"] == 1
        assert a.read(4096) == b.read(4096) == data[:4096]
    assert status(v)["fuse"]["backing_files"] == 0


def test_small_cold_file_is_fetched_whole_at_open(pvolume: Callable[..., Volume]) -> None:
    v = pvolume()
    data = os.urandom(3 * MiB + 17)
    put_origin(v, "small.bin", data)
    before = status(v)["cache"]
    p0, r0, _ = counts(v)
    assert (v.root / "small.bin").read_bytes() == data
    after = status(v)["cache"]
    p1, r1, _ = counts(v)
    assert p1 == p0 + 1 and r1 == r0
    assert after["origin_requests"] - before["origin_requests"] == 1
    assert after["origin_bytes_read"] - before["origin_bytes_read"] == len(data)
    assert status(v)["fuse"]["backing_fetched_whole"] == 1


def test_daemon_served_open_keeps_the_inode_daemon_served(
    pvolume: Callable[..., Volume],
) -> None:
    """A file held open daemon-served while another process opens it after it became
    complete in the cache: that open is daemon-served too (never EIO); once no daemon-served
    open remains, the next open passes through."""
    v = pvolume()
    data = os.urandom(12 * MiB)
    put_origin(v, "f.bin", data)
    digest = hashlib.sha256(data).hexdigest()
    held = open(v.root / "f.bin", "rb")  # noqa: SIM115
    try:
        assert held.read(MiB) == data[:MiB]
        warm(v.root / "f.bin")  # now complete in the cache
        p0, r0, _ = counts(v)
        assert sha_in_subprocess(v.root / "f.bin") == digest
        p1, r1, _ = counts(v)
        assert p1 == p0 and r1 > r0  # served the held open's way
        held.seek(5 * MiB)
        assert held.read(MiB) == data[5 * MiB : 6 * MiB]
    finally:
        held.close()
    p2, r2, _ = counts(v)
    assert sha_in_subprocess(v.root / "f.bin") == digest
    p3, r3, _ = counts(v)
    assert p3 == p2 + 1 and r3 == r2
    assert status(v)["fuse"]["daemon_opens"] >= 2


def test_passthrough_writes_survive_kill9(pvolume: Callable[..., Volume]) -> None:
    v = pvolume()
    data = os.urandom(5 * MiB + 3)
    p0, _, w0 = counts(v)
    fd = os.open(v.root / "ckpt.pt", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for off in range(0, len(data), MiB):
            os.write(fd, data[off : off + MiB])
    finally:
        os.close(fd)
    p1, _, w1 = counts(v)
    assert p1 == p0 + 1 and w1 == w0  # no write reached the daemon
    assert os.stat(v.root / "ckpt.pt").st_size == len(data)
    v.m.kill9()
    v.m = v.mount()
    v.m.flush()
    assert v.origin_bytes("ckpt.pt") == data
    assert (v.root / "ckpt.pt").read_bytes() == data


def test_stat_size_follows_a_passthrough_writer(pvolume: Callable[..., Volume]) -> None:
    v = pvolume()
    path = v.root / "log.txt"
    chunk = b"x" * 1000 + b"\n"
    with open(path, "ab", buffering=0) as f:
        for i in range(1, 21):
            f.write(chunk)
            assert os.fstat(f.fileno()).st_size == i * len(chunk)
            assert os.stat(path).st_size == i * len(chunk)
            # another process sees the size too
            p = subprocess.run(
                [sys.executable, "-c", f"import os;print(os.stat({str(path)!r}).st_size)"],
                capture_output=True, text=True, timeout=30,
            )  # fmt: skip
            assert int(p.stdout) == i * len(chunk)
    assert counts(v)[0] >= 1
    v.m.flush()
    assert v.origin_bytes("log.txt") == chunk * 20


def test_mmap_read_and_write(pvolume: Callable[..., Volume]) -> None:
    """Shared read-only mappings pass through; an ``O_RDWR`` open (which may be mapped
    writable, and a passthrough mapping outlives the open) is daemon-served, so writes made
    through a mapping after ``close()`` are still journaled and committed."""
    v = pvolume()
    data = bytearray(os.urandom(2 * MiB))
    (v.root / "m.bin").write_bytes(data)
    p0, r0, w0 = counts(v)
    with open(v.root / "m.bin", "rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as m:
        assert m[:4096] == data[:4096] and m[-10:] == data[-10:]
    p1, r1, w1 = counts(v)
    assert p1 == p0 + 1 and (r1, w1) == (r0, w0)  # read by the kernel from the staging file
    with open(v.root / "m.bin", "r+b") as f:
        m = mmap.mmap(f.fileno(), 0)
    try:  # the descriptor is closed; the mapping lives on
        m[MiB : MiB + 5] = b"HELLO"
        m.flush()
    finally:
        m.close()
    data[MiB : MiB + 5] = b"HELLO"
    p2, _, _ = counts(v)
    assert p2 == p1  # the O_RDWR open was served by the daemon
    assert (v.root / "m.bin").read_bytes() == data
    v.m.flush()
    assert v.origin_bytes("m.bin") == bytes(data)


def test_an_rdwr_open_never_joins_a_passthrough_writer(pvolume: Callable[..., Volume]) -> None:
    """An ``O_RDWR`` open of a file that an ``O_WRONLY`` writer passes through (its mapping
    would go to the staging file and outlive its ``close()``, unseen) is daemon-served on a
    new inode: writes made through its mapping after the ``close()`` reach the origin."""
    v = pvolume()
    p0, _, _ = counts(v)
    writer = open(v.root / "w.bin", "wb")  # noqa: SIM115  (passed through)
    try:
        writer.write(b"a" * (64 * 1024))
        writer.flush()
        assert counts(v)[0] == p0 + 1
        fd = os.open(v.root / "w.bin", os.O_RDWR)
        m = mmap.mmap(fd, 64 * 1024)
        os.close(fd)
        m[:5] = b"MAPPD"
        m.close()
    finally:
        writer.close()
    assert counts(v)[0] == p0 + 1  # the O_RDWR open was not passed through
    v.m.flush()
    assert v.origin_bytes("w.bin") == b"MAPPD" + b"a" * (64 * 1024 - 5)


def test_truncate_and_rename_over_keep_the_old_bytes_of_a_passthrough_reader(
    pvolume: Callable[..., Volume],
) -> None:
    v = pvolume()
    old = os.urandom(2 * MiB)
    put_origin(v, "a.bin", old)
    put_origin(v, "b.bin", old)
    reader_a = open(v.root / "a.bin", "rb")  # noqa: SIM115  (small: fetched whole, passed through)
    reader_b = open(v.root / "b.bin", "rb")  # noqa: SIM115
    try:
        assert reader_a.read(4096) == old[:4096]
        assert reader_b.read(4096) == old[:4096]
        assert counts(v)[0] >= 2
        os.truncate(v.root / "a.bin", 0)
        assert (v.root / "a.bin").read_bytes() == b""  # a new open sees the truncation
        (v.root / "new.tmp").write_bytes(b"new bytes")
        os.replace(v.root / "new.tmp", v.root / "b.bin")
        assert (v.root / "b.bin").read_bytes() == b"new bytes"
        assert reader_a.read() == old[4096:]
        assert reader_b.read() == old[4096:]
        # the truncated inode's new open could pass through neither the old cache file nor
        # be daemon-served beside it: it was retried (ESTALE) on a new inode
        assert status(v)["fuse"]["passthrough_conflicts"] == 1
    finally:
        reader_a.close()
        reader_b.close()
    v.m.flush()
    assert v.origin_bytes("a.bin") == b""
    assert v.origin_bytes("b.bin") == b"new bytes"


def test_eviction_pressure_spares_open_backing_files(pvolume: Callable[..., Volume]) -> None:
    v = pvolume("--cache-size", "30M")
    files = {f"e{i}.bin": os.urandom(12 * MiB) for i in range(4)}
    for name, data in files.items():
        put_origin(v, name, data)
    warm(v.root / "e0.bin")
    warm(v.root / "e3.bin")
    with open(v.root / "e3.bin", "rb") as f:  # a read-only mapping that outlives its open
        mapped = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
    held = open(v.root / "e0.bin", "rb")  # noqa: SIM115
    try:
        assert counts(v)[0] == 2
        for name in ("e1.bin", "e2.bin", "e3.bin"):
            assert (v.root / name).read_bytes() == files[name]
        cache = status(v)["cache"]
        assert cache["evictions"] >= 1
        origin_before = cache["origin_bytes_read"]
        assert held.read() == files["e0.bin"]
        assert status(v)["cache"]["origin_bytes_read"] == origin_before
        assert mapped[:] == files["e3.bin"]  # never punched under the mapping
    finally:
        held.close()
        mapped.close()
    backing = [p for p in glob.glob(str(v.tmp / "cache/blocks/data/*/*")) if os.path.isfile(p)]
    assert backing  # e0 is still cached: opened again, it passes through with no fetch
    p0, r0, _ = counts(v)
    assert (v.root / "e0.bin").read_bytes() == files["e0.bin"]
    p1, r1, _ = counts(v)
    assert p1 == p0 + 1 and r1 == r0


def test_flipped_byte_in_a_complete_cache_file_is_never_served(
    origin_spec: Any, pvolume: Callable[..., Volume]
) -> None:
    if origin_spec.kind != "posix":
        pytest.skip("cache-file layout is origin-independent; posix is enough")
    v = pvolume()
    data = os.urandom(12 * MiB)
    put_origin(v, "c.bin", data)
    warm(v.root / "c.bin")
    assert (v.root / "c.bin").read_bytes() == data  # passed through: verified and recorded
    assert status(v)["fuse"]["passthrough_opens"] == 1
    v.m.umount()
    teardown(v.m)
    cached = [p for p in glob.glob(str(v.tmp / "cache/blocks/data/*/*")) if os.path.isfile(p)]
    assert len(cached) == 1, cached
    with open(cached[0], "r+b") as f:
        f.seek(7 * MiB + 99)
        b = f.read(1)
        f.seek(7 * MiB + 99)
        f.write(bytes([b[0] ^ 0x01]))
    v.m = v.mount()
    assert (v.root / "c.bin").read_bytes() == data
    s = status(v)
    assert s["fuse"]["backing_verify_failures"] == 1
    assert s["cache"]["corrupt_blocks"] >= 1
    assert 0 < s["cache"]["origin_bytes_read"] < len(data)  # only the bad block came again
    # complete again: the next open verifies the repaired file and passes it through
    assert (v.root / "c.bin").read_bytes() == data
    assert status(v)["fuse"]["passthrough_opens"] >= 1
