"""The origin goes down mid-run (a dedicated SeaweedFS server is stopped, then restarted):
cached reads keep working, uncached reads fail with EIO in bounded time, writes land in
staging and are reported, and commit with the right bytes once the origin is back."""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from airfs.fuse import TRANSPORTS
from airfs.origin.base import NotFound
from airfs.origin.s3 import S3Origin
from airfs.testing.mountfix import Mounted, fuse_available, mount, teardown
from airfs.testing.seaweed import SeaweedServer, find_weed, seaweed_server
from airfs.testing.stallproxy import StallProxy

pytestmark = [pytest.mark.mount, pytest.mark.s3]

MiB = 1 << 20


def drop_page_cache(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def test_origin_outage_and_recovery(tmp_path: Path) -> None:
    if not fuse_available():
        pytest.skip("needs /dev/fuse and fusermount3")
    try:
        find_weed()
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    from airfs.origin.s3 import S3Origin

    with seaweed_server(tmp_path / "sw") as srv:
        url = srv.url("outage")
        view = S3Origin.from_url(url, env=srv.env)
        (tmp_path / "mnt").mkdir()
        cached = os.urandom(3 * MiB + 1)
        uncached = os.urandom(MiB)
        src = tmp_path / "src"
        src.write_bytes(uncached)
        view.put("cold.bin", str(src))
        m = mount(
            url,
            tmp_path / "mnt",
            tmp_path / "cache",
            "--s3-endpoint",
            srv.endpoint,
            "--ttl",
            "0.3",
            env=srv.env,
        )
        # what the outage provokes: uncached reads and commits fail (and are retried)
        m.expect_errors(r"cannot reach the S3 endpoint")
        try:
            root = m.mountpoint
            (root / "data").mkdir()
            (root / "data" / "hot.bin").write_bytes(cached)
            new = {f"data/new{i}.bin": os.urandom(200_000 + i) for i in range(3)}
            for rel in new:
                (root / rel).write_bytes(b"old")
            m.flush()
            assert (root / "data" / "hot.bin").read_bytes() == cached
            assert os.path.getsize(root / "cold.bin") == len(uncached)  # known, not read

            # a reader that has the file open (the kernel keeps its inode referenced)
            held = open(root / "data" / "hot.bin", "rb", buffering=0)  # noqa: SIM115
            # writers that opened their files before the outage (a name the node has
            # forgotten cannot be looked up while the origin is down: see the report)
            writers = {rel: open(root / rel, "r+b") for rel in new}  # noqa: SIM115

            srv.stop()
            time.sleep(0.5)  # past the TTL: every open revalidates against a dead origin

            # cached reads keep working throughout, through the open handle and new opens
            try:
                for _ in range(2):
                    os.posix_fadvise(held.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
                    assert os.pread(held.fileno(), len(cached) + 1, 0) == cached
                    drop_page_cache(root / "data" / "hot.bin")
                    assert (root / "data" / "hot.bin").read_bytes() == cached
                    time.sleep(0.35)
            finally:
                held.close()

            # uncached data: EIO after retries, in bounded time
            t0 = time.monotonic()
            with pytest.raises(OSError) as info:
                (root / "cold.bin").read_bytes()
            took = time.monotonic() - t0
            assert info.value.errno == errno.EIO, info.value
            assert took < 60, took

            print(f"uncached read failed after {took:.1f}s")
            # a cached file opens without waiting for the dead origin (it took 9-12 s)
            t0 = time.monotonic()
            assert (root / "data" / "hot.bin").read_bytes()[:10] == cached[:10]
            print(f"cached open+read during the outage: {time.monotonic() - t0:.2f}s")
            # a brand-new name can be created while the origin is down (it failed with EIO):
            # its commit is create-only, so nothing at the origin can be overwritten
            (root / "data" / "made-offline.bin").write_bytes(b"offline")
            new["data/made-offline.bin"] = b"offline"
            # a flush with a timeout returns (non-zero) while the origin is down
            t0 = time.monotonic()
            p = subprocess.run(
                [sys.executable, "-m", "airfs.cli", "flush", "--timeout", "3", str(root)],
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert p.returncode != 0 and "3" in p.stderr, (p.returncode, p.stderr)
            assert time.monotonic() - t0 < 20
            # writes land in staging; status shows the backlog and the error
            for rel, data in new.items():
                if rel not in writers:
                    continue
                writers[rel].write(data)
                writers[rel].close()  # close() returns at local speed
            for rel, data in new.items():
                assert (root / rel).read_bytes() == data
            deadline = time.monotonic() + 30
            while True:
                wb = m.status()["writeback"]
                if wb["last_error"] and wb["errors"] >= 1:
                    break
                assert time.monotonic() < deadline, wb
                time.sleep(0.2)
            assert wb["pending_files"] == len(new), wb
            assert wb["pending_bytes"] == sum(len(d) for d in new.values())
            assert wb["last_error"], wb

            srv.start()
            m.flush(timeout=120)
            for rel, data in new.items():
                e = view.stat(rel)
                assert view.read_range(rel, 0, e.size) == data, rel
            wb = m.status()["writeback"]
            assert wb["pending_files"] == 0 and wb["failing"] == [], wb
            # and uncached reads work again
            assert (root / "cold.bin").read_bytes() == uncached
        finally:
            teardown(m)
            view.close()


@contextlib.contextmanager
def proxied_mount(
    tmp_path: Path, seaweed: SeaweedServer, name: str, *, ttl: float
) -> Iterator[tuple[StallProxy, Mounted, S3Origin]]:
    """A mount of a fresh prefix of ``seaweed``'s bucket with its S3 endpoint behind a
    :class:`StallProxy` (2 s request timeout; its timeouts are expected in the daemon's log),
    and a view of the prefix straight to the server; unmounted and checked at the end."""
    if not fuse_available():
        pytest.skip("needs /dev/fuse and fusermount3")
    host, port = seaweed.endpoint.removeprefix("http://").split(":")
    url = seaweed.url(f"{name}-{os.getpid()}-{time.monotonic_ns()}")
    view = S3Origin.from_url(url, env=seaweed.env)
    try:
        with StallProxy((host, int(port))) as proxy:
            (tmp_path / "mnt").mkdir()
            m = mount(
                url,
                tmp_path / "mnt",
                tmp_path / "cache",
                "--s3-endpoint",
                proxy.endpoint,
                "--s3-timeout",
                "2",
                "--ttl",
                str(ttl),
                env=seaweed.env,
            )
            m.expect_errors(r"did not answer in time|is down \(no answer within|is unreachable")
            try:
                yield proxy, m, view
            finally:
                teardown(m)
    finally:
        view.close()


def test_stalled_origin(tmp_path: Path, seaweed: SeaweedServer) -> None:
    """The S3 server stalls (a proxy in front of it accepts connections and never answers):
    a new file can be created, written and closed while it does (it waited 130 s and more
    for the server), cached reads keep working, and everything commits once it answers."""
    with proxied_mount(tmp_path, seaweed, "stalled", ttl=0.3) as (proxy, m, view):
        root = m.mountpoint
        cached = os.urandom(MiB + 3)
        (root / "data").mkdir()
        (root / "data" / "hot.bin").write_bytes(cached)
        cold = os.urandom(300_000)
        src = tmp_path / "cold"
        src.write_bytes(cold)
        view.put("cold.bin", str(src))
        m.flush()
        assert (root / "data" / "hot.bin").read_bytes() == cached
        assert os.path.getsize(root / "cold.bin") == len(cold)  # known, never read

        proxy.stall()
        time.sleep(0.5)  # past the TTL: every open revalidates against the stalled server
        made: dict[str, bytes] = {}

        def offline_work() -> None:
            for i in range(3):
                t0 = time.monotonic()
                rel = f"data/made-{i}.bin"
                made[rel] = os.urandom(100_000 + i)
                with open(root / rel, "wb") as f:  # O_CREAT | O_TRUNC of a new name
                    f.write(made[rel])
                print(f"create+write+close {i} while stalled: {time.monotonic() - t0:.2f}s")
                assert (root / "data" / "hot.bin").read_bytes() == cached
            fd = os.open(root / "top.txt", os.O_CREAT | os.O_WRONLY, 0o640)
            os.write(fd, b"top")
            os.close(fd)
            made["top.txt"] = b"top"
            # O_EXCL claims the name at the origin: it cannot while the origin is down
            with pytest.raises(OSError) as info:
                os.open(root / "excl.lock", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
            assert info.value.errno == errno.EIO, info.value
            # data this node never read: EIO after the deadlines, not a hang
            t0 = time.monotonic()
            with pytest.raises(OSError) as info:
                (root / "cold.bin").read_bytes()
            assert info.value.errno == errno.EIO, info.value
            print(f"uncached read while stalled: EIO after {time.monotonic() - t0:.2f}s")

        within(offline_work, "creating files while the origin stalls")
        for rel, data in made.items():
            assert (root / rel).read_bytes() == data
        assert m.status()["writeback"]["pending_files"] == len(made)

        proxy.resume()
        m.flush(timeout=120)
        for rel, data in made.items():
            e = view.stat(rel)
            assert view.read_range(rel, 0, e.size) == data, rel
        assert m.status()["writeback"]["pending_files"] == 0
        assert not (root / "excl.lock").exists()
        assert (root / "cold.bin").read_bytes() == cold
        fd = os.open(root / "excl.lock", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        os.close(fd)  # and it claims names again once the origin answers


def within(fn: Callable[[], None], what: str, hang: float = 30.0) -> None:
    """Run ``fn`` in a thread; fail if it raises or is still running after ``hang`` seconds
    (this turns a hang into a failure: it is no measure of speed)."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            fn()
        except BaseException as exc:
            errors.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(hang)
    if t.is_alive():
        pytest.fail(f"{what}: still blocked after {hang} s")
    if errors:
        raise errors[0]


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("then", ["rewrite", "rename"])
def test_a_put_that_landed_but_lost_its_answer_is_ours(
    tmp_path: Path,
    seaweed: SeaweedServer,
    then: str,
    transport: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Through a mount (each FUSE transport), on S3: a commit's PUT reaches the server and
    lands, but its answer is lost (a proxy drops the server's answers to PUTs: the daemon
    times out and retries). Before the retry the file is rewritten (or a file never committed
    is renamed over it). The next commit, *If-Match* the version before, finds our own
    landed bytes: it must commit over them, not report a conflict (before: the newest bytes
    went to ``conflicts/``, ``airfs flush`` failed and the mount showed the landed bytes)."""
    monkeypatch.setenv("AIRFS_TEST_FUSE", transport)
    # a long TTL: nothing asks the origin again during the test but the commits
    with proxied_mount(tmp_path, seaweed, "lost", ttl=60) as (proxy, m, view):
        root = m.mountpoint
        f = root / "model.ckpt"
        f.write_bytes(b"zero" * 1000)
        m.flush()
        errors = m.status()["writeback"]["errors"]

        proxy.lose_responses()
        landed = os.urandom(300_000)
        f.write_bytes(landed)
        deadline = time.monotonic() + 60
        while m.status()["writeback"]["errors"] == errors:  # its PUT timed out
            assert time.monotonic() < deadline, m.status()["writeback"]
            time.sleep(0.2)
        e = view.stat("model.ckpt")
        assert view.read_range("model.ckpt", 0, e.size) == landed  # ... and landed

        final = os.urandom(200_000)
        if then == "rewrite":
            f.write_bytes(final)
        else:
            (root / "new.ckpt").write_bytes(final)  # never committed: no answers
            os.rename(root / "new.ckpt", f)
        proxy.resume()
        m.flush(timeout=120)
        wb = m.status()["writeback"]
        assert wb["conflicts"] == [], wb["conflicts"]
        e = view.stat("model.ckpt")
        assert view.read_range("model.ckpt", 0, e.size) == final
        assert f.read_bytes() == final
        assert not (root / "new.ckpt").exists()
        with pytest.raises(NotFound):
            view.stat("new.ckpt")
