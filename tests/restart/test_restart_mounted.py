"""Issue 25 part 1 ("a mount that survives its daemon") through real mounts, on both origins:
a ``--restartable`` mount's daemon is replaced by ``airfs restart`` and killed with SIGKILL,
while real processes use the mount (a reader of a large file that also maps it and has its
working directory in the mount, a checkpoint writer that keeps one file open for writing
across the hand-overs, a ``tail -f``); none of them sees an error, every byte read is the
file's, and every byte written is in the checkpoint, through the mount and at the origin.
A take-over that cannot read the saved state clears and remounts with one line saying why;
``airfs restart`` of a mount without a holder and ``--restartable`` with pyfuse3 are
refused with their reason.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from airfs.testing.fixtures import Volume
from airfs.testing.mountfix import Mounted, airfs_cmd, mount, teardown

pytestmark = pytest.mark.mount

SIZE = 48 << 20


def _ppid(pid: int) -> int:
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _daemon_pid(m: Mounted, other_than: int, timeout: float = 60) -> int:
    """The pid of the daemon serving ``m`` once it is not ``other_than`` (a take-over)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            pid = int(m.status()["pid"])
        except Exception:  # the control socket is away during the hand-over
            pid = other_than
        if pid != other_than:
            return pid
        time.sleep(0.05)
    raise AssertionError(f"no daemon took over within {timeout}s:\n{m.log_tail()}")


@pytest.fixture
def restartable(make_volume: Callable[..., Volume]) -> Iterator[tuple[Volume, int]]:
    """A ``--restartable`` kernel-transport mount with a large file and a directory in it;
    yields it and its holder's pid (checked gone after the teardown)."""
    v = make_volume("--restartable", "--fuse", "kernel")
    (v.root / "d").mkdir()
    data = os.urandom(1 << 20) * (SIZE >> 20)
    (v.root / "d" / "big").write_bytes(data)
    (v.root / "d" / "log.txt").write_text("first line\n")
    v.m.flush()
    holder = _ppid(v.m.pid)
    yield v, holder
    teardown(v.m)
    deadline = time.monotonic() + 20
    while _alive(holder) and time.monotonic() < deadline:
        time.sleep(0.05)
    alive = _alive(holder)
    if alive:
        os.kill(holder, signal.SIGKILL)
    assert not alive, "the holder did not exit after the unmount"


class Jobs:
    """The processes that use the mount across the hand-overs."""

    def __init__(self, root: Path, pause: float) -> None:
        env = {**os.environ}
        self.reader = subprocess.Popen(
            [sys.executable, "-m", "airfs.testing.jobs", "reader", str(root / "d"), "big",
             str(1 << 20), str(pause)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        )  # fmt: skip
        # a checkpoint written over the same time (one write of 256 KiB per read)
        self.writer = subprocess.Popen(
            [sys.executable, "-m", "airfs.testing.jobs", "writer", str(root / "d"), "ckpt",
             str(SIZE >> 20), str(256 << 10), str(pause)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        )  # fmt: skip
        self.tail = subprocess.Popen(
            ["tail", "-f", str(root / "d" / "log.txt")],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip

    def finish(self, v: Volume, expect: bytes) -> dict[str, object]:
        import hashlib

        out, err = self.reader.communicate(timeout=300)
        assert self.reader.returncode == 0, err
        got = json.loads(out)
        assert got["error"] is None, got["error"]
        want = hashlib.sha256(expect).hexdigest()
        assert got["read"] == want, "the reader read bytes that are not the file's"
        assert got["mmap"] == want, "the mapping shows bytes that are not the file's"
        out, err = self.writer.communicate(timeout=300)
        assert self.writer.returncode == 0, err
        wrote = json.loads(out)
        assert wrote["error"] is None, wrote["error"]
        ckpt = v.root / "d" / "ckpt"
        assert hashlib.sha256(ckpt.read_bytes()).hexdigest() == wrote["wrote"], (
            "the checkpoint through the mount is not what the writer wrote"
        )
        # the writer may still be writing (its temporary name) when the reader lists
        assert set(got["listed"]) - {"ckpt.tmp", "ckpt"} == {"big", "log.txt"}
        v.m.flush()
        assert hashlib.sha256(v.origin_bytes("d/ckpt")).hexdigest() == wrote["wrote"], (
            "the checkpoint at the origin is not what the writer wrote"
        )
        assert not list((v.m.cache_dir / "recovered").rglob("*")), "bytes were set aside"
        assert self.tail.poll() is None, "tail -f stopped"
        self.tail.terminate()
        tout, terr = self.tail.communicate(timeout=10)
        assert terr == "", terr
        assert "first line" in tout
        return got


def test_restart_and_kill9_keep_jobs_running(restartable: tuple[Volume, int]) -> None:
    v, holder = restartable
    m = v.m
    data = (v.root / "d" / "big").read_bytes()
    jobs = Jobs(v.root, pause=0.25)  # 48 reads: ~12 s, across both hand-overs
    time.sleep(0.5)
    # (a) airfs restart: the new code takes over, the old daemon retires
    old = m.pid
    p = subprocess.run(
        [*airfs_cmd(), "restart", str(m.mountpoint)], capture_output=True, text=True, timeout=120
    )
    assert p.returncode == 0, p.stderr
    assert "hand-over" in p.stdout
    m.pid = _daemon_pid(m, old)
    assert _ppid(m.pid) == holder
    # (b) kill -9: the holder starts a daemon that takes over
    old = m.pid
    os.kill(old, signal.SIGKILL)
    m.pid = _daemon_pid(m, old)
    assert _ppid(m.pid) == holder
    assert jobs.reader.poll() is None, "the reader ended before the hand-overs were done"
    jobs.finish(v, data)
    log = m.own_log()
    assert "retired: the next daemon takes over" in log
    assert log.count("took over the mount") == 2
    # what was written through the mount before is all there, and new work goes on
    (v.root / "d" / "after").write_bytes(b"x" * 1000)
    assert (v.root / "d" / "after").read_bytes() == b"x" * 1000


def test_takeover_without_state_remounts_with_a_reason(restartable: tuple[Volume, int]) -> None:
    v, _ = restartable
    m = v.m
    os.unlink(m.cache_dir / "takeover" / "init.json")
    old = m.pid
    os.kill(old, signal.SIGKILL)
    m.pid = _daemon_pid(m, old)
    assert (v.root / "d" / "log.txt").read_text() == "first line\n"
    assert (
        "cannot take over the mount: no saved INIT (the old daemon never finished INIT); "
        "clearing it and mounting again" in m.own_log()
    )
    # the fresh mount is restartable again
    old = m.pid
    os.kill(old, signal.SIGKILL)
    m.pid = _daemon_pid(m, old)
    assert (v.root / "d" / "log.txt").read_text() == "first line\n"
    assert m.own_log().count("took over the mount in") == 1


def test_restart_refusals(tmp_path: Path) -> None:
    from airfs.testing.mountfix import fuse_available

    if not fuse_available():
        pytest.skip("needs /dev/fuse")
    origin = tmp_path / "o"
    origin.mkdir()
    mp = tmp_path / "mnt"
    mp.mkdir()
    p = subprocess.run(
        [*airfs_cmd(), "mount", "--origin", str(origin), "--cache-dir", str(tmp_path / "c"),
         "--restartable", "--fuse", "pyfuse3", str(mp)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert p.returncode == 1
    assert "--restartable needs the kernel transport (--fuse kernel" in p.stderr
    m = mount(str(origin), mp, tmp_path / "c", "--fuse", "kernel")
    try:
        p = subprocess.run(
            [*airfs_cmd(), "restart", str(mp)], capture_output=True, text=True, timeout=60
        )
        assert p.returncode == 1
        assert "has no holder (mounted without --restartable)" in p.stderr
    finally:
        teardown(m)
    p = subprocess.run(
        [*airfs_cmd(), "restart", str(mp)], capture_output=True, text=True, timeout=60
    )
    assert p.returncode == 1
    assert "is not an airfs mount" in p.stderr


@pytest.mark.slow
def test_twenty_kill9_in_a_row_under_load(restartable: tuple[Volume, int]) -> None:
    v, holder = restartable
    m = v.m
    data = (v.root / "d" / "big").read_bytes()
    jobs = Jobs(v.root, pause=1.0)  # 48 reads: ~48 s, across the 20 take-overs
    for _ in range(20):
        time.sleep(0.3)
        old = m.pid
        os.kill(old, signal.SIGKILL)
        m.pid = _daemon_pid(m, old)
        assert _ppid(m.pid) == holder
    assert jobs.reader.poll() is None, "the reader ended before the take-overs were done"
    jobs.finish(v, data)
    assert m.own_log().count("took over the mount in") == 20


def test_a_file_open_for_writing_is_carried_over(restartable: tuple[Volume, int]) -> None:
    """A writer's handle is reopened by the new daemon on the version it was writing (a new
    file, and a rewrite of a committed one, whose mode and owner survive): its later writes
    and its close go on, and the file is committed whole with them; nothing is set aside.
    (It used to be lost: EBADF on the writes and the close, the bytes under recovered/.)"""
    v, _ = restartable
    m = v.m
    (v.root / "d" / "old").write_bytes(b"o" * 10000)
    os.chmod(v.root / "d" / "old", 0o600)
    m.flush()
    new = os.open(v.root / "d" / "ckpt", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o640)
    rewrite = os.open(v.root / "d" / "old", os.O_RDWR)
    try:
        os.write(new, b"a" * 4096)
        os.pwrite(rewrite, b"r" * 100, 50)
        old = m.pid
        os.kill(old, signal.SIGKILL)
        m.pid = _daemon_pid(m, old)
        os.write(new, b"b" * 4096)
        os.pwrite(rewrite, b"s" * 100, 9950)
        # airfs restart, with both still open
        old = m.pid
        p = subprocess.run(
            [*airfs_cmd(), "restart", str(m.mountpoint)],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert p.returncode == 0, p.stderr
        m.pid = _daemon_pid(m, old)
        os.write(new, b"c" * 4096)
        assert os.pread(rewrite, 10, 45) == b"ooooorrrrr"
    finally:
        os.close(new)
        os.close(rewrite)
    want_new = b"a" * 4096 + b"b" * 4096 + b"c" * 4096
    want_old = b"o" * 50 + b"r" * 100 + b"o" * 9800 + b"s" * 100  # 50 bytes past the end
    assert (v.root / "d" / "ckpt").read_bytes() == want_new
    assert (v.root / "d" / "old").read_bytes() == want_old
    m.flush()
    assert v.origin_bytes("d/ckpt") == want_new
    assert v.origin_bytes("d/old") == want_old
    assert v.spec.view.stat("d/old").mode & 0o777 == 0o600
    assert v.spec.view.stat("d/ckpt").mode & 0o777 == 0o640
    assert not list((m.cache_dir / "recovered").rglob("*")), "bytes were set aside"
    log = m.own_log()
    assert "was open for writing: adopted for the take-over" in log
    assert "not reopened" not in log
    assert log.count("took over the mount in") == 2


def test_a_hand_over_drops_the_leases_the_old_daemon_gave(
    restartable: tuple[Volume, int], tmp_path: Path
) -> None:
    """The kernel keeps names past the TTL on the serving daemon's leases (issue 22, item 3);
    the daemon taking over does not check them, so it drops them: a change made at the
    origin right after ``airfs restart`` is seen within the TTL."""
    v, _ = restartable
    m = v.m
    v.spec.view.mkdir("e")
    src = tmp_path / "src.bin"
    src.write_bytes(b"x")
    for i in range(20):
        v.spec.view.put(f"e/f{i:02d}", str(src))
    e = v.root / "e"
    names = sorted(os.listdir(e))
    for _ in range(2):  # the second pass, after the TTL, is on leases
        for n in names:
            os.stat(e / n)
        time.sleep(1.3)
    assert m.status()["fs"]["kernel_cache"]["leases"] >= len(names)
    old = m.pid
    p = subprocess.run(
        [*airfs_cmd(), "restart", str(m.mountpoint)], capture_output=True, text=True, timeout=120
    )
    assert p.returncode == 0, p.stderr
    m.pid = _daemon_pid(m, old)
    src.write_bytes(b"changed")
    v.spec.view.put("e/f03", str(src))
    time.sleep(1.3)  # the TTL
    assert os.stat(e / "f03").st_size == len(b"changed")
    assert (e / "f03").read_bytes() == b"changed"
    assert "name(s) the kernel holds dropped" in m.own_log()
