"""POSIX completeness on a POSIX origin (issue 13), through a real mount as real users:
owners kept per file and the chown rules, sticky directories, hard links, FIFOs and sockets,
times set by tools (``cp -a``, ``rsync -a``) kept through the commit, and the regressions
(mkdir under umask 0, long paths, huge sparse truncates).

The mount runs as root (as on a node) over a POSIX origin directory, all under a fresh
``/tmp/airfs-posix-*`` that other users can traverse. Users are made with ``useradd`` per test
and removed after it; their commands run through ``setpriv`` with their groups.
"""

from __future__ import annotations

import errno
import grp
import os
import pwd
import shutil
import socket
import stat
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from airfs.testing.mountfix import Mounted, fuse_available, mount, teardown

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (useradd, chown, mounts)")


@dataclass(frozen=True)
class User:
    name: str
    uid: int
    gid: int


@dataclass
class Node:
    base: Path
    origin: Path
    m: Mounted

    @property
    def mnt(self) -> Path:
        return self.m.mountpoint


@pytest.fixture
def node() -> Iterator[Node]:
    if not fuse_available():
        pytest.skip("needs /dev/fuse and fusermount3")
    base = Path(tempfile.mkdtemp(prefix="airfs-posix-", dir="/tmp"))
    base.chmod(0o755)
    for d in ("mnt", "origin"):
        (base / d).mkdir()
        (base / d).chmod(0o755)
    m = mount(str(base / "origin"), base / "mnt", base / "cache")
    try:
        yield Node(base, base / "origin", m)
    finally:
        try:
            teardown(m)
        finally:
            shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def users() -> Iterator[tuple[User, User, str]]:
    """Two fresh users with their own groups, and a group only the first is in."""
    tag = uuid.uuid4().hex[:8]
    names = [f"afpx{tag}a", f"afpx{tag}b"]
    group = f"afpx{tag}g"
    try:
        subprocess.run(["groupadd", group], check=True, capture_output=True)
        for n in names:
            subprocess.run(
                ["useradd", "--no-create-home", "--user-group", "--shell", "/bin/sh", n],
                check=True,
                capture_output=True,
            )
        subprocess.run(["usermod", "-aG", group, names[0]], check=True, capture_output=True)
        a, b = (User(n, pwd.getpwnam(n).pw_uid, pwd.getpwnam(n).pw_gid) for n in names)
        yield a, b, group
    finally:
        for n in names:
            subprocess.run(["userdel", n], capture_output=True)
        subprocess.run(["groupdel", group], capture_output=True)


def sh(
    user: User | None, cmd: str, cwd: Path, *, ok: bool = True
) -> subprocess.CompletedProcess[str]:
    """Run ``cmd`` with ``sh -c`` as ``user`` (with its groups; root when None)."""
    argv = ["sh", "-c", cmd]
    if user is not None:
        argv = ["setpriv", f"--reuid={user.uid}", f"--regid={user.gid}", "--init-groups", *argv]
    p = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=60)
    if ok:
        assert p.returncode == 0, f"{cmd}: {p.stderr}"
    return p


def owner(p: Path) -> tuple[int, int]:
    st = os.lstat(p)
    return st.st_uid, st.st_gid


def test_new_files_belong_to_their_creator_and_chown_follows_the_kernel_rules(
    node: Node, users: tuple[User, User, str]
) -> None:
    a, b, group = users
    gid = grp.getgrnam(group).gr_gid
    (node.mnt / "shared").mkdir(mode=0o777)
    os.chmod(node.mnt / "shared", 0o777)
    sh(a, "echo data > f && mkdir d && ln -s f l", node.mnt / "shared")
    for name in ("f", "d", "l"):
        assert owner(node.mnt / "shared" / name) == (a.uid, a.gid), name
    # the owner may give the group to one of its groups, not to another's, nor the file away
    sh(a, f"chgrp {group} f", node.mnt / "shared")
    assert owner(node.mnt / "shared" / "f") == (a.uid, gid)
    p = sh(a, f"chgrp {b.gid} f", node.mnt / "shared", ok=False)
    assert p.returncode != 0 and "not permitted" in p.stderr
    p = sh(a, f"chown {b.uid} f", node.mnt / "shared", ok=False)
    assert p.returncode != 0 and "not permitted" in p.stderr
    p = sh(b, f"chgrp {b.gid} f", node.mnt / "shared", ok=False)
    assert p.returncode != 0
    # root gives it away; setuid is cleared by a chown, as on a local disk
    os.chmod(node.mnt / "shared" / "f", 0o4755)
    os.chown(node.mnt / "shared" / "f", b.uid, b.gid)
    st = os.stat(node.mnt / "shared" / "f")
    assert (st.st_uid, st.st_gid) == (b.uid, b.gid)
    assert stat.S_IMODE(st.st_mode) == 0o755
    node.m.flush()
    # kept at the origin as the real owners
    assert owner(node.origin / "shared" / "f") == (b.uid, b.gid)
    assert owner(node.origin / "shared" / "d") == (a.uid, a.gid)
    assert owner(node.origin / "shared" / "l") == (a.uid, a.gid)
    # a setgid directory hands its group down, and its bit to new directories
    os.mkdir(node.mnt / "sgid", 0o777)
    os.chown(node.mnt / "sgid", 0, gid)
    os.chmod(node.mnt / "sgid", 0o2777)
    sh(b, "touch x && mkdir y", node.mnt / "sgid")
    assert owner(node.mnt / "sgid" / "x") == (b.uid, gid)
    assert os.stat(node.mnt / "sgid" / "y").st_mode & stat.S_ISGID


def test_sticky_directory_protects_other_users_files(
    node: Node, users: tuple[User, User, str]
) -> None:
    a, b, _ = users
    os.mkdir(node.mnt / "tmp")
    os.chmod(node.mnt / "tmp", 0o1777)
    sh(a, "echo a > mine && echo a2 > mine2", node.mnt / "tmp")
    sh(b, "echo b > theirs && mv theirs theirs2", node.mnt / "tmp")
    for cmd in ("mv mine stolen", "rm -f mine", "mv theirs2 mine2"):
        p = sh(b, cmd, node.mnt / "tmp", ok=False)
        assert p.returncode != 0, cmd
    assert (node.mnt / "tmp" / "mine").read_text() == "a\n"
    assert (node.mnt / "tmp" / "mine2").read_text() == "a2\n"
    sh(a, "mv mine mine3", node.mnt / "tmp")
    node.m.flush()
    assert owner(node.origin / "tmp" / "mine3") == (a.uid, a.gid)
    assert owner(node.origin / "tmp" / "theirs2") == (b.uid, b.gid)


def test_hard_links_are_real_links_across_renames_and_unlinks(node: Node) -> None:
    d = node.mnt
    (d / "a").write_bytes(b"one")  # staged, not committed yet: link commits it first
    os.link(d / "a", d / "b")
    assert os.stat(d / "a").st_nlink == 2 and os.stat(d / "b").st_nlink == 2
    assert os.stat(node.origin / "a").st_ino == os.stat(node.origin / "b").st_ino
    os.rename(d / "b", d / "c")
    assert os.stat(d / "a").st_nlink == 2 and (d / "c").read_bytes() == b"one"
    with pytest.raises(FileExistsError):
        os.link(d / "a", d / "c")
    os.unlink(d / "a")
    assert os.stat(d / "c").st_nlink == 1
    assert not (d / "a").exists() and (d / "c").read_bytes() == b"one"
    with pytest.raises(PermissionError):
        os.link(d, d / "dirlink")
    # a committed file linked into another directory
    (d / "sub").mkdir()
    os.link(d / "c", d / "sub" / "c2")
    node.m.flush()
    assert os.stat(node.origin / "sub" / "c2").st_ino == os.stat(node.origin / "c").st_ino
    assert os.stat(d / "sub" / "c2").st_nlink == 2


def test_fifo_and_socket_through_the_mount(node: Node) -> None:
    fifo = node.mnt / "pipe"
    os.mkfifo(fifo, 0o640)
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert stat.S_ISFIFO(os.lstat(node.origin / "pipe").st_mode)
    assert stat.S_IMODE(os.stat(fifo).st_mode) == 0o640
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    with open(fifo, "wb") as w:
        w.write(b"through the pipe")
    reader.join(10)
    assert got == [b"through the pipe"]
    assert "pipe" in os.listdir(node.mnt)
    sock = str(node.mnt / "sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as srv:
        srv.bind(sock)
        srv.listen(1)
        assert stat.S_ISSOCK(os.stat(sock).st_mode)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as c:
            c.connect(sock)
            conn, _ = srv.accept()
            with conn:
                c.sendall(b"hello")
                assert conn.recv(5) == b"hello"
    os.unlink(sock)
    os.unlink(fifo)
    assert not (node.origin / "pipe").exists()
    # device nodes need --allow-devices
    with pytest.raises(PermissionError):
        os.mknod(node.mnt / "null", stat.S_IFCHR | 0o600, os.makedev(1, 3))


def _tree(root: Path, a: User, b: User) -> None:
    """A tree with several owners, modes, old mtimes, a symlink and a hard link."""
    (root / "sub").mkdir(parents=True)
    (root / "f1").write_bytes(b"x" * 5000)
    (root / "sub" / "f2").write_bytes(b"y" * 10)
    (root / "exe").write_bytes(b"#!/bin/sh\n")
    os.link(root / "f1", root / "f1-link")
    os.symlink("sub/f2", root / "ln")
    os.chown(root / "f1", a.uid, a.gid)
    os.chown(root / "sub" / "f2", b.uid, b.gid)
    os.chown(root / "ln", b.uid, a.gid, follow_symlinks=False)
    os.chmod(root / "f1", 0o640)
    os.chmod(root / "exe", 0o755)
    old = 1_600_000_000_123_456_789
    for i, p in enumerate(["f1", "sub/f2", "exe", "sub", "ln"]):
        t = old + i * 1_000_000_000
        os.utime(root / p, ns=(t, t), follow_symlinks=False)


def _describe(root: Path) -> dict[str, tuple[int, ...]]:
    out: dict[str, tuple[int, ...]] = {}
    inodes: dict[int, str] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in sorted(dirnames + filenames):
            p = Path(dirpath) / name
            st = os.lstat(p)
            rel = str(p.relative_to(root))
            linked = inodes.setdefault(st.st_ino, rel) if stat.S_ISREG(st.st_mode) else rel
            # mtimes to the microsecond: what utimes-based tools keep everywhere
            out[rel] = (st.st_mode, st.st_uid, st.st_gid, st.st_size, st.st_mtime_ns // 1000,
                        st.st_nlink if stat.S_ISREG(st.st_mode) else 0, hash(linked))  # fmt: skip
    return out


def test_cp_a_and_rsync_a_round_trips_keep_owners_modes_times_and_links(
    node: Node, users: tuple[User, User, str]
) -> None:
    if shutil.which("rsync") is None:
        pytest.skip("rsync is not installed (scripts/setup.sh installs it)")
    a, b, _ = users
    src = node.base / "src"
    _tree(src, a, b)
    want = _describe(src)
    subprocess.run(["cp", "-a", str(src), str(node.mnt / "cp")], check=True)
    subprocess.run(["rsync", "-aH", f"{src}/", str(node.mnt / "rs")], check=True)
    node.m.flush()
    # kept through the commit, at the origin itself
    assert _describe(node.origin / "cp") == want
    assert _describe(node.origin / "rs") == want
    # and as the mount shows them (once the attribute TTL has passed: a directory's mtime
    # set by cp while its files' commits ran can show the commit's time for up to the TTL)
    time.sleep(1.2)
    assert _describe(node.mnt / "cp") == want
    assert _describe(node.mnt / "rs") == want
    # a second rsync finds nothing to copy
    p = subprocess.run(
        ["rsync", "-aH", "--stats", f"{src}/", str(node.mnt / "rs")],
        check=True,
        capture_output=True,
        text=True,
    )
    assert "Number of regular files transferred: 0" in p.stdout, p.stdout
    # and back out of the mount
    subprocess.run(["cp", "-a", str(node.mnt / "rs"), str(node.base / "back")], check=True)
    assert _describe(node.base / "back") == want


def test_times(node: Node) -> None:
    d = node.mnt
    os.mkdir(d / "dir")
    before = os.stat(d / "dir")
    time.sleep(0.05)
    (d / "dir" / "new").write_bytes(b"1")
    after = os.stat(d / "dir")
    assert after.st_mtime_ns > before.st_mtime_ns and after.st_ctime_ns > before.st_ctime_ns
    node.m.flush()
    assert os.stat(d / "dir").st_mtime_ns == after.st_mtime_ns  # the commit is no change
    # mtime set while open, before close (cp -p), survives the commit
    with open(d / "dir" / "p", "wb") as f:
        f.write(b"data")
        f.flush()
        os.utime(f.fileno(), ns=(1_500_000_000_000_000_000, 1_500_000_000_000_000_000))
    node.m.flush()
    assert os.stat(node.origin / "dir" / "p").st_mtime_ns == 1_500_000_000_000_000_000
    assert os.stat(d / "dir" / "p").st_atime_ns == 1_500_000_000_000_000_000
    # chmod moves ctime, not mtime
    st0 = os.stat(d / "dir" / "p")
    time.sleep(0.05)
    os.chmod(d / "dir" / "p", 0o600)
    st1 = os.stat(d / "dir" / "p")
    assert st1.st_ctime_ns > st0.st_ctime_ns and st1.st_mtime_ns == st0.st_mtime_ns
    # utimensat(AT_SYMLINK_NOFOLLOW) sets the link's own times
    os.symlink("p", d / "dir" / "sl")
    os.utime(d / "dir" / "sl", ns=(1_400_000_000_000_000_000,) * 2, follow_symlinks=False)
    assert os.lstat(d / "dir" / "sl").st_mtime_ns == 1_400_000_000_000_000_000
    assert os.lstat(node.origin / "dir" / "sl").st_mtime_ns == 1_400_000_000_000_000_000
    assert os.stat(d / "dir" / "p").st_mtime_ns == 1_500_000_000_000_000_000


def test_regressions_umask_long_paths_sparse_truncate(node: Node) -> None:
    d = node.mnt
    # mkdir 0777 under umask 0 is 0777 (the daemon's umask is not applied again)
    old = os.umask(0)
    try:
        os.mkdir(d / "open", 0o777)
        fd = os.open(d / "open" / "f", os.O_CREAT | os.O_WRONLY, 0o666)
        os.close(fd)
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(d / "open").st_mode) == 0o777
    assert stat.S_IMODE(os.stat(d / "open" / "f").st_mode) == 0o666
    # a path under PATH_MAX from the working directory, longer than PATH_MAX at the origin
    deep = d / "open"
    os.chdir(deep)
    try:
        rel = "/".join(["n" * 200] * 19)  # 3,819 bytes: the origin path is longer
        os.makedirs(rel)
        Path(rel, "leaf").write_bytes(b"deep")
        assert Path(rel, "leaf").read_bytes() == b"deep"
    finally:
        os.chdir("/")
    node.m.flush()
    # a huge sparse truncate is immediate (staging counts allocated bytes); beyond what the
    # staging filesystem can hold it is EFBIG, as on a local disk
    with open(d / "sparse", "wb") as f:
        f.truncate(150 << 30)
        assert os.stat(d / "sparse").st_size == 150 << 30
        with pytest.raises(OSError) as exc:
            f.truncate(1 << 62)
        assert exc.value.errno == errno.EFBIG
        os.unlink(d / "sparse")
