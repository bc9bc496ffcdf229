"""Name operations stop the uploads they would wait for (``Capabilities.cancel_puts``): the
filesystem core driven directly over a memory origin whose puts block until a gate opens
or their cancel is set. The mounted proof on S3 is in ``tests/fuse/test_writeback.py``.

A rename or unlink of a file whose commit is uploading asked for it to stop; the version
is then pending again: renamed locally (committed once, at its new name, no copy at the
origin) or dropped (nothing put at the origin). An origin that cannot stop a put (no
``cancel_puts``) is waited for, as before (``test_core.py``).
"""

from __future__ import annotations

import dataclasses
import os
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from airfs.core.fs import Filesystem
from airfs.core.inodes import ROOT_INO
from airfs.daemon.build import build
from airfs.origin.base import Capabilities, NotFound, PutCancel
from airfs.testing.memory import MemoryOrigin
from airfs.writeback.uploader import Uploader

W = os.O_WRONLY


class StoppableGate:
    """Wraps an origin: ``put`` blocks (in its worker thread) while ``gate`` is clear, and
    raises PutCancelled as soon as its cancel is set; declares ``cancel_puts``. Once through
    the gate it publishes, sets ``published`` and returns when ``returns`` is set (a put
    past the point where it can stop)."""

    def __init__(self, inner: MemoryOrigin) -> None:
        self.inner = inner
        self.url = inner.url
        self.gate = threading.Event()
        self.in_put = threading.Event()
        self.published = threading.Event()
        self.returns = threading.Event()
        self.returns.set()
        self.stopped: list[str] = []

    @property
    def capabilities(self) -> Capabilities:
        return dataclasses.replace(self.inner.capabilities, cancel_puts=True)

    def put(
        self,
        path: str,
        source: str,
        if_match: str | None = None,
        *,
        cancel: PutCancel | None = None,
        **kw: Any,
    ) -> Any:
        assert cancel is not None, "the uploader gives a cancel to an origin with cancel_puts"
        self.in_put.set()
        while not self.gate.wait(0.005):
            if cancel.cancelled:
                self.stopped.append(path)
                cancel.check(path)
        entry = self.inner.put(path, source, if_match, **kw)
        self.published.set()
        self.returns.wait(10)
        return entry

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@dataclasses.dataclass
class Core:
    fs: Filesystem
    mem: MemoryOrigin
    gate: StoppableGate
    uploader: Uploader

    async def write_file(self, name: str, data: bytes, parent: int = ROOT_INO) -> None:
        fh, _ = await self.fs.create(parent, name, 0o644, W | os.O_CREAT)
        assert await self.fs.write(fh, 0, data) == len(data)
        await self.fs.flush(fh)
        await self.fs.release(fh)

    async def uploading(self) -> None:
        """Until an upload is blocked in the origin's put (the gate closed)."""
        await trio.to_thread.run_sync(self.gate.in_put.wait, 10)
        self.gate.in_put.clear()

    async def flush(self) -> None:
        self.gate.gate.set()
        with trio.fail_after(15):
            await self.uploader.flush("")

    async def soon(self, fn: Callable[..., Awaitable[object]], *args: object) -> None:
        """``await fn(*args)``, which must end with the gate still closed: if it has not
        ended after 5 s the gate opens (a core that waits for the upload then ends too:
        name operations are shielded from cancellation) and the test fails."""
        late = False

        async def watchdog() -> None:
            nonlocal late
            await trio.sleep(5)
            late = True
            self.gate.gate.set()

        async with trio.open_nursery() as n:
            n.start_soon(watchdog)
            await fn(*args)
            n.cancel_scope.cancel()
        assert not late, "the operation waited for the upload"

    def data(self, path: str) -> bytes:
        return self.mem.read_range(path, 0, self.mem.stat(path).size)


@asynccontextmanager
async def core(tmp_path: Path) -> AsyncIterator[Core]:
    mem = MemoryOrigin()
    gate = StoppableGate(mem)
    async with build(gate, str(tmp_path / "cache"), ttl=0.05, staging_size=1 << 30) as b:
        try:
            yield Core(b.fs, mem, gate, b.uploader)
        finally:  # a put still blocked must end, or the core's shutdown waits for it
            gate.gate.set()
            gate.returns.set()


def absent(c: Core, path: str) -> bool:
    try:
        c.mem.stat(path)
    except NotFound:
        return True
    return False


async def test_an_unlink_stops_the_upload_of_its_file_and_puts_nothing(tmp_path: Path) -> None:
    async with core(tmp_path) as c:
        await c.write_file("scratch", b"x" * 5000)
        await c.uploading()
        await c.soon(c.fs.unlink, ROOT_INO, "scratch")
        assert c.gate.stopped == ["scratch"]
        await c.flush()
        assert absent(c, "scratch")
        s = c.uploader.statistics()
        assert (s.cancelled_uploads, s.errors, s.pending_files) == (1, 0, 0)
        assert c.mem.calls["put"] == 0


async def test_a_rename_stops_the_upload_and_commits_once_at_the_new_name(tmp_path: Path) -> None:
    async with core(tmp_path) as c:
        await c.write_file("ckpt.tmp", b"weights" * 1000)
        await c.uploading()
        await c.soon(c.fs.rename, ROOT_INO, "ckpt.tmp", ROOT_INO, "ckpt")
        assert c.gate.stopped == ["ckpt.tmp"]
        await c.flush()
        assert c.data("ckpt") == b"weights" * 1000
        assert absent(c, "ckpt.tmp")
        assert (c.mem.calls["put"], c.mem.calls["rename"]) == (1, 0)  # no copy at the origin
        assert c.uploader.statistics().cancelled_uploads == 1


async def test_a_directory_rename_stops_the_uploads_under_it(tmp_path: Path) -> None:
    """A checkpoint written into a temporary directory, renamed into place while its files
    upload (a trainer's save): the files commit at their new names, never at the old."""
    async with core(tmp_path) as c:
        await c.fs.mkdir(ROOT_INO, "tmp-checkpoint-1", 0o755)
        d = (await c.fs.lookup(ROOT_INO, "tmp-checkpoint-1")).ino
        for name in ("model.bin", "optim.bin"):
            await c.write_file(name, name.encode() * 100, parent=d)
        await c.uploading()
        await c.soon(c.fs.rename, ROOT_INO, "tmp-checkpoint-1", ROOT_INO, "checkpoint-1")
        assert c.gate.stopped  # at least the one blocked in its put
        await c.flush()
        for name in ("model.bin", "optim.bin"):
            assert c.data(f"checkpoint-1/{name}") == name.encode() * 100
            assert absent(c, f"tmp-checkpoint-1/{name}")
        assert c.mem.calls["put"] == 2


async def test_a_rename_over_a_file_whose_commit_uploads_replaces_it_once(tmp_path: Path) -> None:
    """An atomic write over a target whose last version is uploading: that upload stops,
    and only the new version reaches the origin."""
    async with core(tmp_path) as c:
        await c.write_file("state.json", b'{"step": 1}')
        await c.uploading()
        await c.write_file("state.json.tmp", b'{"step": 2}')
        await c.soon(c.fs.rename, ROOT_INO, "state.json.tmp", ROOT_INO, "state.json")
        assert c.gate.stopped == ["state.json"]
        await c.flush()
        assert c.data("state.json") == b'{"step": 2}'
        assert absent(c, "state.json.tmp")
        assert c.mem.calls["put"] == 1


async def test_an_upload_past_its_last_stop_is_waited_for_and_renamed_at_the_origin(
    tmp_path: Path,
) -> None:
    """A stop asked for too late (the put has published and not returned yet): the rename
    waits for the commit at the old name and renames it at the origin, as without a stop."""
    async with core(tmp_path) as c:
        c.gate.gate.set()
        c.gate.returns.clear()
        await c.write_file("a", b"aaa")
        await trio.to_thread.run_sync(c.gate.published.wait, 10)
        renamed = trio.Event()

        async def rename() -> None:
            await c.fs.rename(ROOT_INO, "a", ROOT_INO, "b")
            renamed.set()

        async with trio.open_nursery() as n:
            n.start_soon(rename)
            await trio.sleep(0.1)
            assert not renamed.is_set(), "the rename did not wait for a put it cannot stop"
            c.gate.returns.set()
        await c.flush()
        assert c.data("b") == b"aaa" and absent(c, "a")
        assert (c.mem.calls["put"], c.mem.calls["rename"]) == (1, 1)
        assert c.uploader.statistics().cancelled_uploads == 0


@pytest.mark.parametrize("op", ["unlink", "rename"])
async def test_a_stopped_version_is_not_uploaded_again_before_the_operation_ends(
    tmp_path: Path, op: str
) -> None:
    """The operation holds the name: the uploader does not start the stopped version again
    under the old name while the operation waits for the origin."""
    async with core(tmp_path) as c:
        await c.write_file("f", b"data")
        await c.uploading()
        if op == "unlink":
            await c.soon(c.fs.unlink, ROOT_INO, "f")
        else:
            await c.soon(c.fs.rename, ROOT_INO, "f", ROOT_INO, "g")
        assert c.gate.stopped == ["f"]
        await c.flush()
        assert absent(c, "f")
        assert c.mem.calls["put"] == (0 if op == "unlink" else 1)
