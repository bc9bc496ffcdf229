"""The kernel transport's reply thread (:mod:`airfs.fuse.kernel.replies`): replies queued by
the loop reach the device whole and in their order; one the kernel refuses is answered EIO;
``drain`` returns only once everything queued is written."""

from __future__ import annotations

import errno
import os
import struct
import threading
from typing import Any

import pytest

import airfs.fuse.kernel.replies as replies_mod
from airfs.fuse.kernel import proto
from airfs.fuse.kernel.replies import ReplyWriter

HEADER = struct.Struct("<IiQ")  # fuse_out_header: len, error, unique


def read_replies(fd: int, n: int) -> list[tuple[int, int, bytes]]:
    """``n`` replies from the read end of a pipe: (unique, error, payload) each."""
    out = []
    buf = b""
    while len(out) < n:
        buf += os.read(fd, 1 << 20)
        while len(buf) >= HEADER.size:
            length, error, unique = HEADER.unpack_from(buf)
            if len(buf) < length:
                break
            out.append((unique, error, buf[HEADER.size : length]))
            buf = buf[length:]
    return out


def test_replies_are_written_whole_and_in_order() -> None:
    r, w = os.pipe()
    writer = ReplyWriter(w)
    try:
        payloads = [os.urandom(1000 + i) for i in range(50)]
        got: list[tuple[int, int, bytes]] = []
        reader = threading.Thread(target=lambda: got.extend(read_replies(r, len(payloads))))
        reader.start()
        for i, p in enumerate(payloads):
            view = memoryview(p)
            writer.put(i + 1, [proto.out_header(i + 1, 0, len(p)), view[:500], view[500:]])
        assert writer.drain(10)
        reader.join(10)
        assert got == [(i + 1, 0, p) for i, p in enumerate(payloads)]
        assert writer.written == len(payloads) and writer.refused == 0
    finally:
        writer.close()
        os.close(r)
        os.close(w)


@pytest.mark.expect_log(r"writing a reply to /dev/fuse: \[Errno 22\]")
def test_a_refused_reply_is_answered_eio(monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel refuses a malformed reply (EINVAL): the request gets EIO instead, and a
    request that is gone (ENOENT) costs nothing more."""
    real = os.writev
    refuse = {7: errno.EINVAL, 8: errno.ENOENT}

    def writev(fd: int, parts: list[Any]) -> int:
        unique = HEADER.unpack_from(bytes(parts[0]))[2]
        code = refuse.pop(unique, None)
        if code is not None:
            raise OSError(code, os.strerror(code))
        return real(fd, parts)

    monkeypatch.setattr(replies_mod.os, "writev", writev)
    r, w = os.pipe()
    writer = ReplyWriter(w)
    try:
        for u in (7, 8, 9):
            writer.put(u, [proto.out_header(u, 0, 3), b"abc"])
        assert writer.drain(10)
        assert read_replies(r, 2) == [(7, -errno.EIO, b""), (9, 0, b"abc")]
        assert writer.refused == 1
    finally:
        writer.close()
        os.close(r)
        os.close(w)


def test_drain_waits_for_a_write_in_progress_and_close_writes_the_rest() -> None:
    """A full pipe holds the writer in ``writev``: ``drain`` says so (False) within its
    timeout; once the device is read, ``close`` leaves nothing unwritten."""
    r, w = os.pipe()
    writer = ReplyWriter(w)
    big = os.urandom(1 << 20)  # over a pipe's 64 KiB: blocks until read
    try:
        writer.put(1, [proto.out_header(1, 0, len(big)), big])
        writer.put(2, [proto.out_header(2, 0, 1), b"x"])
        assert not writer.drain(0.3)
        got: list[tuple[int, int, bytes]] = []
        reader = threading.Thread(target=lambda: got.extend(read_replies(r, 2)))
        reader.start()
        writer.close()
        reader.join(10)
        assert got == [(1, 0, big), (2, 0, b"x")]
    finally:
        os.close(r)
        os.close(w)
