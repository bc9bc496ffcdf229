"""Issue 20 ("Nothing lost, nothing leaked") through a real mount: the daemon killed at precise
points of a commit (``AIRFS_CRASH_AT``, :mod:`airfs.util.crashpoint`: the daemon SIGKILLs
itself there) and with a real ``kill -9``, then mounted again.

* a crash in our own commit is never a conflict afterwards, on both FUSE transports;
* the temporary files of commits a crash cut short are removed at the next mount (only this
  node's: another node's, another tool's are left alone), and so are the control sockets of
  killed daemons;
* a mount right after ``kill -9`` is not refused when the mount root had just changed;
* ``airfs umount`` after a conflict says writes were lost, and where their bytes are.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from airfs.control.protocol import runtime_dir, socket_path
from airfs.fuse import TRANSPORTS
from airfs.origin.posix import TMP_PREFIX, tmp_tag
from airfs.testing.fixtures import OriginSpec, Volume
from airfs.testing.mountfix import Mounted, fusermount_unmount, mount, teardown
from airfs.util.crashpoint import ENV

pytestmark = pytest.mark.mount


def _posix_only(spec: OriginSpec) -> None:
    if spec.kind != "posix":
        pytest.skip("temporary files are the POSIX origin's")


def _mount_crashing(v: Volume, point: str) -> Mounted | None:
    """Mount ``v`` with its daemon set to kill itself at crash point ``point``; None when it
    got there (and died) before the mount was up."""
    try:
        return mount(
            v.spec.spec,
            v.tmp / "mnt",
            v.tmp / "cache",
            *v.spec.args,
            *v.extra,
            env={**v.spec.env, ENV: point},
        )
    except RuntimeError as exc:
        assert "code -9" in str(exc), exc
        fusermount_unmount(v.tmp / "mnt")
        return None


def _wait_crashed(m: Mounted | None) -> None:
    """Wait until ``m``'s daemon has killed itself at its crash point; clear the dead mount."""
    if m is None:
        return
    deadline = time.monotonic() + 60
    while m.alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not m.alive(), "the daemon never reached its crash point"
    m.kill9()  # gone already: this only clears the dead mount


def _temporaries(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir() if p.name.startswith(TMP_PREFIX))


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_crashes_in_our_own_commits_are_never_a_conflict(
    make_volume, origin_spec: OriginSpec, monkeypatch: pytest.MonkeyPatch, transport: str
) -> None:  # type: ignore[no-untyped-def]
    """Item 2: a new file's commit lands, the daemon dies before its journal knows, while the
    file was rewritten meanwhile; the next daemon's commit of the rewrite (over our own first
    version) dies before its object is in place. The third mount reported ``commit lost a
    conflict: ... exists``, showed the first version and kept the rewrite only in
    ``conflicts/``."""
    monkeypatch.setenv("AIRFS_TEST_FUSE", transport)
    # a commit of 100 kB takes ~2 s; commits start at the close (the rewrite must come
    # while the first version's commit runs)
    v: Volume = make_volume("--emulate-bandwidth", "50K", "--commit-delay", "0")
    v.m.umount()
    teardown(v.m)
    m = _mount_crashing(v, "put-after-publish")
    assert m is not None
    v.m = m
    one, two = os.urandom(100_000), os.urandom(120_000)
    (v.root / "new.bin").write_bytes(one)
    (v.root / "new.bin").write_bytes(two)  # closed while the commit of `one` runs
    _wait_crashed(v.m)
    assert v.origin_bytes("new.bin") == one  # landed; the journal does not know
    m = _mount_crashing(v, "put-before-publish")  # its commit of `two` dies before the rename
    if m is not None:
        v.m = m
    _wait_crashed(m)
    if origin_spec.dir is not None:
        assert _temporaries(origin_spec.dir)  # the cut commit's
    v.m = v.mount()
    v.m.flush()
    assert v.origin_bytes("new.bin") == two
    assert (v.root / "new.bin").read_bytes() == two
    assert v.m.status()["writeback"]["conflicts"] == []
    assert list((v.tmp / "cache" / "conflicts").glob("*")) == []
    if origin_spec.dir is not None:
        assert _temporaries(origin_spec.dir) == []


def test_temporaries_of_cut_commits_are_removed_but_no_one_elses(
    make_volume, origin_spec: OriginSpec
) -> None:  # type: ignore[no-untyped-def]
    """Item 3: every commit cut by a crash left a ``.airfs-tmp-*`` file at the origin, for
    good. The next mount removes this node's own (its tag); another node's (another tag: its
    commit may be running), an untagged one and any other file stay."""
    _posix_only(origin_spec)
    v: Volume = make_volume()
    origin = origin_spec.dir
    assert origin is not None
    (origin / "sub").mkdir()
    v.m.umount()
    teardown(v.m)
    m = _mount_crashing(v, "put-before-publish")
    assert m is not None
    v.m = m
    data = os.urandom(50_000)
    (v.root / "sub" / "f.bin").write_bytes(data)
    _wait_crashed(v.m)
    ours = _temporaries(origin / "sub")
    assert len(ours) == 1 and ours[0].startswith(f"{TMP_PREFIX}{tmp_tag(str(v.tmp / 'cache'))}-")
    others = [f"{TMP_PREFIX}{'0' * 12}-{'a' * 32}", f"{TMP_PREFIX}{'b' * 32}", ".other-tool.tmp"]
    for name in others:
        (origin / "sub" / name).write_bytes(b"not ours")
    v.m = v.mount()
    v.m.flush()
    assert (origin / "sub" / "f.bin").read_bytes() == data
    left = sorted(p.name for p in (origin / "sub").iterdir())
    assert left == sorted([*others, "f.bin"])
    assert "removed 1 temporary file(s) of commits cut short by a crash" in v.m.own_log()


def test_control_sockets_of_killed_daemons_are_removed(tmp_path: Path, make_volume) -> None:  # type: ignore[no-untyped-def]
    """Item 3: the control socket of a daemon killed with ``kill -9`` stayed in the socket
    directory for good. A daemon starting later removes the sockets nobody serves (made over
    a minute ago: a starting daemon's is not yet served)."""
    v: Volume = make_volume()
    (tmp_path / "o").mkdir()
    (tmp_path / "other").mkdir()
    other = mount(str(tmp_path / "o"), tmp_path / "other", tmp_path / "ocache")
    dead = socket_path(str(tmp_path / "other"))
    other.kill9()
    assert os.path.exists(dead)
    past = time.time() - 120
    os.utime(dead, (past, past))  # as if killed two minutes ago
    v.remount()
    assert not os.path.exists(dead)
    assert os.path.exists(socket_path(str(v.root)))
    assert os.path.dirname(dead) == runtime_dir()
    teardown(other, check=False)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_mount_right_after_kill9_when_the_root_just_changed(
    make_volume, monkeypatch: pytest.MonkeyPatch, transport: str
) -> None:  # type: ignore[no-untyped-def]
    """Item 4: with the mount root changed just before ``kill -9``, the next mount was refused
    for 2-3 s (``... is already an airfs mount``): the dead-mount check was a ``stat`` the
    kernel answered from its attribute cache."""
    monkeypatch.setenv("AIRFS_TEST_FUSE", transport)
    v: Volume = make_volume()
    (v.root / "x").write_bytes(b"x")
    os.stat(v.root)  # the root's new attributes, cached by the kernel
    v.m.kill9(clear_mount=False)
    v.m = v.mount()
    v.m.flush()
    assert v.origin_bytes("x") == b"x"


def test_umount_after_a_conflict_says_writes_were_lost(make_volume) -> None:  # type: ignore[no-untyped-def]
    """Item 2: ``airfs umount`` printed "all writes committed" (exit 0) after a flush had
    reported that a write lost a conflict."""
    v: Volume = make_volume("--emulate-bandwidth", "20K")
    v.m.expect_errors(r"commit lost a conflict|lost a conflict")
    (v.root / "shared.txt").write_bytes(b"v0")
    v.m.flush()
    with open(v.root / "shared.txt", "wb") as f:
        f.write(b"mine" * 25_000)  # its commit takes ~5 s
    other = v.tmp / "other"
    other.write_bytes(b"theirs")
    v.spec.view.put("shared.txt", str(other))  # another writer wins meanwhile
    p = subprocess.run(
        [sys.executable, "-m", "airfs.cli", "flush", str(v.root)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 1 and "shared.txt" in p.stderr, p.stderr  # reported once here
    p = v.m.umount()
    assert p.returncode == 4, (p.returncode, p.stdout, p.stderr)
    assert "all writes committed" not in p.stdout + p.stderr
    assert "1 write(s) were lost to a conflict" in p.stderr, p.stderr
    assert "shared.txt -> " in p.stderr and str(v.tmp / "cache" / "conflicts") in p.stderr
