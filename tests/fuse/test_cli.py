"""The mount lifecycle through the CLI: bad input, overlay in place, status, umount, SIGTERM,
and the ``mount -t fuse.airfs`` / fstab form."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from airfs.testing.mountfix import (
    Mounted,
    fuse_available,
    fusermount_unmount,
    is_mounted,
    mount,
    mounted,
    teardown,
)

pytestmark = [
    pytest.mark.mount,
    pytest.mark.skipif(not fuse_available(), reason="needs /dev/fuse and fusermount3"),
]

AIRFS = [sys.executable, "-m", "airfs.cli"]


def run(
    *args: str, timeout: float = 60, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    full_env = None if env is None else {**os.environ, **env}
    return subprocess.run(
        [*AIRFS, *args], capture_output=True, text=True, timeout=timeout, env=full_env
    )


def daemons_for(mountpoint: Path) -> list[int]:
    """PIDs of airfs daemons whose command line names ``mountpoint``."""
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"airfs.daemon.process" in cmd and str(mountpoint).encode() in cmd:
            out.append(int(pid))
    return out


@pytest.fixture
def dirs(tmp_path: Path) -> Iterator[tuple[Path, Path, Path]]:
    origin, mnt, cache = tmp_path / "origin", tmp_path / "mnt", tmp_path / "cache"
    origin.mkdir()
    mnt.mkdir()
    yield origin, mnt, cache
    if is_mounted(mnt):
        fusermount_unmount(mnt)
    for pid in daemons_for(mnt):
        os.kill(pid, signal.SIGKILL)


def assert_clean_failure(p: subprocess.CompletedProcess[str], mnt: Path, words: str) -> None:
    assert p.returncode != 0
    lines = [line for line in p.stderr.strip().splitlines() if line]
    assert len(lines) == 1, p.stderr
    assert words in lines[0], lines[0]
    assert not is_mounted(mnt)
    time.sleep(0.2)
    assert daemons_for(mnt) == []


def test_bad_input_fails_cleanly(dirs: tuple[Path, Path, Path], tmp_path: Path) -> None:
    origin, mnt, cache = dirs
    p = run("mount", "--origin", str(origin), "--cache-dir", str(cache), str(tmp_path / "nope"))
    assert_clean_failure(p, tmp_path / "nope", "does not exist")
    p = run("mount", "--origin", str(tmp_path / "missing"), "--cache-dir", str(cache), str(mnt))
    assert_clean_failure(p, mnt, "origin")
    (tmp_path / "afile").write_text("x")
    p = run("mount", "--origin", str(tmp_path / "afile"), "--cache-dir", str(cache), str(mnt))
    assert_clean_failure(p, mnt, "not a directory")
    (mnt / "stuff").write_text("x")
    p = run("mount", "--origin", str(origin), "--cache-dir", str(cache), str(mnt))
    assert_clean_failure(p, mnt, "not empty")
    (mnt / "stuff").unlink()
    p = run("mount", "--origin", "ftp://x/y", "--cache-dir", str(cache), str(mnt))
    assert_clean_failure(p, mnt, "unsupported origin")
    for bad in ("many", "-5"):  # the daemon's collector threshold: named, nothing mounted
        p = run(
            "mount", "--origin", str(origin), "--cache-dir", str(cache), str(mnt),
            env={"AIRFS_GC_YOUNG": bad},
        )  # fmt: skip
        assert_clean_failure(p, mnt, f"AIRFS_GC_YOUNG={bad!r}")
    p = run("mount", "--bogus-option", str(mnt))
    assert p.returncode == 2 and "unrecognized arguments: --bogus-option" in p.stderr
    assert not is_mounted(mnt)


def test_damaged_block_index_is_reported_and_rebuilt(dirs: tuple[Path, Path, Path]) -> None:
    """A truncated index (LMDB would die of SIGBUS on it) and a garbled one are each refused
    with one line that names the way out; ``--rebuild-cache`` moves the index aside and the
    mount serves the right bytes again."""
    origin, mnt, cache = dirs
    data = os.urandom(300_000)
    (origin / "f.bin").write_bytes(data)
    with mounted(str(origin), mnt, cache) as m:
        assert (mnt / "f.bin").read_bytes() == data
        assert m.umount().returncode == 0
    index = cache / "blocks" / "index"
    good = (index / "data.mdb").read_bytes()
    assert len(good) > 3 * 4096
    damages = {
        "truncated": good[: 2 * 4096],
        "garbled": os.urandom(8192) + good[8192:],
    }
    for why, damaged in damages.items():
        (index / "data.mdb").write_bytes(damaged)
        p = run("mount", "--origin", str(origin), "--cache-dir", str(cache), str(mnt))
        assert_clean_failure(p, mnt, f"cache index {index} is damaged")
        assert "--rebuild-cache" in p.stderr and "Traceback" not in p.stderr, why
        assert p.returncode == 1
        with mounted(str(origin), mnt, cache, "--rebuild-cache") as m:
            assert (mnt / "f.bin").read_bytes() == data
            assert m.status()["cache"]["origin_bytes_read"] == len(data)  # refetched
            assert m.umount().returncode == 0
        assert (index / "data.mdb").exists()
        good = (index / "data.mdb").read_bytes()
    assert len(list((cache / "blocks").glob("index.damaged-*"))) == 2
    # an intact index is left alone by --rebuild-cache: the data stays cached
    with mounted(str(origin), mnt, cache, "--rebuild-cache") as m:
        assert (mnt / "f.bin").read_bytes() == data
        assert m.status()["cache"]["origin_bytes_read"] == 0
        assert m.umount().returncode == 0
    assert len(list((cache / "blocks").glob("index.damaged-*"))) == 2


def test_warm_of_a_missing_path(dirs: tuple[Path, Path, Path]) -> None:
    origin, mnt, cache = dirs
    with mounted(str(origin), mnt, cache):
        p = run("warm", str(mnt / "missing"))
        assert p.returncode == 1
        assert p.stderr.strip() == f"airfs: {mnt / 'missing'}: no such file or directory"


def test_second_mount_on_same_mountpoint_is_refused(dirs: tuple[Path, Path, Path]) -> None:
    origin, mnt, cache = dirs
    m = mount(str(origin), mnt, cache)
    try:
        p = run("mount", "--origin", str(origin), "--cache-dir", str(cache) + "2", str(mnt))
        assert p.returncode == 1 and "already an airfs mount" in p.stderr
        assert daemons_for(mnt) == [m.pid]
    finally:
        teardown(m)


def test_shared_cache_dir_is_refused(dirs: tuple[Path, Path, Path], tmp_path: Path) -> None:
    origin, mnt, cache = dirs
    other = tmp_path / "mnt2"
    other.mkdir()
    m = mount(str(origin), mnt, cache)
    m.expect_errors(r"is in use by another airfs mount")  # the refused daemon logs here too
    try:
        p = run("mount", "--origin", str(origin), "--cache-dir", str(cache), str(other))
        assert_clean_failure(p, other, "in use by another airfs mount")
    finally:
        teardown(m)


def test_overlay_in_place_and_umount(tmp_path: Path) -> None:
    vol = tmp_path / "Volumes"
    (vol / "main" / "default").mkdir(parents=True)
    (vol / "main" / "default" / "existing.txt").write_text("was here")
    m = mount(None, vol, tmp_path / "cache")
    try:
        assert is_mounted(vol)
        assert (vol / "main" / "default" / "existing.txt").read_text() == "was here"
        (vol / "main" / "default" / "new.txt").write_text("written through airfs")
        p = run("umount", str(vol))
        assert p.returncode == 0, p.stderr
        assert "all writes committed" in p.stdout
        assert not is_mounted(vol)
        deadline = time.monotonic() + 10
        while m.alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not m.alive()
    finally:
        teardown(m)
    assert (vol / "main" / "default" / "new.txt").read_text() == "written through airfs"


def test_status_reports_the_mount(dirs: tuple[Path, Path, Path]) -> None:
    origin, mnt, cache = dirs
    t0 = time.monotonic()
    m = mount(str(origin), mnt, cache)
    try:
        (mnt / "f").write_bytes(b"x" * 1000)
        assert (mnt / "f").read_bytes() == b"x" * 1000
        assert run("flush", str(mnt)).returncode == 0
        p = run("status", "--json", str(mnt))
        assert p.returncode == 0, p.stderr
        st = json.loads(p.stdout)
        assert st["origin"] == str(origin)
        assert st["cache_dir"] == str(cache)
        assert st["pid"] == m.pid
        # the daemon started after t0 (uptime is rounded to 0.1 s)
        assert 0 <= st["uptime_s"] <= time.monotonic() - t0 + 0.1
        ops = st["fs"]["ops"]
        # the write reached the daemon, or went to the staging file through passthrough
        wrote = ops.get("write", 0) >= 1 or st["fuse"].get("passthrough_opens", 0) >= 1
        assert ops["create"] >= 1 and wrote
        wb = st["writeback"]
        assert (wb["pending_files"], wb["pending_bytes"]) == (0, 0)  # flushed
        assert (wb["committed_files"], wb["committed_bytes"]) == (1, 1000)
        # the journal's queue: applied in batches, nothing refused, nothing left after flush
        jq = st["journal"]
        assert jq["batches"] >= 1 and jq["failures"] == 0 and jq["queued"] == 0, jq
        assert st["cache"]["kind"] == "cached" and st["cache"]["cache_dir"].startswith(str(cache))
        # the daemon's collector: the young threshold raised, the modules frozen at start
        gc_st = st["gc"]
        assert gc_st["thresholds"] == [50_000, 10, 10], gc_st
        assert gc_st["frozen"] > 10_000, gc_st  # every module's functions and classes
        assert len(gc_st["collections"]) == len(gc_st["seconds"]) == 3, gc_st
        p = run("status", str(mnt / "f"))
        assert p.returncode == 0 and "origin" in p.stdout and str(origin) in p.stdout
        p = run("status", str(origin))
        assert p.returncode == 1 and "not on an airfs mount" in p.stderr
        # a reader that went away (`airfs status MNT | head`): no traceback, SIGPIPE's code
        r, w = os.pipe()
        os.close(r)
        try:
            q = subprocess.run(
                [*AIRFS, "status", str(mnt)], stdout=w, stderr=subprocess.PIPE, text=True,
                timeout=60,
            )
        finally:
            os.close(w)
        assert q.returncode == 141 and "Traceback" not in q.stderr, q.stderr
        assert "BrokenPipe" not in q.stderr, q.stderr
    finally:
        teardown(m)


def test_sigterm_drains_and_unmounts(dirs: tuple[Path, Path, Path]) -> None:
    origin, mnt, cache = dirs
    m = mount(str(origin), mnt, cache)
    try:
        (mnt / "late.bin").write_bytes(b"z" * 100_000)
        os.kill(m.pid, signal.SIGTERM)
        deadline = time.monotonic() + 30
        while (m.alive() or is_mounted(mnt)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not m.alive() and not is_mounted(mnt)
        assert (origin / "late.bin").read_bytes() == b"z" * 100_000
    finally:
        teardown(m)


def test_help_is_there_for_every_command() -> None:
    for cmd in ("mount", "umount", "status", "warm", "flush"):
        p = run(cmd, "--help")
        assert p.returncode == 0 and "usage: airfs " + cmd in p.stdout


@pytest.fixture
def mount_helper() -> Iterator[None]:
    """Install the ``mount.fuse.airfs`` helper where mount(8) looks for it (as the node
    set-up in ``mount/install.sh`` does), and remove it again if we put it there."""
    target = Path("/sbin/mount.fuse.airfs")
    helper = shutil.which("mount.fuse.airfs") or str(
        Path(sys.executable).parent / "mount.fuse.airfs"
    )
    if not Path(helper).exists():
        pytest.skip("mount.fuse.airfs entry point is not installed")
    if os.geteuid() != 0:
        pytest.skip("installing a mount helper needs root")
    created = False
    if not target.exists():
        target.symlink_to(helper)
        created = True
    try:
        yield
    finally:
        if created:
            target.unlink()


def test_mount_t_fuse_airfs(dirs: tuple[Path, Path, Path], mount_helper: None) -> None:
    origin, mnt, cache = dirs
    (origin / "hello.txt").write_text("from fstab")
    p = subprocess.run(
        ["mount", "-t", "fuse.airfs", str(origin), str(mnt), "-o", f"cache_dir={cache},ttl=2"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 0, p.stderr
    m = None
    try:
        assert is_mounted(mnt)
        assert (mnt / "hello.txt").read_text() == "from fstab"
        st = json.loads(run("status", "--json", str(mnt)).stdout)
        assert st["ttl"] == 2.0 and st["cache_dir"] == str(cache)
        m = Mounted(mnt, cache, str(origin), st["pid"])
        (mnt / "via-mount-t").write_text("ok")
        p = subprocess.run(["umount", str(mnt)], capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, p.stderr
        deadline = time.monotonic() + 30
        while m.alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert (origin / "via-mount-t").read_text() == "ok"
    finally:
        if m is not None:
            teardown(m)
