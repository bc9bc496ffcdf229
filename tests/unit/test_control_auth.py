"""The control socket's rules without a kernel mount: permission bits, path resolution inside
the tree, status redaction, connection limits, trusted socket and cache directories, and the
server's dispatch (run on trio with a fake daemon and callers of every kind)."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import socket
import stat
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import trio

from airfs.control import auth
from airfs.control.auth import Denied, Peer, R, W, X, check_path, may, normalize
from airfs.control.protocol import SocketDirError, check_dir, prepare_dir, runtime_dir
from airfs.control.server import ControlServer
from airfs.core.attrs import Owner
from airfs.daemon.process import MountError, prepare_cache_dir
from airfs.origin.base import Kind

ROOT = Peer(0, 0, 1)
ALICE = Peer(1001, 1001, 2)
BOB = Peer(1002, 1002, 3, frozenset({50}))
OWNER = Owner(0, 50)


# -- permission bits -------------------------------------------------------------------------


def test_root_reads_and_writes_anything_and_runs_only_executables() -> None:
    assert may(ROOT, 0o000, 5, 5, R | W, False)
    assert may(ROOT, 0o000, 5, 5, R | X, True)  # directories are always searchable
    assert not may(ROOT, 0o644, 5, 5, X, False)
    assert may(ROOT, 0o100, 5, 5, X, False)


def test_owner_group_other_classes_first_match_wins() -> None:
    assert may(ALICE, 0o600, 1001, 9, R | W, False)
    assert not may(ALICE, 0o077, 1001, 9, R, False)  # owner class matches: no fallback
    assert may(BOB, 0o040, 0, 50, R, False)  # supplementary group 50
    assert not may(BOB, 0o407, 0, 50, R, False)  # group class matches first: ---
    assert may(ALICE, 0o004, 0, 50, R, False)  # other
    assert not may(ALICE, 0o640, 0, 50, R, False)
    assert not may(ALICE, 0o755, 0, 50, W, True)
    assert may(ALICE, 0o777, 0, 50, R | W | X, True)


# -- path normalisation ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "bad", ["../x", "a/../../etc/shadow", "a/..", "/etc/shadow", "a\0b", 7, None, ["a"]]
)
def test_escaping_or_malformed_paths_are_refused(bad: Any) -> None:
    with pytest.raises(Denied) as ei:
        normalize(bad)
    assert ei.value.errno == errno.EPERM
    assert ei.value.strerror


def test_dot_and_empty_components_are_dropped() -> None:
    assert normalize("") == ""
    assert normalize(".") == ""
    assert normalize("a//b/./c/") == "a/b/c"
    assert normalize("..a/b..") == "..a/b.."  # names that merely start with dots are fine


# -- the walk inside the tree ----------------------------------------------------------------

TREE: dict[str, tuple[Kind, int]] = {
    "": (Kind.DIR, 0o755),
    "pub": (Kind.DIR, 0o755),
    "pub/a": (Kind.FILE, 0o644),
    "pub/hidden": (Kind.FILE, 0o600),
    "pub/link": (Kind.SYMLINK, 0o777),
    "priv": (Kind.DIR, 0o700),
    "priv/s": (Kind.FILE, 0o644),
    "grp": (Kind.DIR, 0o750),
    "grp/g": (Kind.FILE, 0o640),
    "shared": (Kind.DIR, 0o1777),
}


async def lookup(path: str) -> tuple[Kind, int] | None:
    return TREE.get(path)


def check(caller: Peer, path: str, want: int) -> tuple[Kind, int]:
    return trio.run(check_path, caller, path, want, OWNER, lookup)


def test_readable_paths_pass_and_report_kind_and_mode() -> None:
    assert check(ALICE, "pub/a", R) == (Kind.FILE, 0o644)
    assert check(ALICE, "pub", R) == (Kind.DIR, 0o755)
    assert check(ALICE, "", R) == (Kind.DIR, 0o755)
    assert check(BOB, "grp/g", R) == (Kind.FILE, 0o640)  # via the mount's group
    assert check(ALICE, "shared", W) == (Kind.DIR, 0o1777)


@pytest.mark.parametrize(
    "caller,path,want",
    [
        (ALICE, "pub/hidden", R),  # file not readable
        (ALICE, "priv/s", R),  # readable file, unsearchable directory on the way
        (ALICE, "priv", R),
        (ALICE, "grp/g", R),  # not in the group
        (ALICE, "pub", W),  # flush needs write
        (ALICE, "pub/a", W),
        (ALICE, "pub/link", R),  # a link as the target
        (ALICE, "pub/link/x", R),  # a link on the way (could point anywhere)
        (ROOT, "pub/link/x", R),  # not even root follows links here
    ],
)
def test_denied_paths(caller: Peer, path: str, want: int) -> None:
    with pytest.raises(Denied) as ei:
        check(caller, path, want)
    assert ei.value.errno == errno.EACCES


def test_missing_paths_and_files_used_as_directories() -> None:
    with pytest.raises(FileNotFoundError):
        check(ALICE, "pub/missing", R)
    with pytest.raises(FileNotFoundError) as ei:
        check(ALICE, "pub/a/x", R)
    assert ei.value.errno == errno.ENOTDIR


# -- status, limits, peer credentials --------------------------------------------------------


def test_redact_keeps_counters_and_drops_every_name() -> None:
    full = {
        "mountpoint": "/Volumes",
        "origin": "s3://b/p",
        "cache_dir": "/var/cache/airfs/x",
        "pid": 7,
        "fs": {"ops": {"lookup": 3}, "inodes": 4},
        "cache": {"kind": "cached", "hit_bytes": 10},
        "writeback": {
            "errors": 2,
            "last_error": "commit of priv/secret-plan.txt failed: EIO",
            "failing": [{"path": "priv/secret-plan.txt", "error": "x", "attempts": 3}],
            "conflicts": [{"path": "priv/a", "kept": "/c/priv__a"}],
        },
    }
    out = auth.redact(full)
    assert "secret" not in repr(out) and "priv" not in repr(out)
    assert out["redacted"] is True
    assert out["writeback"] == {
        "errors": 2,
        "last_error": None,
        "failing": [],
        "failing_count": 1,
        "conflicts": [],
        "conflicts_count": 1,
    }
    assert out["fs"] == full["fs"] and out["pid"] == 7
    assert out["cache"] == {"kind": "cached", "hit_bytes": 10}
    assert (out["mountpoint"], out["origin"]) == ("/Volumes", "s3://b/p")


def test_connection_limit_per_uid() -> None:
    lim = auth.ConnectionLimit(per_uid=2, root=3)
    assert lim.acquire(5) and lim.acquire(5)
    assert not lim.acquire(5)
    assert lim.acquire(6)  # another uid has its own budget
    assert lim.acquire(0) and lim.acquire(0) and lim.acquire(0) and not lim.acquire(0)
    lim.release(5)
    assert lim.acquire(5)
    assert lim.refused == 2


def test_peer_credentials_come_from_the_kernel() -> None:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with a, b:
        c = auth.peer_caller(a)
    assert (c.uid, c.gid, c.pid) == (os.geteuid(), os.getegid(), os.getpid())
    assert set(os.getgroups()) <= set(c.groups) | {c.gid}


# -- trusted directories ---------------------------------------------------------------------


def test_socket_dir_must_be_owned_and_closed(tmp_path: Path) -> None:
    uid = os.geteuid()
    d = tmp_path / "sock"
    prepare_dir(str(d), uid)
    want = 0o755 if uid == 0 else 0o700  # root's sockets are for everyone (each request checked)
    assert stat.S_IMODE(d.stat().st_mode) == want and d.stat().st_uid == uid
    prepare_dir(str(d), uid)  # again: fine
    d.chmod(0o775)  # writable by a group: someone could replace the socket
    with pytest.raises(SocketDirError, match="mode 775"):
        prepare_dir(str(d), uid)
    d.chmod(0o700)
    with pytest.raises(SocketDirError, match="mode 711"):
        d.chmod(0o711)
        check_dir(str(d), uid, 0o700)
    link = tmp_path / "link"
    link.symlink_to(d)
    with pytest.raises(SocketDirError, match="not a directory"):
        check_dir(str(link), uid, 0o700)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to chown")
def test_socket_dir_pre_created_by_another_user_is_refused(tmp_path: Path) -> None:
    d = tmp_path / "airfs-4242"
    d.mkdir(mode=0o700)
    os.chown(d, 4343, 4343)  # another user got there first
    with pytest.raises(SocketDirError, match="belongs to uid 4343, not 4242"):
        prepare_dir(str(d), 4242)


def test_socket_dir_of_a_non_root_mount_ignores_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", "/somewhere/else")
    assert runtime_dir(0) == "/run/airfs"
    d = runtime_dir(987654)  # no /run/user/987654 here
    assert d == "/tmp/airfs-987654"


def test_cache_dir_is_created_closed(tmp_path: Path) -> None:
    c = tmp_path / "parent" / "cache"
    prepare_cache_dir(str(c))
    assert stat.S_IMODE(c.stat().st_mode) == 0o700
    prepare_cache_dir(str(c))  # again: fine


def test_cache_dir_open_to_others_is_refused_unless_empty(tmp_path: Path) -> None:
    c = tmp_path / "cache"
    c.mkdir()
    c.chmod(0o755)
    prepare_cache_dir(str(c))  # empty: closed for us
    assert stat.S_IMODE(c.stat().st_mode) == 0o700
    (c / "airfs.log").write_text("paths")
    c.chmod(0o750)
    with pytest.raises(MountError) as ei:
        prepare_cache_dir(str(c))
    msg = str(ei.value)
    assert "open to other users (mode 750)" in msg and "chmod 700" in msg and "\n" not in msg
    (c / "airfs.log").unlink()
    (tmp_path / "file").write_text("x")
    with pytest.raises(MountError, match="not a directory"):
        prepare_cache_dir(str(tmp_path / "file"))


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to chown")
def test_cache_dir_of_another_user_is_refused(tmp_path: Path) -> None:
    c = tmp_path / "cache"
    c.mkdir(mode=0o700)
    os.chown(c, 4242, 4242)
    with pytest.raises(MountError, match="belongs to uid 4242"):
        prepare_cache_dir(str(c))


# -- the server's dispatch -------------------------------------------------------------------


class FakeDaemon:
    owner = OWNER

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def status(self) -> dict[str, Any]:
        return {"pid": 1, "writeback": {"last_error": "commit of priv/s failed", "errors": 1}}

    async def lookup(self, path: str) -> tuple[Kind, int] | None:
        return TREE.get(path)

    async def warm(self, paths: list[str], jobs: int, progress: Any, caller: Peer) -> Any:
        self.calls.append(("warm", paths))
        return {"files": len(paths)}

    def prefetch(self, paths: list[str]) -> dict[str, Any]:
        self.calls.append(("prefetch", paths))
        return {"queued": len(paths)}

    async def flush(self, path: str, progress: Any, caller: Peer) -> dict[str, Any]:
        self.calls.append(("flush", path))
        return {"files": 0}

    async def unmount(self, progress: Any) -> dict[str, Any]:
        self.calls.append(("unmount", None))
        return {"drained": True}

    async def catalog(self, caller: Peer, command: str, args: dict[str, Any]) -> Any:
        raise OSError(errno.EOPNOTSUPP, "this mount has no catalog support")

    async def govern(self, caller: Peer, op: str, path: str) -> None:
        return None  # nothing governed


def dispatch(server: ControlServer, caller: Peer, req: dict[str, Any]) -> Any:
    async def go() -> Any:
        try:
            return await server._dispatch(req, caller, lambda p: None)
        except Denied as exc:
            server.denials.record(caller, str(req.get("op")), str(exc))
            raise

    return trio.run(go)


def test_dispatch_authorises_each_operation() -> None:
    d = FakeDaemon()
    s = ControlServer(d, "/unused", owner_uid=0)
    for req in (
        {"op": "unmount"},
        {"op": "warm", "paths": ["pub/hidden"]},
        {"op": "warm", "paths": ["../../etc"]},
        {"op": "prefetch", "paths": ["pub/a", "priv/s"]},
        {"op": "flush", "path": "pub"},
    ):
        with pytest.raises(Denied):
            dispatch(s, ALICE, req)
    assert d.calls == []  # nothing reached the daemon
    assert s.statistics().denied == 5
    assert s.statistics().denied_by_op == {"unmount": 1, "warm": 2, "prefetch": 1, "flush": 1}
    assert dispatch(s, ALICE, {"op": "warm", "paths": ["pub/a", "./pub"]}) == {"files": 2}
    assert dispatch(s, ALICE, {"op": "prefetch", "paths": ["pub/a"]}) == {"queued": 1}
    gone = {"op": "prefetch", "paths": ["pub/gone", "pub/a"]}  # hints: a missing path is skipped
    assert dispatch(s, ALICE, gone) == {"queued": 1}
    assert dispatch(s, ALICE, {"op": "flush", "path": "shared"}) == {"files": 0}
    assert d.calls == [
        ("warm", ["pub/a", "pub"]),
        ("prefetch", ["pub/a"]),
        ("prefetch", ["pub/a"]),
        ("flush", "shared"),
    ]
    assert dispatch(s, ROOT, {"op": "unmount"}) == {"drained": True}


def test_status_is_redacted_for_everyone_but_root_and_the_owner() -> None:
    d = FakeDaemon()
    s = ControlServer(d, "/unused", owner_uid=1002)
    mine = dispatch(s, BOB, {"op": "status"})  # the owner
    assert mine["writeback"]["last_error"] == "commit of priv/s failed"
    assert "control" in mine and "redacted" not in mine
    theirs = dispatch(s, ALICE, {"op": "status"})
    assert theirs["writeback"] == {"last_error": None, "errors": 1}
    assert theirs["redacted"] is True and theirs["control"]["denied"] == 0
    assert dispatch(s, BOB, {"op": "unmount"}) == {"drained": True}  # the owner may unmount


def test_denials_are_counted_always_and_logged_at_most_once_a_second(
    caplog: pytest.LogCaptureFixture,
) -> None:
    d = auth.Denials(log_interval=3600)
    with caplog.at_level("WARNING", logger="airfs.control.auth"):
        for _ in range(50):
            d.record(ALICE, "unmount", "no")
        d.record(BOB, "unmount", "no")
        d.record(ALICE, "warm", "no")
    assert d.total == 52 and d.by_op == {"unmount": 51, "warm": 1}
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3
    assert lines[0] == "control: denied unmount to uid 1001 (pid 2): no"


class LeavingClient(FakeDaemon):
    """A flush that reports progress only once its client has gone, then returns."""

    def __init__(self, client_gone: trio.Event) -> None:
        super().__init__()
        self.client_gone = client_gone

    async def flush(self, path: str, progress: Any, caller: Peer) -> dict[str, Any]:
        await self.client_gone.wait()
        progress({"files": 1})  # still pending when the request ends: the last drain sends it
        return {"files": 0}


def test_a_client_that_left_before_the_reply_is_not_a_daemon_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``airfs flush --timeout`` leaves while the daemon still works; the progress and the
    reply sent after that meet a broken pipe, which is the client's leaving, not a failure
    logged with a traceback (it was, when the pump had not met it first)."""
    from airfs.control.protocol import encode

    async def main() -> None:
        gone = trio.Event()
        server = ControlServer(LeavingClient(gone), "/unused", owner_uid=0)
        a, b = trio.socket.socketpair()
        ours, theirs = trio.SocketStream(a), trio.SocketStream(b)
        async with theirs, trio.open_nursery() as nursery:
            nursery.start_soon(server._serve_one, theirs, ROOT)
            await ours.send_all(encode({"op": "flush", "path": "shared"}))
            await ours.aclose()
            gone.set()

    with caplog.at_level("INFO", logger="airfs.control.server"):
        trio.run(main)
    assert not [r for r in caplog.records if r.levelname == "ERROR"], caplog.text
    assert "the client left before the reply" in caplog.text


def _refusals(
    serve: Callable[[trio.SocketStream], Awaitable[None]],
    *,
    queued: bytes = b"",
    sent: bytes = b"",
    n: int = 100,
) -> list[dict[str, Any]]:
    """``n`` connections through socket pairs, each served by ``serve``: the client has
    ``queued`` in the socket before the server starts and sends ``sent`` while it runs, then
    reads to the end (a reset is kept as its repr, which no reply parses as). The replies,
    each checked to be one whole line."""
    import threading

    def client(sock: socket.socket, out: list[bytes]) -> None:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(sent)
        got = b""
        try:
            while chunk := sock.recv(65536):
                got += chunk
        except ConnectionResetError as exc:
            got = repr(exc).encode()
        sock.close()
        out.append(got)

    async def one() -> bytes:
        a, b = socket.socketpair(socket.AF_UNIX)
        a.sendall(queued)
        out: list[bytes] = []
        t = threading.Thread(target=client, args=(a, out))
        t.start()
        async with trio.SocketStream(trio.socket.from_stdlib_socket(b)) as theirs:
            await serve(theirs)
        await trio.to_thread.run_sync(t.join)
        return out[0]

    async def main() -> list[bytes]:
        return [await one() for _ in range(n)]

    replies = []
    for got in trio.run(main):
        assert got.endswith(b"\n"), got[:200]
        replies.append(json.loads(got))
    return replies


def test_a_line_too_long_is_refused_and_the_reply_reaches_the_client() -> None:
    """The server stops reading past ``MAX_LINE`` while the client is still sending; closing
    with those bytes unread made the client's ``recv`` fail with ECONNRESET on this kernel
    before it read the queued reply (seen in CI; a few times in a hundred here). The reply
    must arrive, every time."""
    from airfs.control.protocol import MAX_LINE

    server = ControlServer(FakeDaemon(), "/unused", owner_uid=0)

    async def serve(stream: trio.SocketStream) -> None:
        await server._serve_one(stream, ALICE)

    for reply in _refusals(serve, sent=b" " * (MAX_LINE + (1 << 20)) + b"\n"):
        assert reply["errno"] == errno.EMSGSIZE, reply
        assert f"longer than {MAX_LINE} bytes" in reply["error"]


def test_a_connection_over_the_limit_gets_its_refusal_even_with_its_request_unread() -> None:
    """A client over its uid's connection limit has usually sent its request line by the time
    the server refuses it; the refusal closed the connection with that line unread, and the
    client's ``recv`` could fail with ECONNRESET instead of reading "too many connections"
    (the same kernel behaviour as the over-long line above). The reply must arrive, every
    time, and name the limit that applies to the caller (root has its own)."""
    limit = auth.ConnectionLimit(per_uid=0, root=0)  # every caller is over its limit
    server = ControlServer(FakeDaemon(), "/unused", owner_uid=0, limit=limit)
    line = json.dumps({"op": "status"}).encode() + b"\n"  # sent before the refusal
    for reply in _refusals(server._handle, queued=line):
        assert reply["errno"] == errno.EAGAIN, reply
        assert f"too many connections from uid {os.getuid()} (at most 0)" in reply["error"]
