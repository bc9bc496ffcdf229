"""What a mount is given and what is refused before it starts: :class:`MountConfig` (filled by
``airfs mount``, passed to the daemon as JSON), :class:`MountError` (a one-line reason for the
user), the daemon's :data:`UMASK`, and the cache-dir checks both the CLI and the daemon run.

No trio and no FUSE here: importing this module is cheap, and every function is synchronous.
"""

from __future__ import annotations

import dataclasses
import json
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from airfs.fuse import DEFAULT_TRANSPORT

T = TypeVar("T")


@dataclass
class MountConfig:
    """Everything a daemon needs; the CLI fills it and passes it as JSON."""

    mountpoint: str
    origin: str | None  # None: overlay the mountpoint in place
    cache_dir: str
    cache_size: int = 50 << 30
    min_free: int = 5 << 30
    staging_size: int = 100 << 30
    #: free space the staging files leave on the cache filesystem (None: 3% of it, at most
    #: 512 MiB: :func:`airfs.writeback.space.default_min_free`; 0: no floor)
    staging_min_free: int | None = None
    ttl: float = 1.0
    #: names and versions trusted until ``airfs refresh`` or the next mount
    immutable: bool = False
    log_file: str | None = None
    allow_other: bool | None = None
    s3_endpoint: str | None = None
    s3_region: str | None = None
    s3_path_style: bool | None = None
    #: mode of S3 objects written by other tools (None: the origin's default, 0o644)
    s3_default_mode: int | None = None
    #: False: S3 listings show unseen objects with the default mode (no HEAD per object)
    s3_list_heads: bool = True
    #: the S3 stall deadline in seconds (None: the origin's default, 10): first byte, idle
    s3_timeout: float | None = None
    drain_timeout: float = 3600.0
    read_ahead_kb: int = 1024
    debug: bool = False
    no_cache: bool = False
    write_wait: float = 30.0
    #: seconds from a file's close to the start of its commit (a barrier commits at once):
    #: the rename of an atomic write, or the unlink of a scratch file, then stays local
    commit_delay: float = 0.5
    #: let ``mknod`` create device nodes (they still cannot be opened: the mount is nodev)
    allow_devices: bool = False
    #: a damaged block-cache index is moved aside (the cache starts empty) instead of refused
    rebuild_cache: bool = False
    #: benchmarking/testing: emulate a remote origin (seconds per request, bytes/s)
    emulate_latency: float = 0.0
    emulate_bandwidth: int | None = None
    #: with ``emulate_latency``: a read pays it once per this many bytes, in a row (NFS rsize)
    emulate_request_size: int | None = None
    #: how requests reach the core: "pyfuse3" (libfuse) or "kernel" (airfs's own transport)
    fuse: str = DEFAULT_TRANSPORT
    #: kernel transport: FUSE passthrough of local bytes when the kernel and CAP_SYS_ADMIN allow
    passthrough: bool = True
    #: kernel transport, with passthrough: drop the page cache behind sequential readers of
    #: files the daemon serves (:mod:`airfs.fuse.kernel.dropbehind`)
    drop_behind: bool = True
    #: rebuild a lost or damaged journal from the staging files' own records
    rebuild_journal: bool = False
    #: serve Prometheus metrics on ``[ADDR:]PORT`` (None: off)
    metrics: str | None = None

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> MountConfig:
        return cls(**json.loads(text))


class MountError(Exception):
    """A mount cannot start; the message is the one line shown to the user."""


#: the daemon's umask: everything it creates under the cache dir (blocks, index, staging,
#: journal, conflicts, recovered files, the log) is 0600, directories 0700
UMASK = 0o077


def prepare_cache_dir(path: str) -> None:
    """Create the cache dir (mode 0700), or check an existing one: it must be a directory
    owned by this user that no other user can enter (it holds copies of files and their
    paths). An empty directory that others could enter is closed (0700); a non-empty one is
    refused. Raises :class:`MountError` with a one-line reason."""
    uid = os.geteuid()
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, 0o755, exist_ok=True)
    try:
        os.mkdir(path, 0o700)
        os.chmod(path, 0o700)
        return
    except FileExistsError:
        pass
    except OSError as exc:
        raise MountError(f"cannot create cache dir {path}: {exc.strerror or exc}") from None
    try:
        st = os.stat(path)
    except OSError as exc:
        raise MountError(f"cache dir {path}: {exc.strerror or exc}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise MountError(f"cache dir {path} is not a directory")
    if st.st_uid != uid:
        raise MountError(
            f"cache dir {path} belongs to uid {st.st_uid}, not to the mounting user (uid {uid})"
        )
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o077:
        if not os.listdir(path):
            os.chmod(path, 0o700)
            return
        raise MountError(
            f"cache dir {path} is open to other users (mode {mode:o}): they could read the "
            f"cached files and their paths; run chmod 700 {path} first, or use a new cache dir"
        )


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def check_cache_dir(cache_dir: str, mountpoint: str, origin: str | None) -> str | None:
    """The reason ``cache_dir`` cannot serve a mount of ``origin`` on ``mountpoint``, or None.

    Refused: a cache dir that exists and is not a directory, and one at or under the
    mountpoint (including an overlaid one: the daemon would write into its own mount and
    deadlock) or under a directory origin (its files would show up in the mount)."""
    real = os.path.realpath(cache_dir)
    if os.path.lexists(cache_dir) and not os.path.isdir(cache_dir):
        return f"cache dir {cache_dir} is not a directory"
    if _inside(real, os.path.realpath(mountpoint)):
        return (
            f"cache dir {cache_dir} is on the mount at {mountpoint} (the daemon would write "
            "into its own mount); choose a --cache-dir outside it"
        )
    if origin is not None and "://" not in origin and _inside(real, os.path.realpath(origin)):
        return (
            f"cache dir {cache_dir} is inside the origin {origin}; choose a --cache-dir outside it"
        )
    return None


def pop_option(args: list[str], name: str) -> str | None:
    """Remove ``name VALUE`` from ``args`` (a daemon's or holder's internal command line, made
    by ``airfs mount``) and return VALUE; None when ``name`` is absent."""
    if name not in args:
        return None
    i = args.index(name)
    value = args[i + 1]
    del args[i : i + 2]
    return value


def env_setting(
    name: str,
    default: T,
    parse: Callable[[str], T],
    what: str,
    valid: Callable[[T], bool],
    rule: str,
) -> T:
    """The daemon's setting in environment variable ``name``: ``default`` when unset, else its
    value read by ``parse``. Raises ValueError naming the variable and its value, then ``what``
    it should be when ``parse`` fails, or ``rule`` when ``valid`` refuses the value."""
    raw = os.environ.get(name)
    if raw is None:
        return default
    try:
        value = parse(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r}: not {what}") from None
    if not valid(value):
        raise ValueError(f"{name}={raw!r}: {rule}")
    return value
