"""The kernel transport without a kernel: struct layouts against the offsets in
``include/uapi/linux/fuse.h``, INIT negotiation across minors, and the request loop driven over
a SOCK_SEQPACKET socket pair (which keeps message boundaries, as /dev/fuse does) in front of a
real core over an in-memory origin."""

from __future__ import annotations

import errno
import os
import socket
import stat
import struct
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio

from airfs.core.attrs import BLKSIZE, Attr
from airfs.core.inodes import ROOT_INO
from airfs.daemon.build import build
from airfs.fuse.kernel import proto
from airfs.fuse.kernel.interrupts import caller_dying
from airfs.fuse.kernel.negotiate import InitError, InitIn, negotiate, read_buffer_size
from airfs.fuse.kernel.proto import BadRequest, Init, Op
from airfs.fuse.kernel.session import Session
from airfs.testing.memory import MemoryOrigin


def u32(b: bytes, off: int) -> int:
    return int.from_bytes(b[off : off + 4], "little")


def u64(b: bytes, off: int) -> int:
    return int.from_bytes(b[off : off + 8], "little")


def u16(b: bytes, off: int) -> int:
    return int.from_bytes(b[off : off + 2], "little")


def header(length: int, opcode: int, unique: int, nodeid: int, extlen: int = 0) -> bytes:
    """fuse_in_header laid out by hand: len@0 opcode@4 unique@8 nodeid@16 uid@24 gid@28
    pid@32 total_extlen@36 padding@38."""
    return (
        length.to_bytes(4, "little")
        + opcode.to_bytes(4, "little")
        + unique.to_bytes(8, "little")
        + nodeid.to_bytes(8, "little")
        + (1000).to_bytes(4, "little")
        + (1001).to_bytes(4, "little")
        + (4242).to_bytes(4, "little")
        + extlen.to_bytes(2, "little")
        + b"\0\0"
    )


def request(opcode: int, unique: int, nodeid: int, body: bytes = b"") -> bytes:
    return header(40 + len(body), opcode, unique, nodeid) + body


ATTR = Attr(ino=7, mode=stat.S_IFREG | 0o640, size=12345, mtime_ns=1_700_000_000_123_456_789,
            uid=1000, gid=1001)  # fmt: skip


# -- layouts ---------------------------------------------------------------------------------


def test_struct_sizes_match_fuse_h() -> None:
    for s, size in proto.SIZES.items():
        assert s.size == size, s.format
    assert proto.IN_HEADER.size == 40 and proto.OUT_HEADER.size == 16
    assert proto.ENTRY_OUT.size == 128 and proto.INIT_OUT.size == 64


def test_decode_request_fields_and_extensions() -> None:
    raw = request(Op.LOOKUP, 99, 1, b"name\0")
    req = proto.decode_request(raw)
    assert (req.opcode, req.unique, req.nodeid) == (Op.LOOKUP, 99, 1)
    assert (req.uid, req.gid, req.pid) == (1000, 1001, 4242)
    assert proto.name(req.body) == "name"
    # an 8-byte extension after the body is cut off
    body = b"name\0\0\0\0"
    raw = header(40 + len(body) + 8, Op.LOOKUP, 5, 1, extlen=1) + body + b"E" * 8
    assert proto.decode_request(raw).body == body


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"\x28\0\0\0",
        header(40, Op.GETATTR, 1, 1)[:39],
        header(100, Op.GETATTR, 1, 1),  # says 100, is 40
        header(39, Op.GETATTR, 1, 1),  # shorter than a header
        header(48, Op.LOOKUP, 1, 1, extlen=2) + b"x" * 8,  # extensions beyond the end
    ],
)
def test_garbled_requests_are_bad_requests(raw: bytes) -> None:
    with pytest.raises(BadRequest):
        proto.decode_request(raw)


def test_names_need_their_nul() -> None:
    assert proto.names(b"old\0new\0", 2) == ["old", "new"]
    with pytest.raises(BadRequest):
        proto.names(b"old\0new", 2)
    with pytest.raises(BadRequest):
        proto.unpack(proto.READ_IN, b"\0" * 39, "READ")


def test_entry_out_layout() -> None:
    b = proto.entry_out(ATTR, 1.5, 2.25)
    assert len(b) == 128
    assert u64(b, 0) == 7 and u64(b, 8) == 0  # nodeid, generation
    assert u64(b, 16) == 1 and u64(b, 24) == 2  # entry_valid, attr_valid
    assert u32(b, 32) == 500_000_000 and u32(b, 36) == 250_000_000
    a = 40  # struct fuse_attr
    assert u64(b, a) == 7 and u64(b, a + 8) == 12345 and u64(b, a + 16) == (12345 + 511) // 512
    assert u64(b, a + 32) == 1_700_000_000  # mtime
    assert u32(b, a + 52) == 123_456_789  # mtimensec
    assert u32(b, a + 60) == stat.S_IFREG | 0o640  # mode
    assert u32(b, a + 64) == 1 and u32(b, a + 68) == 1000 and u32(b, a + 72) == 1001
    assert u32(b, a + 80) == BLKSIZE


def test_negative_entry_and_attr_out() -> None:
    n = proto.negative_entry(1.0)
    assert u64(n, 0) == 0 and u64(n, 16) == 1 and len(n) == 128
    b = proto.attr_out(ATTR, 0.5)
    assert len(b) == 104 and u64(b, 0) == 0 and u32(b, 8) == 500_000_000
    assert u64(b, 16) == 7 and u32(b, 16 + 60) == ATTR.mode


def test_open_write_statfs_layouts() -> None:
    o = proto.open_out(0x1122334455, proto.FOPEN_KEEP_CACHE | proto.FOPEN_NOFLUSH, -3)
    assert u64(o, 0) == 0x1122334455 and u32(o, 8) == (1 << 1) | (1 << 5)
    assert struct.unpack_from("<i", o, 12)[0] == -3
    assert proto.write_out(4096) == (4096).to_bytes(4, "little") + b"\0" * 4
    s = proto.statfs_out(bsize=4096, blocks=10, bfree=4, bavail=3, files=9, ffree=8, namelen=255)
    assert len(s) == 80 and u64(s, 0) == 10 and u64(s, 16) == 3 and u32(s, 40) == 4096
    assert u32(s, 44) == 255 and u32(s, 48) == 4096


def test_dirent_layout_and_padding() -> None:
    d = proto.dirent(7, 3, b"abc", stat.S_IFDIR | 0o755)
    assert len(d) == 32  # 24 + 3, padded to 8
    assert u64(d, 0) == 7 and u64(d, 8) == 3 and u32(d, 16) == 3 and u32(d, 20) == 4  # DT_DIR
    assert d[24:27] == b"abc" and d[27:] == b"\0" * 5
    p = proto.direntplus(ATTR, 2, b"abcdefgh", 1.0, 1.0)
    assert len(p) == 128 + 32 and u32(p, 128 + 20) == 8  # DT_REG


def test_notify_layouts() -> None:
    assert proto.inval_inode(5, -1, 0) == struct.pack("<Qqq", 5, -1, 0)
    e = proto.inval_entry(1, b"x")
    assert u64(e, 0) == 1 and u32(e, 8) == 1 and e[16:] == b"x\0"


# -- INIT ------------------------------------------------------------------------------------


def init_in(minor: int, flags: int, readahead: int = 128 << 10) -> bytes:
    """fuse_init_in: major@0 minor@4 max_readahead@8 flags@12 flags2@16 (7.36+) unused."""
    b = struct.pack("<IIII", 7, minor, readahead, flags & 0xFFFFFFFF)
    if minor >= 36:
        b += struct.pack("<I", flags >> 32) + b"\0" * 44
    return b


ALL = (1 << 43) - 1


def test_init_7_45_with_passthrough() -> None:
    reply, neg = negotiate(InitIn.decode(init_in(45, ALL)), pages_limit=256, passthrough=True)
    assert len(reply) == 64
    assert u32(reply, 0) == 7 and u32(reply, 4) == 45 and u32(reply, 8) == 128 << 10
    flags = u32(reply, 12)
    for f in (Init.ASYNC_READ, Init.DO_READDIRPLUS, Init.PARALLEL_DIROPS, Init.MAX_PAGES,
              Init.CACHE_SYMLINKS, Init.INIT_EXT, Init.ATOMIC_O_TRUNC):  # fmt: skip
        assert flags & f, f.name
    assert not flags & Init.WRITEBACK_CACHE and not flags & Init.READDIRPLUS_AUTO
    assert u16(reply, 16) == 64 and u16(reply, 18) == 48  # max_background, congestion
    assert u32(reply, 20) == 1 << 20  # max_write
    assert u32(reply, 24) == 1  # time_gran
    assert u16(reply, 28) == 256  # max_pages
    assert u32(reply, 32) == 1 << 5  # flags2: PASSTHROUGH (bit 37)
    assert u32(reply, 36) == 1  # max_stack_depth
    assert neg.passthrough and neg.protocol == "7.45" and "PASSTHROUGH" in neg.flags


def test_init_without_cap_sys_admin_asks_no_passthrough() -> None:
    reply, neg = negotiate(InitIn.decode(init_in(45, ALL)), pages_limit=64)
    assert u32(reply, 32) == 0 and u32(reply, 36) == 0 and not neg.passthrough
    assert u32(reply, 20) == 64 * 4096 and u16(reply, 28) == 64


def test_init_newer_kernel_gets_our_minor() -> None:
    reply, neg = negotiate(InitIn.decode(init_in(52, ALL)))
    assert u32(reply, 4) == proto.KERNEL_MINOR and neg.protocol == f"7.{proto.KERNEL_MINOR}"


def test_init_older_minor_without_init_ext() -> None:
    offered = int(Init.ASYNC_READ | Init.MAX_PAGES | Init.DO_READDIRPLUS | Init.BIG_WRITES)
    reply, neg = negotiate(InitIn.decode(init_in(31, offered)))
    assert u32(reply, 4) == 31 and u32(reply, 32) == 0
    assert u32(reply, 12) == offered  # only what was offered, nothing of flags2
    assert "INIT_EXT" not in neg.flags


@pytest.mark.parametrize(("major", "minor"), [(7, 30), (8, 0), (6, 45)])
def test_init_refuses_unsupported_protocols(major: int, minor: int) -> None:
    with pytest.raises(InitError) as info:
        negotiate(InitIn(major, minor, 0, ALL))
    assert info.value.errno == errno.EPROTO


def test_init_short_body() -> None:
    with pytest.raises(BadRequest):
        InitIn.decode(b"\7\0\0\0")


# -- the request loop over a socket pair -------------------------------------------------------


class Kernel:
    """The kernel's end of the socket pair: send requests, read replies."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.unique = 100

    async def call(
        self, opcode: int, nodeid: int = ROOT_INO, body: bytes = b""
    ) -> tuple[int, bytes]:
        self.unique += 1
        self.sock.send(request(opcode, self.unique, nodeid, body))
        return await self.reply(self.unique)

    async def reply(self, unique: int) -> tuple[int, bytes]:
        with trio.fail_after(10):
            while True:
                try:
                    data = self.sock.recv(1 << 21)
                    break
                except BlockingIOError:
                    await trio.sleep(0.001)
        length, error, got = proto.OUT_HEADER.unpack_from(data)
        assert got == unique and length == len(data)
        return error, data[16:]

    def send_raw(self, raw: bytes) -> None:
        self.sock.send(raw)

    def nothing_pending(self) -> bool:
        try:
            self.sock.recv(1 << 16, socket.MSG_PEEK)
        except BlockingIOError:
            return True
        return False


@asynccontextmanager
async def served(
    tmp_path: Path, dying: Callable[[int], bool] = lambda tid: False
) -> AsyncIterator[tuple[Kernel, MemoryOrigin, Session]]:
    mem = MemoryOrigin()
    mem.put_bytes("hello.txt", b"hello world")
    mem.mkdir("sub")
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    theirs.setblocking(False)
    inits = []
    try:
        async with (
            build(mem, str(tmp_path / "cache"), ttl=5.0, attempts=1, upload=False) as b,
            trio.open_nursery() as nursery,
        ):
            session = Session(
                ours.fileno(), b.fs, 5.0, on_init=inits.append, pages_limit=32, dying=dying
            )
            nursery.start_soon(session.run)
            k = Kernel(theirs)
            err, out = await k.call(Op.INIT, 0, init_in(45, ALL))
            assert err == 0 and u32(out, 4) == 45 and len(inits) == 1
            yield k, mem, session
            session.stop()
    finally:
        ours.close()
        theirs.close()


async def test_lookup_getattr_read_over_the_loop(tmp_path: Path) -> None:
    async with served(tmp_path) as (k, _mem, session):
        err, out = await k.call(Op.LOOKUP, ROOT_INO, b"hello.txt\0")
        assert err == 0 and u64(out, 40 + 8) == 11
        ino = u64(out, 0)
        err, out = await k.call(Op.GETATTR, ino, struct.pack("<IIQ", 0, 0, 0))
        assert err == 0 and u64(out, 16 + 8) == 11
        err, out = await k.call(Op.OPEN, ino, struct.pack("<II", os.O_RDONLY, 0))
        assert err == 0 and u32(out, 8) & proto.FOPEN_NOFLUSH
        fh = u64(out, 0)
        err, data = await k.call(Op.READ, ino, proto.READ_IN.pack(fh, 6, 100, 0, 0, 0, 0))
        assert (err, data) == (0, b"world")
        err, _ = await k.call(Op.RELEASE, ino, proto.RELEASE_IN.pack(fh, 0, 0, 0))
        assert err == 0
        err, out = await k.call(Op.LOOKUP, ROOT_INO, b"missing\0")
        assert err == 0 and u64(out, 0) == 0 and u64(out, 16) == 5  # negative entry, TTL 5 s
        assert session.statistics().requests >= 7


async def test_create_write_readdirplus(tmp_path: Path) -> None:
    async with served(tmp_path) as (k, mem, _session):
        err, out = await k.call(
            Op.CREATE, ROOT_INO, proto.CREATE_IN.pack(os.O_WRONLY, 0o644, 0o022, 0) + b"new\0"
        )
        assert err == 0 and len(out) == 128 + 16
        ino, fh = u64(out, 0), u64(out, 128)
        data = b"x" * 5000
        body = proto.WRITE_IN.pack(fh, 0, len(data), 0, 0, 0, 0) + data
        err, out = await k.call(Op.WRITE, ino, body)
        assert err == 0 and u32(out, 0) == 5000
        assert (await k.call(Op.FLUSH, ino, proto.FLUSH_IN.pack(fh, 0, 0, 0)))[0] == 0
        assert (await k.call(Op.RELEASE, ino, proto.RELEASE_IN.pack(fh, 0, 0, 0)))[0] == 0
        err, out = await k.call(Op.OPENDIR, ROOT_INO, struct.pack("<II", 0, 0))
        dfh = u64(out, 0)
        err, out = await k.call(
            Op.READDIRPLUS, ROOT_INO, proto.READ_IN.pack(dfh, 0, 4096, 0, 0, 0, 0)
        )
        assert err == 0
        names, off = [], 0
        while off < len(out):
            namelen = u32(out, off + 128 + 16)
            names.append(out[off + 128 + 24 : off + 128 + 24 + namelen].decode())
            off += (128 + 24 + namelen + 7) & ~7
        assert sorted(names) == ["hello.txt", "new", "sub"]
        # a buffer too small for even one entry gets an empty reply, not an overrun
        err, out = await k.call(
            Op.READDIRPLUS, ROOT_INO, proto.READ_IN.pack(dfh, 0, 100, 0, 0, 0, 0)
        )
        assert (err, out) == (0, b"")
        assert (await k.call(Op.RELEASEDIR, ROOT_INO, proto.RELEASE_IN.pack(dfh, 0, 0, 0)))[0] == 0
        assert mem.stat("sub") is not None


async def test_unknown_and_garbled_requests_do_not_stop_the_loop(tmp_path: Path) -> None:
    async with served(tmp_path) as (k, _mem, session):
        assert (await k.call(999))[0] == -errno.ENOSYS
        assert (await k.call(Op.LSEEK, 1, b"\0" * 24))[0] == -errno.ENOSYS
        assert (await k.call(Op.READ, 1, b"\0" * 10))[0] == -errno.EINVAL  # short read_in
        assert (await k.call(Op.LOOKUP, 1, b"no-nul"))[0] == -errno.EINVAL
        assert (await k.call(Op.READ, 1, proto.READ_IN.pack(77, 0, 10, 0, 0, 0, 0)))[
            0
        ] == -errno.EBADF
        # a header that lies about its length gets EINVAL for its unique
        k.send_raw(header(400, Op.GETATTR, 555, 1))
        assert (await k.reply(555))[0] == -errno.EINVAL
        # shorter than a header: dropped (no unique to answer)
        k.send_raw(b"\1\2\3")
        # FORGET takes no reply; INTERRUPT of a finished request neither
        k.send_raw(request(Op.FORGET, 600, 5, struct.pack("<Q", 1)))
        k.send_raw(request(Op.BATCH_FORGET, 601, 0, struct.pack("<IIQQ", 1, 0, 5, 1)))
        k.send_raw(request(Op.INTERRUPT, 602, 0, struct.pack("<Q", 101)))
        err, out = await k.call(Op.STATFS, 1)
        assert err == 0 and len(out) == 80
        assert session.statistics().errors >= 3


async def test_interrupt_gives_up_a_waiting_request_only_for_a_dying_caller(
    tmp_path: Path,
) -> None:
    # no uploader runs here: an fsync of a written file waits for a commit that never comes
    killed: set[int] = set()
    async with served(tmp_path, dying=killed.__contains__) as (k, _mem, session):
        err, out = await k.call(
            Op.CREATE, ROOT_INO, proto.CREATE_IN.pack(os.O_WRONLY, 0o644, 0, 0) + b"f\0"
        )
        assert err == 0
        ino, fh = u64(out, 0), u64(out, 128)
        body = proto.WRITE_IN.pack(fh, 0, 3, 0, 0, 0, 0) + b"abc"
        assert (await k.call(Op.WRITE, ino, body))[0] == 0
        tasks = session.statistics().tasks
        k.unique += 1
        target = k.unique
        k.send_raw(request(Op.FSYNC, target, ino, proto.FSYNC_IN.pack(fh, 0, 0)))
        # other requests are served while it waits
        assert (await k.call(Op.STATFS, 1))[0] == 0
        assert k.nothing_pending() and session.statistics().tasks > tasks
        # a signal its caller handles (SIGCHLD, SIGUSR1...): counted, the request goes on
        k.send_raw(request(Op.INTERRUPT, 998, 0, struct.pack("<Q", target)))
        assert (await k.call(Op.STATFS, 1))[0] == 0
        assert k.nothing_pending()
        assert session.statistics().interrupts_ignored == 1
        assert session.statistics().interrupts == 0
        # its caller (pid 4242 in the header) is being killed: the request is given up
        killed.add(4242)
        k.send_raw(request(Op.INTERRUPT, 999, 0, struct.pack("<Q", target)))
        assert (await k.reply(target))[0] == -errno.EINTR
        assert session.statistics().interrupts == 1
        assert (await k.call(Op.RELEASE, ino, proto.RELEASE_IN.pack(fh, 0, 0, 0)))[0] == 0


async def test_unmount_ends_the_loop(tmp_path: Path) -> None:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        async with build(MemoryOrigin(), str(tmp_path / "cache"), attempts=1) as b:
            session = Session(ours.fileno(), b.fs, 1.0)
            theirs.close()  # the peer going away reads as end of file
            with trio.fail_after(5):
                await session.run()
    finally:
        ours.close()


def test_read_buffer_fits_the_largest_write() -> None:
    assert read_buffer_size(256) >= 40 + 40 + (256 << 12)
    assert read_buffer_size(1) >= proto.FUSE_MIN_READ_BUFFER


def test_caller_dying_reads_the_pending_signals() -> None:
    assert not caller_dying(os.getpid())  # alive, nothing fatal pending
    assert not caller_dying(0)  # outside the daemon's pid namespace: cannot tell
    gone = 2**22 + 12345  # above pid_max's default ceiling: no such thread
    assert caller_dying(gone)
