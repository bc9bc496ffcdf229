"""Regression tests of the "Nothing lost" issue through a real mount, on both origins where
the bug is not origin-specific: real vim and flock(1), kill -9 at the moments that lost data,
damaged journal files on disk, a full local disk, a POSIX origin on another filesystem, names
S3 cannot keep, and a mountpoint left dead by a killed daemon."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import subprocess
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from airfs.testing.fixtures import Volume
from airfs.testing.mountfix import mount, teardown

pytestmark = pytest.mark.mount


def _vim() -> str:
    for name in ("vim", "vim.tiny", "vim.basic"):
        path = shutil.which(name)
        if path:
            return path
    pytest.skip("vim is not installed (scripts/setup.sh installs vim-tiny)")


def _remount_after_kill9(v: Volume) -> None:
    v.m.kill9()
    v.m = v.mount()


def test_three_scripted_vim_edits_are_all_kept(volume: Volume) -> None:
    """Bug 2: three ``vim -Es ... -c wq`` in a row kept two appends (10/10 runs), and the
    file's mtime changed by itself after close."""
    vim = _vim()
    f = volume.root / "notes.txt"
    f.write_text("start\n")
    for n in range(3):
        subprocess.run(
            [vim, "-Es", "-u", "NONE", "-c", f"normal Goadded {n}", "-c", "wq", str(f)],
            check=True,
            timeout=60,
            stdin=subprocess.DEVNULL,
        )
    want = "start\nadded 0\nadded 1\nadded 2\n"
    assert f.read_text() == want
    before = os.stat(f)
    volume.m.flush()
    time.sleep(1.5)  # commit done and the TTL passed: attributes come from the origin now
    after = os.stat(f)
    assert (after.st_mtime_ns, after.st_size, after.st_mode) == (
        before.st_mtime_ns,
        before.st_size,
        before.st_mode,
    )
    assert volume.origin_bytes("notes.txt").decode() == want


def test_lock_file_made_by_flock_is_committed(volume: Volume) -> None:
    """Bug 1: flock(1) creates its lock file O_CREAT|O_RDONLY; it was never committed."""
    lock = volume.root / "job.lock"
    subprocess.run(["flock", str(lock), "-c", "true"], check=True, timeout=30)
    volume.m.flush()
    assert volume.origin_bytes("job.lock") == b""
    with open(lock, "w") as f:
        f.write("pid 1\n")
    volume.m.flush()
    assert volume.origin_bytes("job.lock") == b"pid 1\n"


def test_kill9_during_truncating_rewrite_keeps_closed_version(make_volume) -> None:  # type: ignore[no-untyped-def]
    """Bug 5: kill -9 while a pending file is reopened with O_TRUNC and half rewritten lost
    the closed version and committed a torn prefix."""
    v: Volume = make_volume("--emulate-bandwidth", "50K")  # the closed version stays pending
    good = os.urandom(300_000)
    (v.root / "model.pt").write_bytes(good)
    f = open(v.root / "model.pt", "wb")  # noqa: SIM115
    f.write(b"torn" * 1000)
    f.flush()
    try:
        _remount_after_kill9(v)
    finally:
        with contextlib.suppress(OSError):
            f.close()
    assert (v.root / "model.pt").read_bytes() == good
    v.m.flush()
    assert v.origin_bytes("model.pt") == good
    assert (v.tmp / "cache" / "recovered" / "model.pt").read_bytes() == b"torn" * 1000


def test_kill9_after_temp_then_rename_over_committed_file(make_volume) -> None:  # type: ignore[no-untyped-def]
    """Bug 4 (S3): the journal record of the renamed file was written before it knew which
    version it replaces: after the restart its commit conflicted and the old file stayed."""
    v: Volume = make_volume("--emulate-bandwidth", "50K")
    (v.root / "latest.pt").write_bytes(b"old" * 1000)
    v.m.flush()
    new = os.urandom(200_000)
    (v.root / ".latest.pt.tmp").write_bytes(new)
    os.rename(v.root / ".latest.pt.tmp", v.root / "latest.pt")
    _remount_after_kill9(v)
    v.m.flush()
    assert v.origin_bytes("latest.pt") == new
    assert v.m.status()["writeback"]["conflicts"] == []


def test_kill9_right_after_a_batch_of_small_closes_commits_every_file(make_volume) -> None:  # type: ignore[no-untyped-def]
    """Issue 22, item 5: small closes are journaled in shared batches, on the daemon's loop
    while the disk is fast; a close that returned survives ``kill -9`` all the same: 4
    writers close 15 small files each, the daemon is killed right after the last close
    returned (the commits still pending: 50 KB/s to the origin), and after the restart every
    file is committed with its content, none of them kept aside as interrupted."""
    v: Volume = make_volume("--emulate-bandwidth", "50K")
    (v.root / "d").mkdir()
    want = {f"d/w{k}-{i:02d}": os.urandom(700) for k in range(4) for i in range(15)}

    def writer(k: int) -> None:
        for name, data in want.items():
            if name.startswith(f"d/w{k}-"):
                fd = os.open(v.root / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                os.write(fd, data)
                os.close(fd)

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(writer, range(4)))
    _remount_after_kill9(v)
    v.m.flush()
    assert {n: v.origin_bytes(n) for n in want} == want
    recovered = v.tmp / "cache" / "recovered"
    recovered.mkdir(exist_ok=True)
    kept = [str(p.relative_to(recovered)) for p in recovered.rglob("*") if p.is_file()]
    assert kept == [], kept


def test_torch_save_loop_on_one_name_ends_with_the_last_save(make_volume) -> None:  # type: ignore[no-untyped-def]
    """Bug 3's other face: rewriting latest.pt in a loop while commits lag behind ended with
    an older version at the origin."""
    v: Volume = make_volume("--emulate-bandwidth", "2M")
    last = b""
    for i in range(6):
        last = f"save {i} ".encode() * 5000
        tmp = v.root / f".tmp{i}"
        tmp.write_bytes(last)
        os.rename(tmp, v.root / "latest.pt")
        (v.root / "direct.pt").write_bytes(last)  # torch.save(obj, path) rewrites in place
    v.m.flush()
    assert v.origin_bytes("latest.pt") == last
    assert v.origin_bytes("direct.pt") == last
    assert v.m.status()["writeback"]["conflicts"] == []


@pytest.mark.parametrize("damage", ["missing", "empty"])
def test_damaged_journal_refuses_mount_then_rebuild_commits_all(make_volume, damage: str) -> None:  # type: ignore[no-untyped-def]
    """Bug 6: with the journal missing or empty, mount and flush succeeded and every pending
    file was dropped into recovered/<uuid>."""
    v: Volume = make_volume("--emulate-bandwidth", "20K")  # commits take ~5 s each
    files = {f"d{i}.bin": os.urandom(100_000) for i in range(5)}
    for name, data in files.items():
        (v.root / name).write_bytes(data)
    v.m.kill9()
    journal = v.tmp / "cache" / "journal"
    if damage == "missing":
        shutil.rmtree(journal)
    else:
        os.truncate(journal / "data.mdb", 0)
    with pytest.raises(RuntimeError) as info:
        v.mount()
    msg = str(info.value)
    assert "--rebuild-journal" in msg and " closed file(s)" in msg, msg
    v.extra.clear()  # the slow origin kept them pending; the rebuild's commits need not wait
    v.m = v.mount("--rebuild-journal")
    v.m.flush()
    for name, data in files.items():
        assert v.origin_bytes(name) == data


def test_mount_after_kill9_clears_the_dead_mountpoint(volume: Volume) -> None:
    """Bug 14: after kill -9 the next ``airfs mount`` failed ("mountpoint does not exist")
    until ``umount --force``; the systemd unit would retry forever."""
    (volume.root / "x").write_bytes(b"x")
    volume.m.kill9(clear_mount=False)
    with pytest.raises(OSError) as info:
        os.stat(volume.root)
    assert info.value.errno in (errno.ENOTCONN, errno.ECONNABORTED)
    volume.m = volume.mount()
    volume.m.flush()
    assert volume.origin_bytes("x") == b"x"


def test_posix_origin_on_another_filesystem_commits(tmp_path: Path) -> None:
    """Bug 11: ``copy_file_range`` has no EXDEV fallback: a POSIX origin on another
    filesystem than the cache dir (any NFS origin) never committed."""
    if not os.path.isdir("/dev/shm"):
        pytest.skip("needs /dev/shm (tmpfs)")
    origin = Path("/dev/shm") / f"airfs-origin-{uuid.uuid4().hex[:8]}"
    origin.mkdir()
    (tmp_path / "mnt").mkdir()
    try:
        m = mount(str(origin), tmp_path / "mnt", tmp_path / "cache")
        try:
            data = os.urandom(3 << 20)
            (m.mountpoint / "f.bin").write_bytes(data)
            m.flush(timeout=60)
            assert (origin / "f.bin").read_bytes() == data
        finally:
            teardown(m)
    finally:
        shutil.rmtree(origin, ignore_errors=True)


def test_full_local_disk_gives_enospc_and_the_daemon_survives(tmp_path: Path) -> None:
    """Bug 13: with the local disk full, close() returned EIO and the daemon crashed (2 of 3
    runs). Writes get ENOSPC; nothing closed is lost; the daemon keeps serving; the space
    of a deleted staged file comes back at its unlink (a file created right after it fits:
    the deletion was left to the journal's next batch, up to a second later)."""
    if os.geteuid() != 0:
        pytest.skip("needs root (mounts a small tmpfs as the cache dir)")
    cache = tmp_path / "cache"
    cache.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48m", "tmpfs", str(cache)], check=True)
    origin = tmp_path / "origin"
    origin.mkdir()
    (tmp_path / "mnt").mkdir()
    try:
        # no staging floor: the disk itself runs full (the floor is the next test's)
        m = mount(
            str(origin), tmp_path / "mnt", cache, "--emulate-bandwidth", "8M",
            "--staging-min-free", "0",
        )  # fmt: skip
        m.expect_errors(r"\[Errno 28\]")
        try:
            (m.mountpoint / "kept.bin").write_bytes(b"k" * 100_000)
            with pytest.raises(OSError) as info, open(m.mountpoint / "big.bin", "wb") as f:
                for _ in range(80):
                    f.write(b"b" * (1 << 20))
            assert info.value.errno == errno.ENOSPC
            assert m.alive()
            os.unlink(m.mountpoint / "big.bin")
            (m.mountpoint / "after.bin").write_bytes(b"a" * 1000)
            m.flush(timeout=60)
            assert (origin / "kept.bin").read_bytes() == b"k" * 100_000
            assert (origin / "after.bin").read_bytes() == b"a" * 1000
            assert m.alive()
        finally:
            teardown(m)
    finally:
        subprocess.run(["umount", "-l", str(cache)], check=False)


def test_staging_leaves_its_floor_free_and_keeps_every_accepted_byte(tmp_path: Path) -> None:
    """Issue 21: the staging area filled the cache filesystem to 0 bytes free (its floor was
    0 in the daemon). A write that would go under ``--staging-min-free`` gets ENOSPC; the
    floor is left free; every byte a write accepted is committed."""
    if os.geteuid() != 0:
        pytest.skip("needs root (mounts a small tmpfs as the cache dir)")
    cache = tmp_path / "cache"
    cache.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(cache)], check=True)
    origin = tmp_path / "origin"
    origin.mkdir()
    (tmp_path / "mnt").mkdir()
    try:
        m = mount(
            str(origin), tmp_path / "mnt", cache, "--staging-min-free", "16M",
            "--write-wait", "1",
        )  # fmt: skip
        m.expect_errors(r"write: \[Errno 28\] cache filesystem of .* nearly full")
        try:
            fd = os.open(m.mountpoint / "big.bin", os.O_WRONLY | os.O_CREAT, 0o644)
            accepted = 0
            try:
                with pytest.raises(OSError) as info:
                    for i in range(80):
                        accepted += os.write(fd, bytes([i]) * (1 << 20))
                assert info.value.errno == errno.ENOSPC
                sv = os.statvfs(cache)
                assert sv.f_bavail * sv.f_frsize >= 15 << 20  # the floor, less the journal's
                assert 30 << 20 <= accepted <= 48 << 20
            finally:
                os.close(fd)
            m.flush(timeout=60)
            data = (origin / "big.bin").read_bytes()
            assert len(data) == accepted
            assert data == b"".join(bytes([i]) * (1 << 20) for i in range(accepted >> 20))
            (m.mountpoint / "after.bin").write_bytes(b"a" * (8 << 20))  # room again
            m.flush(timeout=60)
            assert (origin / "after.bin").stat().st_size == 8 << 20
        finally:
            teardown(m)
    finally:
        subprocess.run(["umount", "-l", str(cache)], check=False)


@pytest.mark.s3
def test_s3_refuses_names_it_cannot_keep_at_create(make_volume, origin_spec) -> None:  # type: ignore[no-untyped-def]
    """Bug 16: names S3 cannot keep (backslash, which SeaweedFS turns into "/", control
    characters, keys over 1,024 bytes) were accepted at create and could never commit."""
    if origin_spec.kind != "s3":
        pytest.skip("S3 only")
    v: Volume = make_volume()
    for bad in ("back\\slash", "new\nline"):
        with pytest.raises(OSError) as info:
            open(v.root / bad, "w").close()
        assert info.value.errno == errno.EINVAL, bad
    d = v.root
    for i in range(4):
        d = d / (chr(ord("a") + i) * 250)
        d.mkdir()
    with pytest.raises(OSError) as info:
        (d / ("z" * 250)).write_bytes(b"x")
    assert info.value.errno == errno.ENAMETOOLONG
    v.m.flush()  # nothing uncommittable was left behind
    assert v.m.umount().returncode == 0


def test_cli_flush_exits_nonzero_when_a_write_lost(make_volume) -> None:  # type: ignore[no-untyped-def]
    """Bug 8: ``airfs flush`` exited 0 although a write had lost a conflict."""
    v: Volume = make_volume("--emulate-bandwidth", "20K")
    v.m.expect_errors(r"commit lost a conflict|lost a conflict")
    (v.root / "shared.txt").write_bytes(b"v0")
    v.m.flush()
    with open(v.root / "shared.txt", "wb") as f:
        f.write(b"mine" * 25_000)  # its commit takes ~5 s
    # another writer replaces the object at the origin while our commit waits
    other = v.tmp / "other"
    other.write_bytes(b"theirs")
    v.spec.view.put("shared.txt", str(other))
    p = subprocess.run(
        [sys.executable, "-m", "airfs.cli", "flush", str(v.root)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 1, (p.returncode, p.stderr)
    assert "shared.txt" in p.stderr and "conflicts" in p.stderr, p.stderr


def test_readers_of_a_file_replaced_by_rename_never_fail(volume: Volume) -> None:
    """Bug 10: readers of a file replaced by rename on the same node got ENOENT/EIO (8% of
    opens; the log said "keeps changing at the origin" though this node was the only
    writer)."""
    import threading

    target = volume.root / "current.json"
    target.write_bytes(b"v-1")
    volume.m.flush()
    errors: list[str] = []
    seen: set[bytes] = set()
    stop = threading.Event()

    def read_loop() -> None:
        while not stop.is_set():
            try:
                seen.add(target.read_bytes())
            except OSError as exc:
                errors.append(f"{exc.errno}: {exc}")

    t = threading.Thread(target=read_loop)
    t.start()
    try:
        for i in range(40):
            tmp = volume.root / f".current.{i}"
            tmp.write_bytes(f"v{i}".encode())
            os.rename(tmp, target)
            if i % 10 == 0:
                volume.m.flush()
    finally:
        stop.set()
        t.join(30)
    assert errors == []
    assert seen <= {b"v-1", *(f"v{i}".encode() for i in range(40))}
    volume.m.flush()
    assert volume.origin_bytes("current.json") == b"v39"
