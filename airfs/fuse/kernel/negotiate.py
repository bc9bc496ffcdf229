"""INIT negotiation: what to ask of the kernel, and what the kernel granted.

:func:`negotiate` takes the kernel's ``fuse_init_in`` and returns the reply bytes and a
:class:`Negotiated` record (shown by ``airfs status`` under ``fuse``). Pure: tested with the
byte layouts of every minor from :data:`~.proto.OLDEST_MINOR` to :data:`~.proto.KERNEL_MINOR`.
"""

from __future__ import annotations

import errno
from dataclasses import asdict, dataclass, field
from typing import Any

from . import proto
from .proto import Init

PAGE = 4096
#: FUSE_MAX_MAX_PAGES before the max_pages_limit sysctl existed
DEFAULT_MAX_PAGES = 256

#: What airfs asks for when the kernel offers it. Not WRITEBACK_CACHE (close must see every
#: byte, and passthrough refuses it), not POSIX/FLOCK locks (the kernel keeps them locally),
#: not READDIRPLUS_AUTO (the core counts a lookup for every entry it emits: always plus).
WANTED = (
    Init.ASYNC_READ
    | Init.ATOMIC_O_TRUNC
    | Init.BIG_WRITES
    | Init.AUTO_INVAL_DATA
    | Init.DO_READDIRPLUS
    | Init.ASYNC_DIO
    | Init.PARALLEL_DIROPS
    | Init.MAX_PAGES
    | Init.CACHE_SYMLINKS
    | Init.INIT_EXT
)


class InitError(Exception):
    """The kernel's protocol cannot be served; ``errno`` is the error to answer INIT with."""

    def __init__(self, code: int, msg: str) -> None:
        super().__init__(msg)
        self.errno = code


@dataclass(frozen=True, slots=True)
class InitIn:
    major: int
    minor: int
    max_readahead: int
    flags: int  # flags | flags2 << 32

    @classmethod
    def decode(cls, body: bytes) -> InitIn:
        if len(body) < proto.INIT_IN_OLD.size:
            raise proto.BadRequest(f"INIT: {len(body)} bytes")
        major, minor, ra, flags = proto.INIT_IN_OLD.unpack_from(body)
        if flags & Init.INIT_EXT and len(body) >= proto.INIT_IN.size:
            flags |= proto.INIT_IN.unpack_from(body)[4] << 32
        return cls(major, minor, ra, flags)


@dataclass(frozen=True, slots=True)
class Negotiated:
    """What this mount runs with (JSON-ready through :meth:`as_dict`)."""

    protocol: str
    flags: list[str] = field(default_factory=list)
    max_write: int = 0
    max_pages: int = 0
    max_readahead: int = 0
    max_background: int = 0
    passthrough: bool = False
    offered: list[str] = field(default_factory=list)

    def has(self, flag: Init) -> bool:
        return flag.name in self.flags

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["transport"] = "kernel"
        del out["offered"]
        return out


def _names(bits: int) -> list[str]:
    return [f.name for f in Init if f.name and bits & f]


def max_pages_limit(path: str = "/proc/sys/fs/fuse/max_pages_limit") -> int:
    """The kernel's cap on pages per request (256 where the sysctl does not exist)."""
    try:
        with open(path, encoding="ascii") as f:
            return max(1, int(f.read().strip()))
    except (OSError, ValueError):
        return DEFAULT_MAX_PAGES


def negotiate(
    init: InitIn,
    *,
    pages_limit: int = DEFAULT_MAX_PAGES,
    passthrough: bool = False,
    max_background: int = 64,
) -> tuple[bytes, Negotiated]:
    """The INIT reply payload for ``init`` and what it grants.

    Asks for :data:`WANTED` (and ``PASSTHROUGH`` when ``passthrough``, i.e. the daemon has
    CAP_SYS_ADMIN) intersected with what the kernel offers; requests up to ``pages_limit``
    pages. Raises :class:`InitError` for a major version other than 7 or a minor older than
    :data:`~.proto.OLDEST_MINOR`.
    """
    if init.major != proto.KERNEL_VERSION:
        raise InitError(errno.EPROTO, f"kernel speaks FUSE {init.major}.{init.minor}, need 7.x")
    if init.minor < proto.OLDEST_MINOR:
        raise InitError(
            errno.EPROTO,
            f"kernel speaks FUSE 7.{init.minor}; the kernel transport needs 7.{proto.OLDEST_MINOR}"
            " or newer (use --fuse pyfuse3)",
        )
    minor = min(init.minor, proto.KERNEL_MINOR)
    wanted = int(WANTED) | (int(Init.PASSTHROUGH) if passthrough else 0)
    granted = init.flags & wanted
    if not init.flags & Init.INIT_EXT:
        granted &= 0xFFFFFFFF
    pages = max(1, min(pages_limit, 0xFFFF)) if granted & Init.MAX_PAGES else 32
    max_write = pages * PAGE
    bg = min(max_background, 0xFFFF)
    stack_depth = 1 if granted & Init.PASSTHROUGH else 0
    reply = proto.INIT_OUT.pack(
        proto.KERNEL_VERSION,
        minor,
        init.max_readahead,
        granted & 0xFFFFFFFF,
        bg,
        bg * 3 // 4,
        max_write,
        1,  # time_gran: nanoseconds
        pages if granted & Init.MAX_PAGES else 0,
        0,  # map_alignment (DAX only)
        granted >> 32,
        stack_depth,
        0,  # request_timeout: none
    )
    neg = Negotiated(
        protocol=f"7.{minor}",
        flags=_names(granted),
        max_write=max_write,
        max_pages=pages,
        max_readahead=init.max_readahead,
        max_background=bg,
        passthrough=bool(granted & Init.PASSTHROUGH),
        offered=_names(init.flags),
    )
    return reply, neg


def read_buffer_size(pages_limit: int) -> int:
    """A /dev/fuse read buffer that fits the largest WRITE the kernel may send."""
    return max(proto.FUSE_MIN_READ_BUFFER, pages_limit * PAGE + PAGE)
