"""Stopping a put (``Capabilities.cancel_puts``): S3 against a real SeaweedFS, and the
emulated transfer of :class:`~airfs.origin.latency.LatencyOrigin`."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import obstore
import pytest
from obstore.store import MemoryStore

from airfs.origin.base import NotFound, PutCancel, PutCancelled
from airfs.origin.latency import LatencyOrigin
from airfs.origin.posix import PosixOrigin
from airfs.origin.s3 import S3Origin
from airfs.origin.s3._stoppable import StoppableFile, stoppable_multipart

MiB = 1 << 20
Factory = Callable[..., S3Origin]


def source(tmp_path: Path, size: int) -> tuple[str, bytes]:
    data = os.urandom(size)
    p = tmp_path / f"src-{size}"
    p.write_bytes(data)
    return str(p), data


def small_parts(factory: Factory) -> S3Origin:
    """Multipart from 1 MiB on, in 5 MiB parts, two at a time."""
    return factory(single_put_max=MiB, part_size=5 * MiB, put_concurrency=2)


@pytest.mark.s3
def test_s3_declares_it_and_posix_does_not(s3_origin_factory: Factory, tmp_path: Path) -> None:
    assert s3_origin_factory().capabilities.cancel_puts
    assert not PosixOrigin(str(tmp_path)).capabilities.cancel_puts


@pytest.mark.s3
@pytest.mark.parametrize("size", [64 * 1024, 20 * MiB], ids=["single", "multipart"])
def test_a_put_cancelled_before_it_starts_sends_nothing(
    s3_origin_factory: Factory, tmp_path: Path, size: int
) -> None:
    o = small_parts(s3_origin_factory)
    src, _ = source(tmp_path, size)
    c = PutCancel()
    c.cancel()
    with pytest.raises(PutCancelled):
        o.put("f.bin", src, cancel=c)
    with pytest.raises(NotFound):
        o.stat("f.bin")


def on_reads(monkeypatch: pytest.MonkeyPatch, after: Callable[[list[int]], None]) -> list[int]:
    """Call ``after(sizes)`` after each read of an upload's file (the sizes read so far):
    a cancel at a chosen point, no timing. Returns the sizes."""
    reads: list[int] = []
    orig = StoppableFile.read

    def read(self: StoppableFile, size: int = -1) -> bytes:
        got = orig(self, size)
        reads.append(len(got))
        after(reads)
        return got

    monkeypatch.setattr(StoppableFile, "read", read)
    return reads


def cancel_after_reads(monkeypatch: pytest.MonkeyPatch, c: PutCancel, n: int) -> list[int]:
    """Set ``c`` once the upload has read ``n`` parts of its file."""
    return on_reads(monkeypatch, lambda reads: c.cancel() if len(reads) == n else None)


@pytest.mark.s3
def test_a_multipart_put_cancelled_between_parts_publishes_nothing(
    s3_origin_factory: Factory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cancelled after two of its eight parts were read: the put raises PutCancelled, the
    object it replaces is still there as it was, no new object appears, and the upload it
    left is aborted (none left behind)."""
    o = small_parts(s3_origin_factory)
    old, old_data = source(tmp_path, 3000)
    before = o.put("f.bin", old)
    src, _ = source(tmp_path, 40 * MiB)
    c = PutCancel()
    reads = cancel_after_reads(monkeypatch, c, 2)
    with pytest.raises(PutCancelled):
        o.put("f.bin", src, cancel=c)
    assert len(reads) >= 2 and 0 not in reads  # stopped before the end of the file
    now = o.stat("f.bin")
    assert (now.version, now.size) == (before.version, 3000)
    assert o.read_range("f.bin", 0, 3000) == old_data
    c2 = PutCancel()
    reads = cancel_after_reads(monkeypatch, c2, 1)
    with pytest.raises(PutCancelled):  # and at a new name: nothing at all
        o.put("new.bin", src, cancel=c2)
    with pytest.raises(NotFound):
        o.stat("new.bin")
    assert o.abort_stale_uploads(older_than_s=0) == 0


@pytest.mark.s3
def test_without_a_signing_client_the_upload_fails_at_its_next_read(
    s3_origin_factory: Factory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no way to find the upload to abort it, the stopped upload goes on to its next
    read, which fails: obstore aborts the upload itself; nothing appears, nothing is left."""
    o = small_parts(s3_origin_factory)
    src, _ = source(tmp_path, 40 * MiB)
    c = PutCancel()
    reads = cancel_after_reads(monkeypatch, c, 1)
    out = stoppable_multipart(
        o.client.bulk, "f.bin", Path(src), c, None, chunk_size=5 * MiB, max_concurrency=2
    )
    assert out is None and 0 not in reads
    with pytest.raises(NotFound):
        o.stat("f.bin")
    assert o.abort_stale_uploads(older_than_s=0) == 0


@pytest.mark.s3
def test_a_cancel_after_the_last_read_lets_the_upload_complete(
    s3_origin_factory: Factory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cancelled once the end of the file was read (the completion may be under way): the
    put is let finish and returns its entry; the object is whole."""
    o = small_parts(s3_origin_factory)
    src, data = source(tmp_path, 12 * MiB)
    c = PutCancel()
    on_reads(monkeypatch, lambda reads: c.cancel() if reads[-1] == 0 else None)
    e = o.put("f.bin", src, cancel=c)
    assert c.cancelled
    assert o.stat("f.bin").version == e.version
    assert o.read_range("f.bin", 0, len(data)) == data


@pytest.mark.s3
def test_a_put_not_cancelled_is_unchanged_and_a_late_cancel_does_nothing(
    s3_origin_factory: Factory, tmp_path: Path
) -> None:
    o = small_parts(s3_origin_factory)
    src, data = source(tmp_path, 12 * MiB)
    c = PutCancel()
    e = o.put("f.bin", src, cancel=c)
    c.cancel()  # after the put returned: nothing to stop
    assert o.stat("f.bin").version == e.version
    assert o.read_range("f.bin", 0, len(data)) == data


def test_an_emulated_transfer_stops_when_its_put_is_cancelled(tmp_path: Path) -> None:
    """LatencyOrigin's put of 8 MiB at 1 MiB/s (8 s) stops during its transfer when it is
    cancelled, and puts nothing (an S3 inner origin stops between parts)."""
    (tmp_path / "origin").mkdir()
    inner = PosixOrigin(str(tmp_path / "origin"))
    o = LatencyOrigin(inner, latency_s=0.0, bandwidth_bps=MiB)
    src, _ = source(tmp_path, 8 * MiB)
    c = PutCancel()
    threading.Timer(0.2, c.cancel).start()
    with pytest.raises(PutCancelled):  # (the POSIX origin itself ignores a cancel)
        o.put("f.bin", src, cancel=c)
    with pytest.raises(NotFound):
        inner.stat("f.bin")


def test_a_failed_abort_of_a_stopped_upload_still_stops_the_put(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The abort of the upload left behind fails (the server unreachable): the put is
    stopped all the same (it can never complete), and the failure is logged. (A memory
    store; its first read cancels the put and then takes 0.2 s, so the upload is still
    reading when the cancel is seen.)"""
    store = MemoryStore()
    src, _ = source(tmp_path, 12 * MiB)
    c = PutCancel()

    def first_read_cancels(reads: list[int]) -> None:
        if not c.cancelled:
            c.cancel()
            time.sleep(0.2)

    on_reads(monkeypatch, first_read_cancels)

    def abort() -> None:
        raise OSError("connection refused")

    out = stoppable_multipart(
        store, "f.bin", Path(src), c, abort, chunk_size=5 * MiB, max_concurrency=1
    )
    assert out is None
    assert "could not abort a stopped upload" in caplog.text
    with pytest.raises(FileNotFoundError):
        obstore.head(store, "f.bin")


def test_the_end_of_the_file_is_known_at_its_short_last_read(tmp_path: Path) -> None:
    """A reader that stops asking once it has a short read (no last empty read) has read the
    end: the file no longer refuses (the upload may be completing)."""
    src, data = source(tmp_path, 12 * MiB)
    f = StoppableFile(Path(src))
    try:
        assert f.read(5 * MiB) + f.read(5 * MiB) == data[: 10 * MiB]
        assert not f.eof
        assert f.read(5 * MiB) == data[10 * MiB :]
        assert f.eof and not f.refuse()
        g = StoppableFile(Path(src))
        g.read(5 * MiB)
        assert g.refuse()  # before the end: refused, and every later read fails
        with pytest.raises(OSError):
            g.read(5 * MiB)
        g.close()
    finally:
        f.close()
