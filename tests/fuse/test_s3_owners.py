"""Owners, modes and mtimes on an S3 origin through real mounts, as real users: kept in the
objects' metadata, so another node (a second mount with its own cache) sees them, and the
kernel's permission checks there follow them."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from airfs.origin.s3 import S3Origin
from airfs.testing.mountfix import Mounted, fuse_available, mount, teardown_all
from airfs.testing.seaweed import SeaweedServer

pytestmark = [
    pytest.mark.mount,
    pytest.mark.s3,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (useradd, mounts)"),
    pytest.mark.skipif(not fuse_available(), reason="needs /dev/fuse and fusermount3"),
]

TTL = 0.5


@dataclass(frozen=True)
class User:
    name: str
    uid: int
    gid: int


@pytest.fixture
def users() -> Iterator[tuple[User, User]]:
    tag = uuid.uuid4().hex[:8]
    names = [f"afs3{tag}a", f"afs3{tag}b"]
    try:
        for n in names:
            subprocess.run(
                ["useradd", "--no-create-home", "--user-group", "--shell", "/bin/sh", n],
                check=True,
                capture_output=True,
            )
        a, b = (User(n, pwd.getpwnam(n).pw_uid, pwd.getpwnam(n).pw_gid) for n in names)
        yield a, b
    finally:
        for n in names:
            subprocess.run(["userdel", n], capture_output=True)


@dataclass
class Nodes:
    a: Mounted
    b: Mounted
    url: str


@pytest.fixture
def nodes(seaweed: SeaweedServer) -> Iterator[Nodes]:
    base = Path(tempfile.mkdtemp(prefix="airfs-s3own-", dir="/tmp"))
    base.chmod(0o755)
    url = seaweed.url(f"own-{uuid.uuid4().hex[:12]}")
    made: list[Mounted] = []
    try:
        for name in ("a", "b"):
            mnt = base / f"mnt-{name}"
            mnt.mkdir()
            mnt.chmod(0o755)
            args = ["--ttl", str(TTL), "--s3-endpoint", seaweed.endpoint]
            made.append(mount(url, mnt, base / f"cache-{name}", *args, env=seaweed.env))
        yield Nodes(made[0], made[1], url)
    finally:
        try:
            teardown_all(made)
        finally:
            shutil.rmtree(base, ignore_errors=True)


def sh(user: User, cmd: str, cwd: Path, *, ok: bool = True) -> subprocess.CompletedProcess[str]:
    argv = ["setpriv", f"--reuid={user.uid}", f"--regid={user.gid}", "--init-groups"]
    p = subprocess.run(
        [*argv, "sh", "-c", cmd], cwd=cwd, capture_output=True, text=True, timeout=60
    )
    if ok:
        assert p.returncode == 0, f"{cmd}: {p.stderr}"
    return p


def eventually(check: object, timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while True:
        try:
            assert callable(check)
            check()
            return
        except (AssertionError, OSError):
            if time.monotonic() > end:
                raise
            time.sleep(0.1)


def test_owner_mode_and_mtime_reach_the_other_node(
    nodes: Nodes, users: tuple[User, User], seaweed: SeaweedServer
) -> None:
    alice, bob = users
    a, b = nodes.a.mountpoint, nodes.b.mountpoint
    # (directories on SeaweedFS keep no mode or owner: a directory marker's metadata is
    # dropped by the server, so they are 0755 root's; files are created by root here and
    # given to alice, then changed by alice herself)
    (a / "shared").mkdir()
    (a / "shared" / "p").write_text("private\n")
    (a / "shared" / "q").write_text("public\n")
    os.chown(a / "shared" / "p", alice.uid, alice.gid)
    os.chmod(a / "shared" / "p", 0o600)
    os.chown(a / "shared" / "q", alice.uid, alice.gid)
    sh(alice, "touch -d @1500000000 shared/q", a)  # mtime set before the commit
    nodes.a.flush()

    def on_b() -> None:
        p, q = os.stat(b / "shared" / "p"), os.stat(b / "shared" / "q")
        assert (p.st_uid, p.st_gid, p.st_mode & 0o7777) == (alice.uid, alice.gid, 0o600)
        assert (q.st_uid, q.st_gid, q.st_mode & 0o7777) == (alice.uid, alice.gid, 0o644)
        assert q.st_mtime_ns == 1_500_000_000 * 1_000_000_000

    eventually(on_b)
    # node b's kernel checks the stored owner and mode
    assert sh(bob, "cat shared/p", b, ok=False).returncode != 0
    assert sh(alice, "cat shared/p", b).stdout == "private\n"
    assert sh(bob, "cat shared/q", b).stdout == "public\n"
    # a change of a committed file made on node b (a metadata copy at the origin) reaches a
    sh(alice, "chmod 640 shared/q && touch -d @1600000000 shared/q", b)
    nodes.b.flush()

    def on_a() -> None:
        q = os.stat(a / "shared" / "q")
        assert (q.st_mode & 0o7777, q.st_mtime_ns) == (0o640, 1_600_000_000 * 1_000_000_000)

    eventually(on_a)
    # and it is in the object's metadata, for any client of the bucket
    view = S3Origin.from_url(nodes.url, env=seaweed.env)
    try:
        e = view.stat("shared/q")
        assert (e.uid, e.gid, e.mode, e.mtime_ns) == (
            alice.uid,
            alice.gid,
            0o640,
            1_600_000_000 * 1_000_000_000,
        )
    finally:
        view.close()
