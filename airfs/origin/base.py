"""The origin interface: what airfs puts its cache in front of.

An origin is a tree of objects addressed by relative POSIX-style paths (``""`` is the root,
``"a/b.bin"`` a file two levels down; never a leading or trailing slash). It has object-store
semantics so that a directory and an S3-compatible bucket fit behind one interface:

* every object has a *version tag* (S3: the ETag; POSIX: inode, size and mtime_ns). A changed
  object has a new tag, which is what keeps cached bytes from ever being served stale;
* :meth:`Origin.put` is atomic: a reader sees the old object or the whole new one, never a mix;
* errors are typed (:class:`NotFound`, :class:`Exists`, ...), each carrying the errno the
  filesystem returns for it; :class:`Transient` errors may be retried (by
  :meth:`airfs.origin.aio.AsyncOrigin.call`, the one retry policy).

Implementations are *synchronous* and thread-safe: the filesystem core calls them from worker
threads (``trio.to_thread.run_sync`` with a ``CapacityLimiter``), never on the trio loop.
"""

from __future__ import annotations

import enum
import errno
import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol, TypeVar, runtime_checkable

log = logging.getLogger(__name__)


class Kind(enum.Enum):
    """What an origin entry is."""

    FILE = "file"
    DIR = "dir"
    SYMLINK = "symlink"
    #: special files (only where ``Capabilities.special_files``): named pipes, sockets and,
    #: when the mount allows them, device nodes
    FIFO = "fifo"
    SOCKET = "socket"
    CHAR = "char"
    BLOCK = "block"


#: the kinds ``Origin.mknod`` creates
SPECIAL_KINDS = frozenset({Kind.FIFO, Kind.SOCKET, Kind.CHAR, Kind.BLOCK})


@dataclass(frozen=True, slots=True)
class Entry:
    """One object (or directory) of an origin, as :meth:`Origin.stat` and :meth:`Origin.list`
    report it.

    ``name`` is the last path component (``""`` for the root). ``version`` identifies the
    content: equal versions mean equal bytes. Directories have version ``""``. ``mode`` holds
    permission bits (with setuid/setgid/sticky), no file-type bits.

    ``uid``/``gid`` are None where the origin keeps no owner for this object (the mount's
    default owner applies). ``nlink`` counts the names of a file (POSIX hard links; 1 on object
    stores); directories report the origin's count or 2. ``atime_ns``/``ctime_ns`` are None
    where the origin keeps none (the mount reports ``mtime_ns``). ``rdev`` is the device
    number of a device node. ``ino`` identifies the file at the origin where it has such
    numbers (0 elsewhere): names with the same ``ino`` are hard links of one file.
    ``blocks`` is the 512-byte blocks the origin has allocated for it (POSIX ``st_blocks``:
    a sparse file's holes take none); None where the origin does not say (object stores: the
    mount reports the size rounded up).

    ``guessed``: the attributes (mode, owner, times; and a directory's link count) are
    defaults, not the origin's: an entry of a bare listing (``Capabilities.bare_lists``) whose
    stored attributes the origin did not ask. Its name, kind, size and version are right.
    """

    name: str
    kind: Kind
    size: int
    mtime_ns: int
    mode: int
    version: str
    uid: int | None = None
    gid: int | None = None
    nlink: int = 1
    atime_ns: int | None = None
    ctime_ns: int | None = None
    rdev: int = 0
    ino: int = 0
    blocks: int | None = None
    guessed: bool = False


@dataclass(frozen=True, slots=True)
class FsStats:
    """Capacity figures for ``statfs``; an origin with no limit reports large numbers."""

    block_size: int
    total_blocks: int
    free_blocks: int
    total_files: int
    free_files: int


class OriginError(OSError):
    """Base of all origin errors. ``errno`` is what the filesystem replies with."""

    default_errno = errno.EIO
    transient = False

    def __init__(self, message: str, err: int | None = None) -> None:
        code = self.default_errno if err is None else err
        super().__init__(code, message)


class NotFound(OriginError):
    default_errno = errno.ENOENT


class Exists(OriginError):
    default_errno = errno.EEXIST


class NotEmpty(OriginError):
    default_errno = errno.ENOTEMPTY


class IsADir(OriginError):
    default_errno = errno.EISDIR


class NotADir(OriginError):
    default_errno = errno.ENOTDIR


class PermissionDenied(OriginError):
    default_errno = errno.EACCES


class NotSupported(OriginError):
    default_errno = errno.EOPNOTSUPP


class Conflict(OriginError):
    """A conditional operation lost: the object's version is not the one the caller expected."""

    default_errno = errno.EIO


class InvalidName(OriginError):
    """The origin cannot store this name (characters it rewrites or refuses)."""

    default_errno = errno.EINVAL


class NameTooLong(OriginError):
    default_errno = errno.ENAMETOOLONG


class NoSpace(OriginError):
    default_errno = errno.ENOSPC


class Transient(OriginError):
    """A failure that may go away (network error, timeout, throttling, 5xx): retry it."""

    default_errno = errno.EIO
    transient = True


class PutCancelled(OriginError):
    """A put stopped by its :class:`PutCancel` before it published anything: the origin holds
    what it held before (see ``Capabilities.cancel_puts``). Not a failure of the origin."""

    default_errno = errno.ECANCELED


class PutCancel:
    """Asks a put in progress to stop (``Capabilities.cancel_puts``). Thread-safe: set from
    the trio loop, read by the put in its worker thread."""

    __slots__ = ("_event",)

    def __init__(self) -> None:
        self._event = threading.Event()

    def cancel(self) -> None:
        self._event.set()

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()

    def check(self, path: str) -> None:
        """Raise :class:`PutCancelled` if the put of ``path`` has been asked to stop."""
        if self.cancelled:
            raise PutCancelled(f"{path}: put cancelled")


class Stalled(Transient):
    """The origin did not answer within a deadline (connect, first byte, idle transfer): a
    server that accepts and never answers. It starts the outage state at once
    (:class:`~airfs.origin.aio.AsyncOrigin`), as errors do only after their retries."""


_BY_ERRNO: dict[int, type[OriginError]] = {
    errno.ENOENT: NotFound,
    errno.EEXIST: Exists,
    errno.ENOTEMPTY: NotEmpty,
    errno.EISDIR: IsADir,
    errno.ENOTDIR: NotADir,
    errno.EACCES: PermissionDenied,
    errno.EPERM: PermissionDenied,
    errno.EOPNOTSUPP: NotSupported,
    errno.ENOSPC: NoSpace,
    errno.EDQUOT: NoSpace,
    errno.EAGAIN: Transient,
    errno.EINTR: Transient,
    errno.ETIMEDOUT: Transient,
    errno.ECONNRESET: Transient,
    errno.ECONNREFUSED: Transient,
}


def from_oserror(exc: OSError, path: str) -> OriginError:
    """Translate an ``OSError`` into the typed origin error with the same errno."""
    if isinstance(exc, OriginError):
        return exc
    code = exc.errno if exc.errno is not None else errno.EIO
    cls = _BY_ERRNO.get(code, OriginError)
    return cls(f"{path or '/'}: {exc.strerror or exc}", code)


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What an origin can do, declared (never sniffed). Every wrapper forwards its inner
    origin's capabilities, less what it cannot pass on.

    * ``pin``: ``pin``/``unpin`` keep an opened version readable after it is replaced;
    * ``conditional_put``: ``put(if_match=...)`` is checked atomically by the origin (two
      nodes never silently overwrite each other);
    * ``symlinks``: ``symlink``/``readlink`` work;
    * ``modes`` / ``mtimes``: permission bits / modification times given to ``put`` and
      ``set_attrs`` are kept;
    * ``md5_etag``: the version tag of an object is the hex MD5 of its bytes (S3 single-part),
      so a commit can tell cheaply whether its bytes are already there;
    * ``owners``: ``uid``/``gid`` given to ``put``, ``mkdir``, ``symlink``, ``mknod`` and
      ``set_attrs`` are kept and reported in entries;
    * ``atimes``: access times given to ``set_attrs`` are kept and reported;
    * ``hard_links``: ``link`` makes a second name of the same file (POSIX: nlink counts
      names, a change through one name is seen through the others);
    * ``link_copies``: ``link`` is an atomic create-if-absent copy (S3): EEXIST when the new
      name exists, each name an independent file afterwards (nlink 1);
    * ``special_files``: ``mknod`` creates FIFOs and sockets (and device nodes);
    * ``buffer_reads``: ``read_range_buffer(path, offset, size, version)`` returns what
      ``read_range`` would, as a read-only buffer (``memoryview``) over the client's own
      memory, without copying it into a ``bytes`` (the block cache's fetches use it);
    * ``into_reads``: ``read_range_into(path, offset, buf, version)`` reads what
      ``read_range(path, offset, len(buf), version)`` would into the writable buffer ``buf``
      and returns how many bytes it read (the same errors): a big fetch lands in memory the
      cache reuses (:mod:`airfs.cache.buffers`) instead of a new buffer of the client's;
    * ``whole_reads``: ``read_small(path, most)`` returns a file's current entry and, when it
      has at most ``most`` bytes, its whole content (a read-only buffer), in one request
      (S3: one GET, whose answer carries what a HEAD's would): a cold small file is checked
      and fetched by the same round trip;
    * ``bare_lists``: ``list(path, attrs=False)`` gives the names, kinds, sizes and versions
      without asking the stored attributes it does not know (S3: no HEAD per object), which
      are the defaults there, marked ``Entry.guessed``: for what needs the contents only
      (``airfs warm``); ``list(path, heads_max=N)`` asks them only when at most ``N`` are
      not known (a directory's names for ``readdir``: a few HEADs, not one per object of a
      big directory).
    * ``cancel_puts``: ``put(cancel=...)`` stops a put that has not published its object yet
      once the :class:`PutCancel` is set, raising :class:`PutCancelled`; nothing of it is
      then visible at the origin (S3: a multipart upload stops between parts and is never
      completed; a single PUT is only stopped before it is sent). A put that could no longer
      be stopped ends as it would have. Other origins ignore ``cancel``.
    """

    pin: bool = False
    conditional_put: bool = False
    symlinks: bool = False
    modes: bool = False
    mtimes: bool = False
    md5_etag: bool = False
    owners: bool = False
    atimes: bool = False
    hard_links: bool = False
    link_copies: bool = False
    special_files: bool = False
    buffer_reads: bool = False
    into_reads: bool = False
    whole_reads: bool = False
    bare_lists: bool = False
    cancel_puts: bool = False


@runtime_checkable
class Origin(Protocol):
    """The storage behind a mount. All paths are relative (see the module docstring)."""

    #: Human-readable description, e.g. ``"/data/volumes"`` or ``"s3://bucket/prefix"``.
    url: str

    @property
    def capabilities(self) -> Capabilities:
        """What this origin can do (see :class:`Capabilities`)."""
        ...

    def check_name(self, path: str) -> None:
        """Raise :class:`InvalidName` (EINVAL) or :class:`NameTooLong` (ENAMETOOLONG) if the
        origin cannot store an object at ``path``; called before anything is created there."""
        ...

    def stat(self, path: str) -> Entry:
        """Describe one object or directory. Raises :class:`NotFound`."""
        ...

    def list(self, path: str) -> Iterable[Entry]:
        """Entries directly under directory ``path`` (any order, no ``.``/``..``).

        Raises :class:`NotFound` or :class:`NotADir`.
        """
        ...

    def read_range(self, path: str, offset: int, size: int, version: str | None = None) -> bytes:
        """Up to ``size`` bytes from ``offset`` (short only at end of object).

        With ``version`` given, raises :class:`Conflict` if the object is no longer that version
        (so a reader never mixes bytes of two versions).
        """
        ...

    def put(
        self,
        path: str,
        source: str,
        if_match: str | None = None,
        *,
        mode: int | None = None,
        mtime_ns: int | None = None,
        uid: int | None = None,
        gid: int | None = None,
        cancel: PutCancel | None = None,
    ) -> Entry:
        """Atomically replace (or create) ``path`` with the content of local file ``source``.

        Readers see the old object or the whole new one, and the new one has its final
        ``mode``, ``mtime_ns`` and owner (where the origin keeps them) from its first visible
        moment; ``mode`` None keeps the replaced object's mode (0644 for a new one),
        ``mtime_ns`` None means now, ``uid``/``gid`` None keep the replaced object's owner
        (the origin's default for a new one). With ``if_match`` (a version tag, or ``""``
        meaning "must not exist"), raises :class:`Conflict` when the current object does
        not match. Returns the new entry (with its version). ``cancel``: see
        ``Capabilities.cancel_puts``.
        """
        ...

    def delete(self, path: str) -> None:
        """Remove a file or symlink. Raises :class:`NotFound`, :class:`IsADir`."""
        ...

    def mkdir(
        self, path: str, mode: int = 0o755, *, uid: int | None = None, gid: int | None = None
    ) -> Entry:
        """Create a directory with exactly ``mode`` (no umask) and, where the origin keeps
        owners, ``uid``/``gid``. Raises :class:`Exists`, :class:`NotFound` (no parent)."""
        ...

    def rmdir(self, path: str) -> None:
        """Remove an empty directory.

        Raises :class:`NotEmpty`, :class:`NotFound`, :class:`NotADir`.
        """
        ...

    def rename(self, src: str, dst: str, replace: bool = True) -> None:
        """Move ``src`` to ``dst``. A file replaces an existing file at ``dst`` (atomically where
        the origin allows); ``replace=False`` raises :class:`Exists` instead. A directory may
        replace only an empty directory. Directory renames on object stores are not atomic.
        """
        ...

    def symlink(
        self, path: str, target: str, *, uid: int | None = None, gid: int | None = None
    ) -> Entry:
        """Create a symbolic link at ``path`` pointing to ``target``. Raises :class:`Exists`."""
        ...

    def link(self, src: str, dst: str) -> Entry:
        """Make ``dst`` a new name of file ``src`` and return ``dst``'s entry.

        ``hard_links`` origins make a real link (both names one file, ``nlink`` counts
        them); ``link_copies`` origins copy ``src`` to ``dst`` only if ``dst`` does not exist,
        atomically (two nodes racing for ``dst``: exactly one wins). Raises :class:`Exists`
        when ``dst`` exists, :class:`NotFound`, :class:`NotSupported` elsewhere."""
        ...

    def mknod(
        self,
        path: str,
        kind: Kind,
        mode: int,
        rdev: int = 0,
        *,
        uid: int | None = None,
        gid: int | None = None,
    ) -> Entry:
        """Create a special file (``kind`` in :data:`SPECIAL_KINDS`). Raises :class:`Exists`,
        :class:`NotSupported` where the origin has no ``special_files``."""
        ...

    def readlink(self, path: str) -> str:
        """The target of symlink ``path``."""
        ...

    def set_attrs(
        self,
        path: str,
        mode: int | None = None,
        mtime_ns: int | None = None,
        *,
        uid: int | None = None,
        gid: int | None = None,
        atime_ns: int | None = None,
        follow: bool = True,
    ) -> Entry:
        """Change permission bits, owner, modification and/or access time where the origin
        keeps them (None: unchanged). ``follow=False`` changes a symlink itself (lchown,
        ``utimensat(AT_SYMLINK_NOFOLLOW)``); origins that cannot, accept and ignore it.

        Origins that cannot store an attribute accept the call and return the entry unchanged.
        """
        ...

    def statfs(self) -> FsStats:
        """Capacity figures."""
        ...

    def close(self) -> None:
        """Release resources (file descriptors, connections)."""
        ...


T = TypeVar("T")


def check_rename_target(
    src_is_dir: bool,
    dst_kind: Kind | None,
    *,
    replace: bool,
    dst_is_empty: Callable[[], bool],
    where: str,
) -> None:
    """The rename rules every origin shares, given what is at the destination
    (``dst_kind`` None: nothing): ``replace=False`` refuses any existing target (EEXIST); a
    directory replaces only an empty directory (ENOTDIR, ENOTEMPTY); a file never replaces a
    directory (EISDIR). ``dst_is_empty`` is called only when a directory would be replaced."""
    if dst_kind is None:
        return
    if not replace:
        raise Exists(f"{where}: exists")
    if src_is_dir and dst_kind is not Kind.DIR:
        raise NotADir(f"{where}: not a directory")
    if not src_is_dir and dst_kind is Kind.DIR:
        raise IsADir(f"{where}: is a directory")
    if dst_kind is Kind.DIR and not dst_is_empty():
        raise NotEmpty(f"{where}: directory not empty")


def join(parent: str, name: str) -> str:
    """Join a relative directory path and a name (``join("", "a") == "a"``)."""
    return f"{parent}/{name}" if parent else name


def split(path: str) -> tuple[str, str]:
    """Split a relative path into (parent, name); ``split("a/b") == ("a", "b")``."""
    parent, _, name = path.rpartition("/")
    return parent, name
