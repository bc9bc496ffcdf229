"""An in-memory origin and a fault-injecting wrapper: test tools for the core, not substitutes
for the real origins (which run the same conformance suite).

``MemoryOrigin`` counts calls per operation in ``calls`` and bytes read in ``bytes_read`` so
tests can assert what reached the origin.
"""

from __future__ import annotations

import builtins
import collections
import dataclasses
import errno
import itertools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from airfs.origin.base import (
    Capabilities,
    Conflict,
    Entry,
    Exists,
    FsStats,
    IsADir,
    Kind,
    NotADir,
    NotEmpty,
    NotFound,
    NotSupported,
    Origin,
    OriginError,
    PermissionDenied,
    PutCancel,
    check_rename_target,
    split,
)


@dataclass
class _Obj:
    kind: Kind
    data: bytes = b""
    target: str = ""
    mode: int = 0o644
    mtime_ns: int = 0
    version: str = ""
    uid: int | None = None
    gid: int | None = None


class MemoryOrigin:
    """A thread-safe origin held in a dict. Versions are a global counter. Owners are kept
    (None until given); ``link`` is a create-if-absent copy (as on S3); no special files."""

    capabilities = Capabilities(
        pin=False,
        conditional_put=True,
        symlinks=True,
        modes=True,
        mtimes=True,
        owners=True,
        link_copies=True,
    )

    def check_name(self, path: str) -> None:
        return None

    def __init__(self) -> None:
        self.url = "memory://"
        self._lock = threading.RLock()
        self._objs: dict[str, _Obj] = {"": _Obj(Kind.DIR, mode=0o755, mtime_ns=time.time_ns())}
        self._ver = itertools.count(1)
        self.calls: collections.Counter[str] = collections.Counter()
        self.bytes_read = 0
        #: with bare listings: the entries asked (``stat``, a listing's ``list_heads``) in
        #: the state they were asked in (S3 remembers what it was told of each object)
        self._seen: dict[str, Entry] = {}

    def _entry(self, path: str, o: _Obj) -> Entry:
        size = len(o.data) if o.kind is Kind.FILE else len(o.target)
        return Entry(
            split(path)[1], o.kind, size, o.mtime_ns, o.mode, o.version, uid=o.uid, gid=o.gid
        )

    def _get(self, path: str) -> _Obj:
        o = self._objs.get(path)
        if o is None:
            raise NotFound(f"{path}: not found")
        return o

    def _parent_dir(self, path: str) -> None:
        parent = split(path)[0]
        p = self._objs.get(parent)
        if p is None:
            raise NotFound(f"{parent}: not found")
        if p.kind is not Kind.DIR:
            raise NotADir(f"{parent}: not a directory")

    def _new(self, kind: Kind, **kw: object) -> _Obj:
        o = _Obj(kind, mtime_ns=time.time_ns(), **kw)  # type: ignore[arg-type]
        o.version = "" if kind is Kind.DIR else f"v{next(self._ver)}"
        return o

    def stat(self, path: str) -> Entry:
        with self._lock:
            self.calls["stat"] += 1
            e = self._seen[path] = self._entry(path, self._get(path))
            return e

    def list(self, path: str, *, attrs: bool = True, heads_max: int | None = None) -> list[Entry]:
        """One level. ``attrs``/``heads_max`` as S3's (``Capabilities.bare_lists``, given by
        :meth:`with_bare_lists`): an entry asked before (``stat``, an asked listing) and not
        changed since comes with its attributes; a listing asks the others' attributes
        unless ``attrs`` is False or there are more than ``heads_max`` of them; those are
        then ``guessed``: mode 0o644 (a directory's 0o755), no owner, time 0. An asked
        listing counts one ``list_heads`` call per entry it asked (S3's HEADs; every entry
        without bare listings)."""
        with self._lock:
            self.calls["list"] += 1
            if self._get(path).kind is not Kind.DIR:
                raise NotADir(f"{path}: not a directory")
            prefix = f"{path}/" if path else ""
            out = [
                self._entry(p, o)
                for p, o in self._objs.items()
                if p and p.startswith(prefix) and "/" not in p[len(prefix) :]
            ]
            if not self.capabilities.bare_lists:
                self.calls["list_heads"] += len(out)
                return out
            seen = self._seen
            unknown = [e for e in out if seen.get(prefix + e.name) != e]
            if attrs and (heads_max is None or len(unknown) <= heads_max):
                self.calls["list_heads"] += len(unknown)
                for e in unknown:
                    seen[prefix + e.name] = e
                return out
            return [
                e
                if seen.get(prefix + e.name) == e
                else dataclasses.replace(
                    e,
                    mode=0o755 if e.kind is Kind.DIR else 0o644,
                    uid=None,
                    gid=None,
                    mtime_ns=0,
                    guessed=True,
                )
                for e in out
            ]

    def with_bare_lists(self) -> MemoryOrigin:
        """This origin, with ``Capabilities.bare_lists`` (for tests of bare listings)."""
        self.capabilities = dataclasses.replace(self.capabilities, bare_lists=True)
        return self

    def read_range(self, path: str, offset: int, size: int, version: str | None = None) -> bytes:
        with self._lock:
            self.calls["read_range"] += 1
            o = self._get(path)
            if o.kind is Kind.DIR:
                raise IsADir(f"{path}: is a directory")
            if version is not None and o.version != version:
                raise Conflict(f"{path}: version {version} is gone")
            data = o.data[offset : offset + size]
            self.bytes_read += len(data)
            return data

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
        if cancel is not None:  # (no cancel_puts; checked as a put that is never sent)
            cancel.check(path)
        with open(source, "rb") as f:
            data = f.read()
        return self.put_bytes(path, data, if_match, mode=mode, mtime_ns=mtime_ns, uid=uid, gid=gid)

    def put_bytes(
        self,
        path: str,
        data: bytes,
        if_match: str | None = None,
        *,
        mode: int | None = None,
        mtime_ns: int | None = None,
        uid: int | None = None,
        gid: int | None = None,
    ) -> Entry:
        """Like :meth:`put`, from bytes (handy in tests)."""
        with self._lock:
            self.calls["put"] += 1
            self._parent_dir(path)
            cur = self._objs.get(path)
            if cur is not None and cur.kind is Kind.DIR:
                raise IsADir(f"{path}: is a directory")
            if if_match is not None and (cur.version if cur else "") != if_match:
                raise Conflict(f"{path}: changed since it was opened")
            if mode is None:
                # a file put over a file keeps its mode; over a symlink it is a new plain file
                mode = cur.mode if cur is not None and cur.kind is Kind.FILE else 0o644
            o = self._new(Kind.FILE, data=bytes(data), mode=mode & 0o7777)
            if mtime_ns is not None:
                o.mtime_ns = mtime_ns
            old = cur if cur is not None and cur.kind is Kind.FILE else None
            o.uid = uid if uid is not None else (old.uid if old is not None else None)
            o.gid = gid if gid is not None else (old.gid if old is not None else None)
            self._objs[path] = o
            return self._entry(path, o)

    def delete(self, path: str) -> None:
        with self._lock:
            self.calls["delete"] += 1
            if self._get(path).kind is Kind.DIR:
                raise IsADir(f"{path}: is a directory")
            del self._objs[path]

    def mkdir(
        self, path: str, mode: int = 0o755, *, uid: int | None = None, gid: int | None = None
    ) -> Entry:
        with self._lock:
            self.calls["mkdir"] += 1
            self._parent_dir(path)
            if path in self._objs:
                raise Exists(f"{path}: exists")
            o = self._new(Kind.DIR, mode=mode & 0o7777, uid=uid, gid=gid)
            self._objs[path] = o
            return self._entry(path, o)

    def _children(self, path: str) -> builtins.list[str]:
        """Every path below ``path`` (for the root "": every path but the root itself)."""
        prefix = f"{path}/" if path else ""
        return [p for p in self._objs if p and p.startswith(prefix)]

    def rmdir(self, path: str) -> None:
        with self._lock:
            self.calls["rmdir"] += 1
            if not path:
                raise OriginError("cannot remove the root", errno.EBUSY)
            if self._get(path).kind is not Kind.DIR:
                raise NotADir(f"{path}: not a directory")
            if self._children(path):
                raise NotEmpty(f"{path}: not empty")
            del self._objs[path]

    def rename(self, src: str, dst: str, replace: bool = True) -> None:
        with self._lock:
            self.calls["rename"] += 1
            if not src or not dst:
                raise OriginError("cannot rename the root", errno.EBUSY)
            s = self._get(src)
            self._parent_dir(dst)
            d = self._objs.get(dst)
            check_rename_target(
                s.kind is Kind.DIR,
                d.kind if d is not None else None,
                replace=replace,
                dst_is_empty=lambda: not self._children(dst),
                where=dst,
            )
            if s.kind is Kind.DIR and (dst + "/").startswith(src + "/"):
                raise OriginError(f"{dst}: inside {src}", errno.EINVAL)
            moved = {src: s} | {p: self._objs[p] for p in self._children(src)}
            for p in moved:
                del self._objs[p]
            for p, o in moved.items():
                self._objs[dst + p[len(src) :]] = o

    def symlink(
        self, path: str, target: str, *, uid: int | None = None, gid: int | None = None
    ) -> Entry:
        with self._lock:
            self.calls["symlink"] += 1
            self._parent_dir(path)
            if path in self._objs:
                raise Exists(f"{path}: exists")
            o = self._new(Kind.SYMLINK, target=target, mode=0o777, uid=uid, gid=gid)
            self._objs[path] = o
            return self._entry(path, o)

    def link(self, src: str, dst: str) -> Entry:
        """A create-if-absent copy of file ``src`` (bytes, mode, owner, mtime) at ``dst``."""
        with self._lock:
            self.calls["link"] += 1
            s = self._get(src)
            if s.kind is Kind.DIR:
                raise PermissionDenied(f"{src}: is a directory", errno.EPERM)
            self._parent_dir(dst)
            if dst in self._objs:
                raise Exists(f"{dst}: exists")
            o = self._new(s.kind, data=s.data, target=s.target, mode=s.mode, uid=s.uid, gid=s.gid)
            o.mtime_ns = s.mtime_ns
            self._objs[dst] = o
            return self._entry(dst, o)

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
        raise NotSupported(f"{path}: no special files in the memory origin")

    def readlink(self, path: str) -> str:
        with self._lock:
            o = self._get(path)
            if o.kind is not Kind.SYMLINK:
                raise OriginError(f"{path}: not a symlink", errno.EINVAL)
            return o.target

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
        """Mode, owner and mtime are kept (``atime_ns`` is not: no ``atimes``)."""
        with self._lock:
            o = self._get(path)
            if mode is not None:
                o.mode = mode & 0o7777
            if uid is not None:
                o.uid = uid
            if gid is not None:
                o.gid = gid
            if mtime_ns is not None:
                o.mtime_ns = mtime_ns
            return self._entry(path, o)

    def statfs(self) -> FsStats:
        return FsStats(4096, 1 << 30, 1 << 29, 1 << 20, 1 << 19)

    def close(self) -> None:
        pass


class FaultyOrigin:
    """Wraps an origin; ``fail[op] = exc_factory`` makes calls of ``op`` raise until removed."""

    def __init__(self, inner: Origin) -> None:
        self.inner = inner
        self.url = f"faulty+{inner.url}"
        self.fail: dict[str, Callable[[], OriginError]] = {}

    def __getattr__(self, name: str) -> object:
        if name == "capabilities":  # reads it cannot fault are not passed on
            return dataclasses.replace(
                self.inner.capabilities,
                buffer_reads=False,
                into_reads=False,
                whole_reads=False,
                bare_lists=False,
            )
        target = getattr(self.inner, name)
        if not callable(target):
            return target

        def call(*args: object, **kwargs: object) -> object:
            factory = self.fail.get(name)
            if factory is not None:
                raise factory()
            return target(*args, **kwargs)

        return call


class Recording:
    """Wraps an origin; records every ``read_range`` (``ranges``) and the most of them in
    progress at once (``max_running``). With ``meet``, each read waits (up to 10 s) until
    ``meet`` reads are in progress together; ``delay``: each read takes that many seconds
    more. Everything else goes to the wrapped origin."""

    def __init__(self, inner: Any, *, meet: int = 0, delay: float = 0.0) -> None:
        self.inner = inner
        self.url = inner.url
        self.ranges: builtins.list[tuple[str, int, int]] = []
        self.running = 0
        self.max_running = 0
        self.delay = delay
        self._lock = threading.Lock()
        self._barrier = threading.Barrier(meet, timeout=10) if meet else None

    def read_range(self, path: str, offset: int, size: int, version: str | None = None) -> bytes:
        with self._lock:
            self.ranges.append((path, offset, size))
            self.running += 1
            self.max_running = max(self.max_running, self.running)
        try:
            if self._barrier is not None:
                self._barrier.wait()
            if self.delay:
                time.sleep(self.delay)
            data: bytes = self.inner.read_range(path, offset, size, version)
            return data
        finally:
            with self._lock:
                self.running -= 1

    @property
    def capabilities(self) -> Capabilities:
        """The inner origin's, less the reads that would not be recorded."""
        caps: Capabilities = self.inner.capabilities
        return dataclasses.replace(caps, buffer_reads=False, into_reads=False)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)
