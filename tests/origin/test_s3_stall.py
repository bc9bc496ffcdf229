"""A stalled S3 server (connections accepted, never answered), through a switchable proxy in
front of a real SeaweedFS: every call fails with :class:`Stalled` (a transient error) after
the origin's stall deadline instead of hanging, and works again once the server answers."""

from __future__ import annotations

import errno
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from airfs.origin.base import Stalled, Transient
from airfs.origin.s3 import S3Origin
from airfs.testing.seaweed import SeaweedServer
from airfs.testing.stallproxy import StallProxy

pytestmark = pytest.mark.s3

#: only turns a hang into a failure (the stall deadline below is 1 s)
HANG = 30.0


def outcome(fn: Callable[[], Any]) -> BaseException | Any:
    """``fn()``'s result or exception, or a failure if it is still running after HANG s."""
    got: list[Any] = []

    def run() -> None:
        try:
            got.append(fn())
        except BaseException as exc:
            got.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(HANG)
    if t.is_alive():
        pytest.fail(f"still waiting for the stalled server after {HANG} s")
    return got[0]


def test_calls_to_a_stalled_server_fail_after_the_deadline(
    seaweed: SeaweedServer, tmp_path: Path
) -> None:
    host, port = seaweed.endpoint.removeprefix("http://").split(":")
    with StallProxy((host, int(port))) as proxy:
        prefix = f"stall-{uuid.uuid4().hex[:8]}"
        o = S3Origin.from_url(
            seaweed.url(prefix), env=seaweed.env, endpoint=proxy.endpoint, stall_timeout=1.0
        )
        src = tmp_path / "src"
        src.write_bytes(b"before")
        o.put("kept", str(src))
        o.mkdir("dir")
        assert o.read_range("kept", 0, 100) == b"before"  # a kept-alive connection now

        proxy.stall()
        calls: dict[str, Callable[[], Any]] = {
            "stat": lambda: o.stat("kept"),
            "list": lambda: list(o.list("")),
            "read": lambda: o.read_range("kept", 0, 100),
            "put": lambda: o.put("new", str(src), ""),
            "mkdir": lambda: o.mkdir("other"),
            "marker head": lambda: o.stat("dir"),
        }
        for name, fn in calls.items():
            got = outcome(fn)
            assert isinstance(got, Stalled), (name, got)
            assert isinstance(got, Transient) and got.transient
            assert got.errno == errno.EIO
            assert "did not answer in time" in str(got.strerror), (name, got)

        proxy.resume()
        assert o.read_range("kept", 0, 100) == b"before"
        o.put("new", str(src), "")
        assert o.stat("new").size == len(b"before")


def test_a_stall_starts_the_outage_state(seaweed: SeaweedServer) -> None:
    """AsyncOrigin: one stalled call makes the origin down at once (fast calls then fail
    without asking it), a stalled call is tried at most twice, and the first answer after the
    stall ends the outage."""
    import trio

    from airfs.origin.aio import AsyncOrigin

    host, port = seaweed.endpoint.removeprefix("http://").split(":")
    with StallProxy((host, int(port))) as proxy:
        o = S3Origin.from_url(
            seaweed.url(f"stall-{uuid.uuid4().hex[:8]}"),
            env=seaweed.env,
            endpoint=proxy.endpoint,
            stall_timeout=1.0,
        )
        a = AsyncOrigin(o, base_delay=0.01, down_for=2.0, probe_s=0.5)

        async def main() -> None:
            with trio.fail_after(HANG):
                o.mkdir("d")
                await a.stat("d", fast=True)
                assert not a.down
                proxy.stall()
                with pytest.raises(Stalled):
                    await a.stat("d")  # not fast: retried, but a stall only once more
                assert a.statistics().calls["stat"] == 3  # 1 before + 2 stalled
                assert a.down
                with pytest.raises(Transient, match="unreachable"):
                    await a.stat("d", fast=True)  # no call made
                with pytest.raises(Transient, match="unreachable"):
                    await a.list("", fast=True)
                assert a.statistics().calls["stat"] == 3
                assert "list" not in a.statistics().calls
                await trio.sleep(2.1)  # the period is over: one probe, waiting <= probe_s
                with pytest.raises(Stalled, match="no answer within"):
                    await a.stat("d", fast=True)
                assert a.down  # and the others still fail at once
                proxy.resume()
                await trio.sleep(2.6)
                assert (await a.stat("d", fast=True)).name == "d"
                assert not a.down

        trio.run(main)
