"""Both FUSE transports in the default run.

``test_semantics.py`` runs on the default transport; this module runs every one of its cases
again on the other one (``AIRFS_TEST_FUSE``, which ``mountfix.mount`` turns into ``--fuse``),
and adds what only the kernel transport does: negotiation reported in ``airfs status``, 1 MiB
requests, no FLUSH for read-only handles, and a non-root mount through ``fusermount3``.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_semantics import *  # noqa: F403  (the semantics suite, collected again here)

from airfs.fuse import DEFAULT_TRANSPORT, TRANSPORTS
from airfs.testing.fixtures import Volume
from airfs.testing.mountfix import airfs_cmd, fuse_available, is_mounted

OTHER = next(t for t in TRANSPORTS if t != DEFAULT_TRANSPORT)

pytestmark = pytest.mark.mount


@pytest.fixture(autouse=True)
def _other_transport(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFS_TEST_FUSE", OTHER)


@pytest.fixture
def kvolume(make_volume: object, monkeypatch: pytest.MonkeyPatch) -> Volume:
    monkeypatch.setenv("AIRFS_TEST_FUSE", "kernel")
    return make_volume()  # type: ignore[operator]


def test_status_reports_what_was_negotiated(kvolume: Volume) -> None:
    fuse = kvolume.m.status()["fuse"]
    assert fuse["transport"] == "kernel"
    major, minor = (int(x) for x in fuse["protocol"].split("."))
    assert major == 7 and minor >= 31
    for flag in ("ASYNC_READ", "DO_READDIRPLUS", "PARALLEL_DIROPS", "MAX_PAGES"):
        assert flag in fuse["flags"]
    assert fuse["max_write"] == fuse["max_pages"] * 4096 >= 128 << 10
    assert "negotiated" in kvolume.m.log.read_text()
    # the readahead is raised before the mount reports ready
    assert kvolume.m.status()["read_ahead_kb"] == 1024


def test_a_file_opened_as_the_mount_returns_reads_in_1_mib_requests(
    make_volume: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file keeps the readahead of the moment it was opened: one opened by a job as soon
    as ``airfs mount`` returned read in 128 KiB requests for its whole life (8x the requests
    of a sequential read) when the readahead was raised after the mount reported ready."""
    monkeypatch.setenv("AIRFS_TEST_FUSE", "kernel")
    v: Volume = make_volume("--no-passthrough")  # type: ignore[operator]
    data = os.urandom(16 << 20)
    (v.root / "seq.bin").write_bytes(data)
    v.remount()
    fd = os.open(v.root / "seq.bin", os.O_RDONLY)  # at once
    try:
        before = v.m.status()["fs"]["ops"].get("read", 0)
        got = b"".join(iter(lambda: os.read(fd, 1 << 20), b""))
    finally:
        os.close(fd)
    reads = v.m.status()["fs"]["ops"]["read"] - before
    assert got == data
    assert reads <= 16 + 2, f"{reads} read requests for 16 MiB (1 MiB each expected)"


def test_large_writes_arrive_as_large_requests(
    make_volume: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Daemon-served writes (passthrough off: with it, the daemon sees none at all)."""
    monkeypatch.setenv("AIRFS_TEST_FUSE", "kernel")
    kvolume: Volume = make_volume("--no-passthrough")  # type: ignore[operator]
    fuse = kvolume.m.status()["fuse"]
    before = kvolume.m.status()["fs"]["ops"].get("write", 0)
    data = os.urandom(8 << 20)
    fd = os.open(kvolume.root / "big", os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        assert os.write(fd, data) == len(data)
    finally:
        os.close(fd)
    writes = kvolume.m.status()["fs"]["ops"]["write"] - before
    assert writes <= (8 << 20) // fuse["max_write"] + 1
    assert (kvolume.root / "big").read_bytes() == data


def test_read_only_closes_send_no_flush(kvolume: Volume) -> None:
    (kvolume.root / "f").write_bytes(b"abc")
    ops = kvolume.m.status()["fs"]["ops"]
    for _ in range(20):
        with open(kvolume.root / "f", "rb") as f:
            assert f.read() == b"abc"
    after = kvolume.m.status()["fs"]["ops"]
    assert after.get("flush", 0) == ops.get("flush", 0)
    assert after["release"] >= ops.get("release", 0) + 20
    # a written file's close still flushes (it is journaled then)
    with open(kvolume.root / "g", "wb") as f:
        f.write(b"x")
    assert kvolume.m.status()["fs"]["ops"]["flush"] > after.get("flush", 0)


# -- a non-root mount through fusermount3 ---------------------------------------------------------


@pytest.fixture
def user() -> Iterator[pwd.struct_passwd]:
    if os.geteuid() != 0:
        pytest.skip("creates a user (needs root)")
    if shutil.which("useradd") is None:
        pytest.skip("needs useradd")
    name = f"airfskt{uuid.uuid4().hex[:8]}"
    subprocess.run(["useradd", "-M", "-N", "-s", "/bin/sh", name], check=True)
    try:
        yield pwd.getpwnam(name)
    finally:
        subprocess.run(["userdel", name], capture_output=True)


def _as(
    pw: pwd.struct_passwd, args: list[str], env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        args, user=pw.pw_uid, group=pw.pw_gid, extra_groups=[], env=env, capture_output=True,
        text=True, timeout=120,
    )  # fmt: skip


SCRIPT = """
import os, sys, json
root = sys.argv[1]
with open(os.path.join(root, "seed.txt")) as f:
    assert f.read() == "seed", "seed"
with open(os.path.join(root, "new.bin"), "wb") as f:
    f.write(b"n" * 300000)
os.mkdir(os.path.join(root, "d"))
os.rename(os.path.join(root, "new.bin"), os.path.join(root, "d", "moved.bin"))
assert os.path.getsize(os.path.join(root, "d", "moved.bin")) == 300000
print(json.dumps(sorted(os.listdir(root))))
"""


def test_non_root_mount_through_fusermount3(user: pwd.struct_passwd) -> None:
    if not fuse_available():
        pytest.skip("needs /dev/fuse and fusermount3")
    if not _interpreter_runs_as(user):
        pytest.skip(
            f"{sys.executable} cannot be run by other users (installed under a private home)"
        )
    base = Path(f"/tmp/airfs-kt-{uuid.uuid4().hex[:8]}")
    for sub in ("", "origin", "mnt", "cache"):
        (base / sub).mkdir(mode=0o755)
        os.chown(base / sub, user.pw_uid, user.pw_gid)
    (base / "origin" / "seed.txt").write_text("seed")
    os.chown(base / "origin" / "seed.txt", user.pw_uid, user.pw_gid)
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(base),
        "PYTHONPATH": os.environ.get("PYTHONPATH", ""),
    }
    mnt = str(base / "mnt")
    pid = None
    try:
        p = _as(user, [*airfs_cmd(), "mount", "--fuse", "kernel", "--origin", str(base / "origin"),
                       "--cache-dir", str(base / "cache"), "--quiet", mnt], env)  # fmt: skip
        assert p.returncode == 0, p.stderr + (base / "cache" / "airfs.log").read_text()
        assert is_mounted(mnt)
        st = _as(user, [*airfs_cmd(), "status", "--json", mnt], env)
        assert st.returncode == 0, st.stderr
        status = json.loads(st.stdout)
        pid = int(status["pid"])
        assert status["fuse"]["transport"] == "kernel" and not status["fuse"]["passthrough"]
        # a user cannot raise the readahead: tried once (the mount waits for it), not retried
        assert status["read_ahead_kb"] is None
        assert (base / "cache" / "airfs.log").read_text().count("could not raise") == 1
        r = _as(user, [sys.executable, "-c", SCRIPT, mnt], env)
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout) == ["d", "seed.txt"]
        u = _as(user, [*airfs_cmd(), "umount", mnt], env)
        assert u.returncode == 0, u.stderr
        assert not is_mounted(mnt)
        assert (base / "origin" / "d" / "moved.bin").stat().st_size == 300000
    finally:
        if is_mounted(mnt):
            subprocess.run(["fusermount3", "-u", "-z", mnt], capture_output=True)
        if pid is not None and Path(f"/proc/{pid}").exists():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 15)
        shutil.rmtree(base, ignore_errors=True)


def _interpreter_runs_as(pw: pwd.struct_passwd) -> bool:
    try:
        return _as(pw, [sys.executable, "-c", "0"], {}).returncode == 0
    except PermissionError:
        return False


async def test_fusermount3_mount_serves_a_real_core(tmp_path: Path) -> None:
    """The fusermount3 path (``_FUSE_COMMFD`` fd passing) with a core served in this process;
    the files are touched from worker threads so that this loop can answer them."""
    import trio

    from airfs.daemon.build import build
    from airfs.fuse.kernel import mount as kmount
    from airfs.fuse.kernel.session import Session
    from airfs.origin.posix import PosixOrigin

    if not fuse_available():
        pytest.skip("needs /dev/fuse and fusermount3")
    (tmp_path / "origin").mkdir()
    (tmp_path / "origin" / "a.txt").write_text("from the origin")
    (tmp_path / "mnt").mkdir()
    mnt = str(tmp_path / "mnt")
    sync = PosixOrigin(str(tmp_path / "origin"))
    fd = kmount.mount(mnt, fsname="airfs-test", via="fusermount3")
    try:
        async with (
            build(sync, str(tmp_path / "cache"), ttl=1.0) as b,
            trio.open_nursery() as nursery,
        ):
            session = Session(fd, b.fs, 1.0)
            nursery.start_soon(session.run)
            names = await trio.to_thread.run_sync(os.listdir, mnt)
            text = await trio.to_thread.run_sync((tmp_path / "mnt" / "a.txt").read_text)
            await trio.to_thread.run_sync((tmp_path / "mnt" / "b.txt").write_text, "new")
            size = (await trio.to_thread.run_sync(os.stat, tmp_path / "mnt" / "b.txt")).st_size
            assert names == ["a.txt"] and text == "from the origin" and size == 3
            assert session.negotiated is not None and session.negotiated.max_write >= 128 << 10
            await trio.to_thread.run_sync(lambda: kmount.unmount(mnt, via="fusermount3"))
            with trio.fail_after(10):
                await session._done.wait()  # the loop sees the unmount (ENODEV) and ends
    finally:
        if is_mounted(mnt):
            subprocess.run(["fusermount3", "-u", "-z", mnt], capture_output=True)
        os.close(fd)
        sync.close()


async def test_passthrough_open_reads_without_the_daemon(tmp_path: Path) -> None:
    """The kernel side of passthrough: the core names a local file for a handle (here a read
    path whose "cache file" of an object is the directory origin's file itself, standing in
    for the block cache's) and the open gets FOPEN_PASSTHROUGH, whose reads and mmap never
    reach the daemon; two opens share one backing id, dropped at the last RELEASE."""
    import mmap

    import trio

    from airfs.core.fs import Filesystem
    from airfs.core.readpath import DirectReadPath, LocalFile, ObjectRef
    from airfs.fuse.kernel import mount as kmount
    from airfs.fuse.kernel.session import Session
    from airfs.origin.aio import AsyncOrigin
    from airfs.origin.posix import PosixOrigin
    from airfs.writeback.staging import StagingArea

    if not fuse_available() or not kmount.has_cap_sys_admin():
        pytest.skip("passthrough needs /dev/fuse and CAP_SYS_ADMIN")
    odir = tmp_path / "origin"
    odir.mkdir()
    data = os.urandom(3 << 20)
    (odir / "data.bin").write_bytes(data)
    (tmp_path / "mnt").mkdir()
    mnt = str(tmp_path / "mnt")

    class OriginFile:
        def __init__(self, obj: ObjectRef) -> None:
            self.fd = os.open(odir / obj.path, os.O_RDONLY | os.O_CLOEXEC)
            self.key = f"origin:{obj.path}:{obj.version}"

        def release(self) -> None:
            os.close(self.fd)

    class LocalOrigin(DirectReadPath):
        async def local_file(self, obj: ObjectRef, *, fetch_max: int = 0) -> LocalFile | None:
            return OriginFile(obj)

    sync = PosixOrigin(str(odir))
    origin = AsyncOrigin(sync)
    area = StagingArea(str(tmp_path / "cache"), limit=1 << 30, min_free=0)
    fs = Filesystem(origin, LocalOrigin(origin), area, await origin.stat(""), ttl=1.0)
    fd = kmount.mount(mnt, fsname="airfs-test", via="mount2")
    session = Session(fd, fs, 1.0, passthrough=True)

    backing_files: list[int] = []

    def read_and_map() -> tuple[bytes, bytes]:
        with (
            open(tmp_path / "mnt" / "data.bin", "rb") as f,
            open(tmp_path / "mnt" / "data.bin", "rb") as g,
        ):
            whole = f.read()
            with mmap.mmap(g.fileno(), 0, prot=mmap.PROT_READ) as m:
                tail = m[-4096:]
            backing_files.append(
                trio.from_thread.run_sync(lambda: session.statistics().backing_files)
            )
        return whole, tail

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(session.run)
            whole, tail = await trio.to_thread.run_sync(read_and_map)
            assert session.negotiated is not None and session.negotiated.passthrough
            assert whole == data and tail == data[-4096:]
            stats = session.statistics()
            assert stats.passthrough.passthrough_opens == 2 and backing_files == [1]
            assert fs.ops["read"] == 0  # every byte came from the backing file in the kernel
            with trio.fail_after(10):  # the RELEASEs are asynchronous
                while session.statistics().backing_files:
                    await trio.sleep(0.01)
            await trio.to_thread.run_sync(lambda: kmount.unmount(mnt, via="mount2"))
            with trio.fail_after(10):
                await session._done.wait()
    finally:
        if is_mounted(mnt):
            subprocess.run(["umount", "-l", mnt], capture_output=True)
        os.close(fd)
        area.close()
        sync.close()


def test_unchanged_directory_listing_is_kept_by_the_kernel(kvolume: Volume) -> None:
    """FOPEN_CACHE_DIR: once the listing the kernel cached is the one the core sees again, a
    readdir is answered by the kernel; a change (here: made at the origin by another program,
    seen after the TTL) makes the kernel read the directory again."""
    d = kvolume.root / "dir"
    d.mkdir()
    names = {f"f{i:03d}" for i in range(50)}
    for n in names:
        (d / n).write_bytes(b"x")
    kvolume.m.flush()

    def readdirs() -> int:
        return int(kvolume.m.status()["fs"]["ops"].get("readdir", 0))

    for _ in range(2):  # the first read fills the kernel's cache, the second binds inodes
        assert set(os.listdir(d)) == names
    kept0, r0 = kvolume.m.status()["fuse"]["dir_cache_kept"], readdirs()
    assert set(os.listdir(d)) == names
    assert kvolume.m.status()["fuse"]["dir_cache_kept"] == kept0 + 1
    assert readdirs() == r0  # served from the kernel's cache
    if kvolume.spec.dir is not None:
        (kvolume.spec.dir / "dir" / "from-elsewhere").write_bytes(b"y")
    else:
        src = kvolume.tmp / "src"
        src.write_bytes(b"y")
        kvolume.spec.view.put("dir/from-elsewhere", str(src))
    time.sleep(1.2)  # past the TTL (1 s): the core lists the origin again
    assert set(os.listdir(d)) == names | {"from-elsewhere"}
    assert readdirs() > r0
    (d / "local-new").write_bytes(b"z")  # a change made here is seen at once
    assert "local-new" in os.listdir(d)
