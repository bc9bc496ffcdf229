"""The FUSE kernel protocol (``include/uapi/linux/fuse.h``, 7.x): opcodes, flags, struct
layouts, request decoding and reply encoding.

Everything here is pure (bytes in, bytes out) so that it is tested without a kernel. Layouts are
little-endian and native-aligned as the kernel lays them out on x86-64/arm64; each ``struct``
size is checked against the size fuse.h gives it (see ``SIZES``). A request that is too short
for what its opcode needs raises :class:`BadRequest`, never anything else.
"""

from __future__ import annotations

import enum
import os
import struct
from dataclasses import dataclass, field

from airfs.core.attrs import Attr

#: The newest protocol minor this transport speaks (kernel 6.18 offers 7.45).
KERNEL_VERSION = 7
KERNEL_MINOR = 45
#: The oldest minor accepted: 7.31 (Linux 5.4) added max_pages, cache_symlinks, explicit
#: invalidation; anything older is refused at INIT.
OLDEST_MINOR = 31


class Op(enum.IntEnum):
    """``enum fuse_opcode``."""

    LOOKUP = 1
    FORGET = 2
    GETATTR = 3
    SETATTR = 4
    READLINK = 5
    SYMLINK = 6
    MKNOD = 8
    MKDIR = 9
    UNLINK = 10
    RMDIR = 11
    RENAME = 12
    LINK = 13
    OPEN = 14
    READ = 15
    WRITE = 16
    STATFS = 17
    RELEASE = 18
    FSYNC = 20
    SETXATTR = 21
    GETXATTR = 22
    LISTXATTR = 23
    REMOVEXATTR = 24
    FLUSH = 25
    INIT = 26
    OPENDIR = 27
    READDIR = 28
    RELEASEDIR = 29
    FSYNCDIR = 30
    GETLK = 31
    SETLK = 32
    SETLKW = 33
    ACCESS = 34
    CREATE = 35
    INTERRUPT = 36
    BMAP = 37
    DESTROY = 38
    IOCTL = 39
    POLL = 40
    NOTIFY_REPLY = 41
    BATCH_FORGET = 42
    FALLOCATE = 43
    READDIRPLUS = 44
    RENAME2 = 45
    LSEEK = 46
    COPY_FILE_RANGE = 47
    SETUPMAPPING = 48
    REMOVEMAPPING = 49
    SYNCFS = 50
    TMPFILE = 51
    STATX = 52
    COPY_FILE_RANGE_64 = 53


class Init(enum.IntFlag):
    """INIT flags (``flags`` is bits 0-31, ``flags2`` bits 32-63)."""

    ASYNC_READ = 1 << 0
    POSIX_LOCKS = 1 << 1
    FILE_OPS = 1 << 2
    ATOMIC_O_TRUNC = 1 << 3
    EXPORT_SUPPORT = 1 << 4
    BIG_WRITES = 1 << 5
    DONT_MASK = 1 << 6
    SPLICE_WRITE = 1 << 7
    SPLICE_MOVE = 1 << 8
    SPLICE_READ = 1 << 9
    FLOCK_LOCKS = 1 << 10
    HAS_IOCTL_DIR = 1 << 11
    AUTO_INVAL_DATA = 1 << 12
    DO_READDIRPLUS = 1 << 13
    READDIRPLUS_AUTO = 1 << 14
    ASYNC_DIO = 1 << 15
    WRITEBACK_CACHE = 1 << 16
    NO_OPEN_SUPPORT = 1 << 17
    PARALLEL_DIROPS = 1 << 18
    HANDLE_KILLPRIV = 1 << 19
    POSIX_ACL = 1 << 20
    ABORT_ERROR = 1 << 21
    MAX_PAGES = 1 << 22
    CACHE_SYMLINKS = 1 << 23
    NO_OPENDIR_SUPPORT = 1 << 24
    EXPLICIT_INVAL_DATA = 1 << 25
    MAP_ALIGNMENT = 1 << 26
    SUBMOUNTS = 1 << 27
    HANDLE_KILLPRIV_V2 = 1 << 28
    SETXATTR_EXT = 1 << 29
    INIT_EXT = 1 << 30
    INIT_RESERVED = 1 << 31
    SECURITY_CTX = 1 << 32
    HAS_INODE_DAX = 1 << 33
    CREATE_SUPP_GROUP = 1 << 34
    HAS_EXPIRE_ONLY = 1 << 35
    DIRECT_IO_ALLOW_MMAP = 1 << 36
    PASSTHROUGH = 1 << 37
    NO_EXPORT_SUPPORT = 1 << 38
    HAS_RESEND = 1 << 39
    ALLOW_IDMAP = 1 << 40
    OVER_IO_URING = 1 << 41
    REQUEST_TIMEOUT = 1 << 42


# FOPEN_* (fuse_open_out.open_flags)
FOPEN_DIRECT_IO = 1 << 0
FOPEN_KEEP_CACHE = 1 << 1
FOPEN_NONSEEKABLE = 1 << 2
FOPEN_CACHE_DIR = 1 << 3
FOPEN_STREAM = 1 << 4
FOPEN_NOFLUSH = 1 << 5
FOPEN_PARALLEL_DIRECT_WRITES = 1 << 6
FOPEN_PASSTHROUGH = 1 << 7

# FATTR_* (fuse_setattr_in.valid)
FATTR_MODE = 1 << 0
FATTR_UID = 1 << 1
FATTR_GID = 1 << 2
FATTR_SIZE = 1 << 3
FATTR_ATIME = 1 << 4
FATTR_MTIME = 1 << 5
FATTR_FH = 1 << 6
FATTR_ATIME_NOW = 1 << 7
FATTR_MTIME_NOW = 1 << 8
FATTR_LOCKOWNER = 1 << 9
FATTR_CTIME = 1 << 10
FATTR_KILL_SUIDGID = 1 << 11

RENAME_NOREPLACE = 1 << 0
RENAME_EXCHANGE = 1 << 1

#: ``FUSE_DEV_IOC_BACKING_OPEN`` = _IOW(229, 1, struct fuse_backing_map) and ``..._CLOSE``.
FUSE_DEV_IOC_BACKING_OPEN = 0x4010E501
FUSE_DEV_IOC_BACKING_CLOSE = 0x4004E502

#: The kernel refuses a read of /dev/fuse into a smaller buffer.
FUSE_MIN_READ_BUFFER = 8192

# -- struct layouts ------------------------------------------------------------------------------

IN_HEADER = struct.Struct("<IIQQIIIHH")  # len opcode unique nodeid uid gid pid total_extlen pad
OUT_HEADER = struct.Struct("<IiQ")  # len error unique
_ATTR_FMT = "QQQQQQIIIIIIIIII"  # ino size blocks atime mtime ctime *nsec mode nlink uid gid
#                                 rdev blksize flags
ATTR = struct.Struct("<" + _ATTR_FMT)
ENTRY_OUT = struct.Struct("<QQQQII" + _ATTR_FMT)  # nodeid gen entry_valid attr_valid *_nsec attr
ATTR_OUT = struct.Struct("<QII" + _ATTR_FMT)  # attr_valid attr_valid_nsec dummy attr
GETATTR_IN = struct.Struct("<IIQ")  # getattr_flags dummy fh
SETATTR_IN = struct.Struct("<IIQQQQQQIIIIIIII")
OPEN_IN = struct.Struct("<II")  # flags open_flags
CREATE_IN = struct.Struct("<IIII")  # flags mode umask open_flags
OPEN_OUT = struct.Struct("<QIi")  # fh open_flags backing_id
RELEASE_IN = struct.Struct("<QIIQ")  # fh flags release_flags lock_owner
FLUSH_IN = struct.Struct("<QIIQ")  # fh unused padding lock_owner
READ_IN = struct.Struct("<QQIIQII")  # fh offset size read_flags lock_owner flags padding
WRITE_IN = struct.Struct("<QQIIQII")  # fh offset size write_flags lock_owner flags padding
WRITE_OUT = struct.Struct("<II")  # size padding
FSYNC_IN = struct.Struct("<QII")  # fh fsync_flags padding
MKDIR_IN = struct.Struct("<II")  # mode umask
MKNOD_IN = struct.Struct("<IIII")  # mode rdev umask padding
LINK_IN = struct.Struct("<Q")  # oldnodeid
RENAME_IN = struct.Struct("<Q")  # newdir
RENAME2_IN = struct.Struct("<QII")  # newdir flags padding
FORGET_IN = struct.Struct("<Q")  # nlookup
BATCH_FORGET_IN = struct.Struct("<II")  # count dummy
FORGET_ONE = struct.Struct("<QQ")  # nodeid nlookup
INTERRUPT_IN = struct.Struct("<Q")  # unique
GETXATTR_IN = struct.Struct("<II")  # size padding
GETXATTR_OUT = struct.Struct("<II")  # size padding
INIT_IN = struct.Struct("<IIIII44x")  # major minor max_readahead flags flags2 unused[11]
INIT_IN_OLD = struct.Struct("<IIII")  # before 7.36: no flags2
INIT_OUT = struct.Struct("<IIIIHHIIHHIIH22x")
KSTATFS = struct.Struct("<QQQQQIIII24x")  # blocks bfree bavail files ffree bsize namelen
#                                           frsize padding spare[6]
DIRENT = struct.Struct("<QQII")  # ino off namelen type
BACKING_MAP = struct.Struct("<iIQ")  # fd flags padding
NOTIFY_INVAL_INODE = struct.Struct("<Qqq")  # ino off len
NOTIFY_INVAL_ENTRY = struct.Struct("<QII")  # parent namelen flags

#: ``sizeof`` each struct per fuse.h (x86-64): checked at import and by the unit tests.
SIZES = {
    IN_HEADER: 40,
    OUT_HEADER: 16,
    ATTR: 88,
    ENTRY_OUT: 128,
    ATTR_OUT: 104,
    GETATTR_IN: 16,
    SETATTR_IN: 88,
    OPEN_IN: 8,
    CREATE_IN: 16,
    OPEN_OUT: 16,
    RELEASE_IN: 24,
    FLUSH_IN: 24,
    READ_IN: 40,
    WRITE_IN: 40,
    WRITE_OUT: 8,
    FSYNC_IN: 16,
    MKDIR_IN: 8,
    RENAME2_IN: 16,
    BATCH_FORGET_IN: 8,
    FORGET_ONE: 16,
    INIT_IN: 64,
    INIT_OUT: 64,
    KSTATFS: 80,
    DIRENT: 24,
    BACKING_MAP: 16,
    NOTIFY_INVAL_INODE: 24,
    NOTIFY_INVAL_ENTRY: 16,
}
for _s, _n in SIZES.items():
    if _s.size != _n:  # pragma: no cover - a layout typo must not ship
        raise AssertionError(f"struct {_s.format} is {_s.size} bytes, fuse.h says {_n}")

#: fuse_write_in was 24 bytes before 7.9; the init reply was 24 bytes before 7.23
FUSE_COMPAT_WRITE_IN_SIZE = 24
FUSE_COMPAT_22_INIT_OUT_SIZE = 24

# notification codes (fuse_out_header.error when unique == 0)
NOTIFY_INVAL_INODE_CODE = 2
NOTIFY_INVAL_ENTRY_CODE = 3
#: 7.40: the kernel queues again every request read from the device and not answered
NOTIFY_RESEND_CODE = 7


class BadRequest(ValueError):
    """A request too short or malformed for its opcode (answered with EINVAL or dropped)."""


@dataclass(slots=True)
class Request:
    """One request as read from /dev/fuse: the header's fields and the opcode's arguments
    (``body``, extensions already cut off)."""

    opcode: int
    unique: int
    nodeid: int
    uid: int
    gid: int
    pid: int
    body: bytes = field(repr=False)


def decode_request(buf: bytes) -> Request:
    """Split one read of /dev/fuse into header and body. Raises :class:`BadRequest` when the
    buffer is shorter than a header or than the length the header states."""
    if len(buf) < IN_HEADER.size:
        raise BadRequest(f"request of {len(buf)} bytes is shorter than its header")
    length, opcode, unique, nodeid, uid, gid, pid, extlen, _ = IN_HEADER.unpack_from(buf)
    if length < IN_HEADER.size or length > len(buf):
        raise BadRequest(f"header says {length} bytes, read {len(buf)}")
    end = length - extlen * 8
    if end < IN_HEADER.size:
        raise BadRequest(f"extensions ({extlen * 8} bytes) longer than the request")
    return Request(opcode, unique, nodeid, uid, gid, pid, bytes(buf[IN_HEADER.size : end]))


def unpack(s: struct.Struct, body: bytes, what: str = "") -> tuple[int, ...]:
    """``s.unpack_from(body)`` with :class:`BadRequest` for a short body."""
    if len(body) < s.size:
        raise BadRequest(f"{what or s.format}: {len(body)} bytes, need {s.size}")
    return s.unpack_from(body)


def names(body: bytes, count: int, offset: int = 0) -> list[str]:
    """``count`` NUL-terminated names starting at ``offset`` (file-system encoding)."""
    out: list[str] = []
    pos = offset
    for _ in range(count):
        end = body.find(b"\0", pos)
        if end < 0:
            raise BadRequest("name is not NUL-terminated")
        out.append(os.fsdecode(body[pos:end]))
        pos = end + 1
    return out


def name(body: bytes, offset: int = 0) -> str:
    return names(body, 1, offset)[0]


# -- replies -------------------------------------------------------------------------------------


def out_header(unique: int, error: int, payload_len: int) -> bytes:
    """``fuse_out_header``; ``error`` is 0 or a negative errno."""
    return OUT_HEADER.pack(OUT_HEADER.size + payload_len, error, unique)


def _split(seconds: float) -> tuple[int, int]:
    whole = int(seconds)
    return whole, int((seconds - whole) * 1e9)


def _attr_fields(a: Attr) -> tuple[int, ...]:
    asec, ansec = divmod(a.atime_ns, 1_000_000_000)
    msec, mnsec = divmod(a.mtime_ns, 1_000_000_000)
    csec, cnsec = divmod(a.ctime_ns, 1_000_000_000)
    return (a.ino, a.size, a.blocks, asec, msec, csec, ansec, mnsec, cnsec, a.mode, a.nlink,
            a.uid, a.gid, a.rdev & 0xFFFFFFFF, a.blksize, 0)  # fmt: skip


def entry_out(a: Attr, entry_ttl: float, attr_ttl: float) -> bytes:
    """``fuse_entry_out`` for a positive lookup (generation 0: inode numbers are not reused
    while the kernel knows them)."""
    es, ens = _split(entry_ttl)
    as_, ans = _split(attr_ttl)
    return ENTRY_OUT.pack(a.ino, 0, es, as_, ens, ans, *_attr_fields(a))


def negative_entry(ttl: float) -> bytes:
    """A lookup answer of node id 0: "no such name", cached by the kernel for ``ttl``."""
    s, ns = _split(ttl)
    return ENTRY_OUT.pack(0, 0, s, 0, ns, 0, *([0] * 16))


def attr_out(a: Attr, ttl: float) -> bytes:
    s, ns = _split(ttl)
    return ATTR_OUT.pack(s, ns, 0, *_attr_fields(a))


def open_out(fh: int, flags: int = 0, backing_id: int = 0) -> bytes:
    return OPEN_OUT.pack(fh, flags, backing_id)


def write_out(size: int) -> bytes:
    return WRITE_OUT.pack(size, 0)


def statfs_out(
    *, bsize: int, blocks: int, bfree: int, bavail: int, files: int, ffree: int, namelen: int
) -> bytes:
    return KSTATFS.pack(blocks, bfree, bavail, files, ffree, bsize, namelen, bsize, 0)


def _align8(n: int) -> int:
    return (n + 7) & ~7


def dirent(ino: int, next_off: int, name_b: bytes, mode: int) -> bytes:
    """One ``fuse_dirent`` (padded to 8 bytes)."""
    raw = DIRENT.pack(ino, next_off, len(name_b), (mode & 0o170000) >> 12) + name_b
    return raw + b"\0" * (_align8(len(raw)) - len(raw))


def direntplus(a: Attr, next_off: int, name_b: bytes, entry_ttl: float, attr_ttl: float) -> bytes:
    """One ``fuse_direntplus``: an entry (the kernel takes a lookup reference) + a dirent."""
    return entry_out(a, entry_ttl, attr_ttl) + dirent(a.ino, next_off, name_b, a.mode)


#: a ``fuse_entry_out`` of node id 0 (and no attributes)
_NO_ENTRY = ENTRY_OUT.pack(0, 0, 0, 0, 0, 0, *([0] * 16))


def direntplus_name(ino: int, next_off: int, name_b: bytes, mode: int) -> bytes:
    """A ``fuse_direntplus`` of the name alone: node id 0 tells the kernel that no entry nor
    attributes come with it (it takes no lookup reference; a later use of the name is a
    ``LOOKUP``); the dirent's ``ino`` and type are what ``getdents`` reports."""
    return _NO_ENTRY + dirent(ino, next_off, name_b, mode)


def inval_inode(ino: int, off: int = 0, length: int = 0) -> bytes:
    """Payload of FUSE_NOTIFY_INVAL_INODE (``length`` 0: from ``off`` to the end; negative
    ``off``: attributes only)."""
    return NOTIFY_INVAL_INODE.pack(ino, off, length)


#: ``fuse_notify_inval_entry_out.flags``: only expire the name (the kernel asks again at its
#: next use, keeping the inode), where the kernel offers ``HAS_EXPIRE_ONLY`` (Linux 6.2)
EXPIRE_ONLY = 1 << 0


def inval_entry(parent: int, name_b: bytes, flags: int = 0) -> bytes:
    return NOTIFY_INVAL_ENTRY.pack(parent, len(name_b), flags) + name_b + b"\0"
