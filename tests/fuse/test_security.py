"""Closing the doors, tried as unprivileged local users would on a node where root mounted
airfs with default options (issue 10).

Real users are created with ``useradd`` for each test and removed after it. Their code runs in
a Python process started as root that imports what it needs and then drops to the user's uid
and gid for good (``setgroups``/``setgid``/``setuid``): the interpreter lives under ``/root``,
which they could not exec. Every mount here lives under a fresh ``/tmp/airfs-sec-*`` directory
that other users can traverse (pytest's own temporary directories are closed to them).
"""

from __future__ import annotations

import errno
import json
import os
import pwd
import shutil
import stat
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from airfs.control import client
from airfs.origin.base import Origin
from airfs.origin.posix import PosixOrigin
from airfs.testing.mountfix import Mounted, fuse_available, is_mounted, mount, teardown

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (useradd, mounts)")


@dataclass(frozen=True)
class User:
    name: str
    uid: int
    gid: int


@pytest.fixture
def users() -> Iterator[list[User]]:
    """Two fresh users with their own groups; removed afterwards."""
    made: list[str] = []
    try:
        for _ in range(2):
            name = f"afsec{uuid.uuid4().hex[:10]}"
            subprocess.run(
                ["useradd", "--no-create-home", "--user-group", "--shell", "/bin/false", name],
                check=True,
                capture_output=True,
            )
            made.append(name)
        yield [User(n, pwd.getpwnam(n).pw_uid, pwd.getpwnam(n).pw_gid) for n in made]
    finally:
        for n in made:
            subprocess.run(["userdel", n], capture_output=True)


PRELUDE = """
import errno, json, os, sys, time
import encodings.unicode_escape, socket, struct  # loaded now: /root is closed to the user
from airfs.control import client
from airfs.control.protocol import socket_path
{imports}
os.setgroups([])
os.setgid({gid})
os.setuid({uid})
os.umask({umask})
assert (os.getuid(), os.geteuid(), os.getgid()) == ({uid}, {uid}, {gid})

def call(op, **kw):
    try:
        return {{"ok": True, "result": client.request(MP, op, **kw)}}
    except client.ControlError as exc:
        return {{"ok": False, "errno": exc.errno, "error": str(exc)}}
"""


def run_as(
    user: User,
    mp: Path,
    code: str,
    *,
    imports: str = "",
    umask: int = 0o022,
    timeout: float = 300,
    wait: bool = True,
) -> Any:
    """Run ``code`` as ``user`` (``MP`` is the mountpoint); return what it printed as JSON
    (or the Popen when not ``wait``)."""
    script = PRELUDE.format(imports=imports, uid=user.uid, gid=user.gid, umask=umask)
    script += f"MP = {str(mp)!r}\n" + textwrap.dedent(code)
    cmd = [sys.executable, "-c", script]
    if not wait:
        return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


@dataclass
class Node:
    """A root mount reachable by every user: ``base`` is 0755 and holds mnt, cache and (for
    posix) the origin directory."""

    kind: str
    base: Path
    m: Mounted
    view: Origin
    origin_dir: Path | None
    spec: str
    env: dict[str, str] = field(default_factory=dict)

    @property
    def mnt(self) -> Path:
        return self.m.mountpoint

    def status(self) -> dict[str, Any]:
        return client.status(str(self.mnt))


@pytest.fixture(params=["posix", pytest.param("s3", marks=pytest.mark.s3)])
def node(request: pytest.FixtureRequest) -> Iterator[Node]:
    if not fuse_available():
        pytest.skip("needs /dev/fuse and fusermount3")
    base = Path(tempfile.mkdtemp(prefix="airfs-sec-", dir="/tmp"))
    base.chmod(0o755)
    (base / "mnt").mkdir()
    view: Origin
    origin_dir = None
    env: dict[str, str] = {}
    args: list[str] = []
    if request.param == "posix":
        origin_dir = base / "origin"
        origin_dir.mkdir()
        spec = str(origin_dir)
        view = PosixOrigin(spec)
    else:
        from airfs.origin.s3 import S3Origin

        srv = request.getfixturevalue("seaweed")
        spec = srv.url(f"sec-{uuid.uuid4().hex[:12]}")
        env = dict(srv.env)
        args = ["--s3-endpoint", srv.endpoint]
        view = S3Origin.from_url(spec, env=srv.env)
    m = None
    try:
        m = mount(spec, base / "mnt", base / "cache", *args, env=env)
        yield Node(request.param, base, m, view, origin_dir, spec, env)
    finally:
        if m is not None:
            teardown(m)
        view.close()
        assert not is_mounted(base / "mnt")
        shutil.rmtree(base, ignore_errors=True)


def make_tree(n: Node) -> None:
    """Written at the origin (so nothing is cached yet): pub/ (0755) with a.bin (0644),
    hidden.bin (0600) and sub/ (0700; S3: 0755) holding x.bin; priv/ (0700; S3: 0755) with
    s.bin (0600 on S3, 0644 on posix); on posix also shared/ (1777)."""
    files = {
        "pub/a.bin": (b"a" * 1000, 0o644),
        "pub/hidden.bin": (b"h" * 2000, 0o600),
        "pub/sub/x.bin": (b"x" * 3000, 0o644),
        "priv/s.bin": (b"s" * 4000, 0o644 if n.kind == "posix" else 0o600),
    }
    if n.origin_dir is not None:
        o = n.origin_dir
        for d, mode in (("pub", 0o755), ("pub/sub", 0o700), ("priv", 0o700), ("shared", 0o1777)):
            (o / d).mkdir()
            (o / d).chmod(mode)
        for rel, (data, mode) in files.items():
            (o / rel).write_bytes(data)
            (o / rel).chmod(mode)
    else:
        src = n.base / "src"
        for rel, (data, mode) in files.items():
            src.write_bytes(data)
            n.view.put(rel, str(src), None, mode=mode)
        src.unlink()
    assert (n.mnt / "pub" / "hidden.bin").stat().st_mode & 0o777 == 0o600


def test_unprivileged_user_cannot_unmount_and_sees_only_counters(
    node: Node, users: list[User]
) -> None:
    make_tree(node)
    alice = users[0]
    if node.origin_dir is not None:  # a commit that fails, with a telling name in its error
        node.m.expect_errors(r"salary-review-bob\.txt", exit_codes={0, 3})
        (node.mnt / "gone").mkdir()
        (node.origin_dir / "gone").rmdir()
        (node.origin_dir / "gone").write_text("a file now: the commit below cannot land")
        (node.mnt / "gone" / "salary-review-bob.txt").write_text("x")
        deadline = time.monotonic() + 30
        while not node.status()["writeback"]["failing"]:
            assert time.monotonic() < deadline, node.status()["writeback"]
            time.sleep(0.1)
    out = run_as(
        alice,
        node.mnt,
        """
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            code = cli.main(["umount", MP])
        print(json.dumps({
            "unmount": call("unmount"),
            "status": call("status"),
            "cli": [code, err.getvalue()],
        }))
        """,
        imports=(
            "import contextlib, io, shutil, gettext, argparse\nfrom airfs.cli import app as cli\n"
        ),
    )
    assert out["unmount"]["ok"] is False, out
    assert out["unmount"]["errno"] == errno.EPERM, out
    assert "only root or the mount's owner" in out["unmount"]["error"]
    code, err = out["cli"]
    assert code == 1
    assert err.strip().splitlines()[-1] == (
        "airfs: only root or the mount's owner (uid 0) may unmount"
    ), err
    assert is_mounted(node.mnt) and node.m.alive()
    st = out["status"]["result"]
    assert st["redacted"] is True
    assert st["fs"]["inodes"] >= 1 and st["fs"]["ops"]["lookup"] >= 1  # counters are there
    assert st["writeback"]["last_error"] is None and st["writeback"]["failing"] == []
    assert "salary" not in json.dumps(out["status"])
    mine = node.status()
    assert "redacted" not in mine
    if node.origin_dir is not None:
        assert st["writeback"]["failing_count"] == 1 and st["writeback"]["errors"] >= 1
        assert "salary-review-bob.txt" in mine["writeback"]["last_error"]
        assert mine["writeback"]["failing"][0]["path"] == "gone/salary-review-bob.txt"
    assert mine["control"]["denied_by_op"] == {"unmount": 2}
    log = node.m.log.read_text()
    assert f"denied unmount to uid {alice.uid}" in log


def test_warm_prefetch_flush_only_what_the_user_may_read_or_write(
    node: Node, users: list[User]
) -> None:
    make_tree(node)
    if node.kind == "posix":
        os.symlink("/root", node.mnt / "pub" / "esc")
        os.symlink("../priv", node.mnt / "pub" / "in")
    alice = users[0]
    out = run_as(
        alice,
        node.mnt,
        """
        r = {}
        r["hidden"] = call("warm", paths=["pub/hidden.bin"])
        r["priv"] = call("warm", paths=["priv/s.bin"])
        r["dotdot"] = call("warm", paths=["../../../../../root"])
        r["abs"] = call("warm", paths=["/etc/shadow"])
        r["esc"] = call("warm", paths=["pub/esc"])
        r["esc_below"] = call("warm", paths=["pub/esc/.bashrc"])
        r["in_below"] = call("warm", paths=["pub/in/s.bin"])
        r["pre_hidden"] = call("prefetch", paths=["pub/a.bin", "pub/hidden.bin"])
        r["flush_pub"] = call("flush", path="pub")
        r["pub"] = call("warm", paths=["pub"])
        r["pre_a"] = call("prefetch", paths=["pub/a.bin"])
        try:
            client.warm(MP, [os.path.join(MP, "pub", "esc")])
            r["client_esc"] = "sent"
        except client.ControlError as exc:
            r["client_esc"] = str(exc)
        if os.path.isdir(os.path.join(MP, "shared")):
            r["flush_shared"] = call("flush", path="shared")
        print(json.dumps(r))
        """,
    )
    denied = {
        "hidden": errno.EACCES,
        "priv": errno.EACCES,
        "dotdot": errno.EPERM,
        "abs": errno.EPERM,
        "pre_hidden": errno.EACCES,
        "flush_pub": errno.EACCES,
    }
    if node.kind == "posix":
        denied.update(esc=errno.EACCES, esc_below=errno.EACCES, in_below=errno.EACCES)
        assert "not under the airfs mount" in out["client_esc"]
        assert out["flush_shared"]["ok"], out["flush_shared"]
    for key, code in denied.items():
        assert out[key]["ok"] is False, (key, out[key])
        assert out[key]["errno"] == code, (key, out[key])
    # a directory is warmed only where the user may read: a.bin, not hidden.bin nor sub/ (and
    # nothing else was fetched from the origin on the user's behalf)
    assert out["pub"]["ok"], out["pub"]
    warmed = out["pub"]["result"]
    if node.kind == "posix":  # skipped: hidden.bin, sub/ and the two links
        assert (warmed["files"], warmed["bytes"], warmed["skipped"]) == (1, 1000, 4)
        assert warmed["fetched"] == 1000
    else:  # S3 directories are 0755 (sub/ is listable), hidden.bin is still 0600
        assert (warmed["files"], warmed["bytes"], warmed["skipped"]) == (2, 4000, 1)
        assert warmed["fetched"] == 4000
    assert out["pre_a"] == {"ok": True, "result": {"queued": 1}}
    st = node.status()
    assert st["control"]["denied"] == len(denied)
    assert st["cache"]["origin_bytes_read"] == warmed["fetched"]
    # root may warm everything
    res = client.warm(str(node.mnt), [str(node.mnt / "priv")])
    assert res["fetched"] == 4000


def test_cache_dir_is_closed_to_other_users(node: Node, users: list[User]) -> None:
    make_tree(node)
    (node.mnt / "pub" / "w.bin").write_bytes(b"w" * 10000)
    client.warm(str(node.mnt), [str(node.mnt)])
    client.flush(str(node.mnt))
    cache = node.m.cache_dir
    seen = 0
    for dirpath, _dirs, filenames in os.walk(cache):
        assert stat.S_IMODE(os.stat(dirpath).st_mode) == 0o700, dirpath
        for f in filenames:
            mode = stat.S_IMODE(os.lstat(os.path.join(dirpath, f)).st_mode)
            assert mode == 0o600, (os.path.join(dirpath, f), oct(mode))
            seen += 1
    assert seen >= 4  # log, lock, index, journal at least
    out = run_as(
        users[0],
        node.mnt,
        f"""
        r = {{}}
        for what, fn in [
            ("list", lambda: os.listdir({str(cache)!r})),
            ("log", lambda: open({str(cache / "airfs.log")!r}).read()),
        ]:
            try:
                fn()
                r[what] = "read"
            except PermissionError:
                r[what] = "denied"
        print(json.dumps(r))
        """,
    )
    assert out == {"list": "denied", "log": "denied"}


def test_connections_are_bounded_per_user(node: Node, users: list[User]) -> None:
    out = run_as(
        users[0],
        node.mnt,
        """
        held, refused = [], 0
        for _ in range(40):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(socket_path(MP, 0))
            held.append(s)
        time.sleep(0.5)
        for s in held:
            s.settimeout(0.2)
            try:
                line = s.recv(4096)
            except socket.timeout:
                continue
            if b'"errno":11' in line:
                refused += 1
        mid = call("status")
        for s in held:
            s.close()
        time.sleep(0.5)
        print(json.dumps({"refused": refused, "mid": mid, "after": call("status")}))
        """,
    )
    assert out["refused"] == 40 - 16
    assert out["mid"]["ok"] is False and out["mid"]["errno"] == errno.EAGAIN
    assert out["after"]["ok"] is True
    st = node.status()  # root is not held back by the user's connections
    assert st["control"]["refused_connections"] == 40 - 16 + 1


def _poller(user: User, mp: Path, names: list[str], origin_dir: Path | None) -> Any:
    """As ``user``: open each name through the mount (and in the origin directory, with any
    temporary file of a commit) over and over until ``STOP`` exists; report what happened."""
    code = f"""
    names = {names!r}
    origin = {str(origin_dir) if origin_dir else None!r}
    stop = os.path.join(MP, "..", "STOP")
    counts = {{"opened": [], "denied": 0, "missing": 0, "rounds": 0}}
    def attempt(path):
        try:
            with open(path, "rb") as f:
                f.read(1)
            counts["opened"].append(path)
        except PermissionError:
            counts["denied"] += 1
        except FileNotFoundError:
            counts["missing"] += 1
    while not os.path.exists(stop):
        counts["rounds"] += 1
        for name in names:
            attempt(os.path.join(MP, name))
            if origin is not None:
                attempt(os.path.join(origin, name))
        if origin is not None:
            d = os.path.join(origin, os.path.dirname(names[0]))
            try:
                tmps = [e for e in os.listdir(d) if e.startswith(".airfs-tmp-")]
            except OSError:
                tmps = []
            for t in tmps:
                attempt(os.path.join(d, t))
    print(json.dumps(counts))
    """
    return run_as(user, mp, code, wait=False)


def test_private_files_stay_private_at_every_moment(node: Node, users: list[User]) -> None:
    """A 0600 file written through the mount is never readable by another user: not through
    the mount, not at the origin, not while it is committed; its mode at the origin stays
    0600 (S3: in the object's metadata, also seen by a fresh origin client)."""
    make_tree(node)
    alice, bob = users
    n_files = 60
    # posix: alice's own files, in a directory where anyone may create; S3 directories are
    # root's 0755: root writes the private files
    d = "shared" if node.kind == "posix" else "pub"
    names = [f"{d}/p{i:03d}" for i in range(n_files)]
    (node.base / "STOP").unlink(missing_ok=True)
    poll = _poller(bob, node.mnt, names, node.origin_dir)
    try:
        time.sleep(0.5)  # let it start polling
        writer = """
        for name in NAMES:
            fd = os.open(os.path.join(MP, name), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
            os.write(fd, b"secret " * 2000)
            os.close(fd)
        print(json.dumps(call("flush", path=DIR)))
        """
        if node.kind == "posix":
            out = run_as(
                alice, node.mnt, f"NAMES = {names!r}\nDIR = {d!r}\n" + textwrap.dedent(writer)
            )
            assert out["ok"], out
        else:
            for name in names:
                fd = os.open(node.mnt / name, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
                os.write(fd, b"secret " * 2000)
                os.close(fd)
            client.flush(str(node.mnt), str(node.mnt / d))
        time.sleep(0.5)
    finally:
        (node.base / "STOP").touch()
        stdout, stderr = poll.communicate(timeout=120)
    assert poll.returncode == 0, stderr[-3000:]
    counts = json.loads(stdout.strip().splitlines()[-1])
    assert counts["opened"] == []
    assert counts["rounds"] > 1 and counts["denied"] > 0  # it did race with the files
    for name in names:
        assert node.view.stat(name).mode == 0o600, name
        assert stat.S_IMODE((node.mnt / name).stat().st_mode) == 0o600
        if node.origin_dir is not None:
            assert stat.S_IMODE((node.origin_dir / name).stat().st_mode) == 0o600
    if node.kind == "s3":  # another node's first listing (no modes known yet)
        from airfs.origin.s3 import S3Origin

        fresh = S3Origin.from_url(node.spec, env=node.env)
        try:
            listed = {e.name: e.mode for e in fresh.list(d)}
        finally:
            fresh.close()
        assert all(listed[name.rpartition("/")[2]] == 0o600 for name in names)
        assert listed["a.bin"] == 0o644


def test_non_root_training_job_gets_prefetch_and_the_commit_barrier(
    node: Node, users: list[User]
) -> None:
    """A job of an unprivileged user on root's mount finds the mount's socket: the dataset's
    prefetch requests and the checkpoint's commit barrier (``flush``) reach the daemon."""
    pytest.importorskip("torch")
    n_files = 24
    if node.origin_dir is not None:
        (node.origin_dir / "data").mkdir()
        for i in range(n_files):
            (node.origin_dir / "data" / f"f{i:03d}.bin").write_bytes(bytes([i]) * 5000)
        (node.origin_dir / "ckpt").mkdir()
        (node.origin_dir / "ckpt").chmod(0o777)
    else:
        pytest.skip("S3 directories are root's 0755: a non-root job cannot write checkpoints")
    out = run_as(
        users[0],
        node.mnt,
        """
        ds = VolumeDataset(os.path.join(MP, "data"), prefetch_files=8, shuffle=False)
        got = [open(p, "rb").read(1) for p in ds]
        path = os.path.join(MP, "ckpt", "step1")
        dcp.save({"w": torch.arange(1000)}, storage_writer=VolumeWriter(path), no_dist=True)
        back = {"w": torch.zeros(1000, dtype=torch.int64)}
        dcp.load(back, storage_reader=VolumeReader(path), no_dist=True)
        print(json.dumps({
            "files": len(got),
            "prefetch_requests": ds.stats().prefetch_requests,
            "complete": is_complete(path),
            "loaded": bool((back["w"] == torch.arange(1000)).all()),
        }))
        """,
        imports=(
            "import torch, torch.distributed.checkpoint as dcp\n"
            "from airfs.data import VolumeDataset\n"
            "from airfs.data.checkpoint import VolumeReader, VolumeWriter, is_complete\n"
        ),
        umask=0,  # the mount reports root as every file's owner: dirs the job makes must be 0777
    )
    assert out["files"] == n_files and out["complete"] and out["loaded"]
    assert out["prefetch_requests"] >= 1
    st = node.status()
    by_op = st["control"]["requests_by_op"]
    assert by_op.get("prefetch", 0) >= out["prefetch_requests"]
    assert by_op.get("flush", 0) >= 2  # the barrier: each rank's shards, then .metadata
    assert st["control"]["denied"] == 0
    assert st["prefetch"]["submitted"] >= n_files // 2
    # the barrier held: everything of the checkpoint is at the origin
    names = set(os.listdir(node.origin_dir / "ckpt" / "step1"))
    assert ".metadata" in names and any(nm.endswith(".distcp") for nm in names)


def test_s3_objects_of_other_tools_get_the_configured_mode(node: Node, users: list[User]) -> None:
    if node.kind != "s3":
        pytest.skip("an S3 option")
    import obstore

    from airfs.origin.s3 import S3Origin

    assert isinstance(node.view, S3Origin)
    obstore.put(node.view.client.store, "foreign.bin", b"no airfs-mode metadata")
    teardown(node.m)
    args = ["--s3-endpoint", node.env["AWS_ENDPOINT_URL"], "--s3-default-mode", "600"]
    m = mount(node.spec, node.mnt, node.base / "cache", *args, env=node.env)
    try:
        assert stat.S_IMODE((node.mnt / "foreign.bin").stat().st_mode) == 0o600
        out = run_as(
            users[0],
            node.mnt,
            """
            try:
                open(os.path.join(MP, "foreign.bin"), "rb").read()
                print(json.dumps("read"))
            except PermissionError:
                print(json.dumps("denied"))
            """,
        )
        assert out == "denied"
    finally:
        teardown(m)


def test_mount_refuses_a_cache_dir_other_users_can_reach(tmp_path: Path) -> None:
    from airfs.testing.mountfix import airfs_cmd

    if not fuse_available():
        pytest.skip("needs /dev/fuse and fusermount3")
    (tmp_path / "o").mkdir()
    (tmp_path / "m").mkdir()
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "airfs.log").write_text("an old log naming files\n")
    cache.chmod(0o755)
    cmd = [*airfs_cmd(), "mount", "--cache-dir", str(cache), "--origin", str(tmp_path / "o")]
    for extra in ([], ["--foreground"]):
        p = subprocess.run([*cmd, *extra, str(tmp_path / "m")], capture_output=True, text=True)
        assert p.returncode == 1, p
        lines = p.stderr.strip().splitlines()
        assert lines[-1] == (
            f"airfs: cache dir {cache} is open to other users (mode 755): they could read the "
            f"cached files and their paths; run chmod 700 {cache} first, or use a new cache dir"
        ), p.stderr
        assert not is_mounted(tmp_path / "m")
    cache.chmod(0o700)
    m = mount(str(tmp_path / "o"), tmp_path / "m", cache)
    try:
        assert stat.S_IMODE((cache / "airfs.log").stat().st_mode) == 0o600  # an old log too
        assert client.status(str(tmp_path / "m"))["pid"] == m.pid
    finally:
        teardown(m)
