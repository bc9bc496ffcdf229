"""A bounded local copy of files from a directory that is not an airfs mount.

:class:`VolumeDataset` uses it when its root is an ordinary directory (NFS, a bind mount, a
slow disk): every file is copied once into ``directory`` and later reads hit the copy. Needs no
torch.

Layout and rules:

- A file lives at ``directory/<namespace>/<relative path>``, so directory names (often the
  labels) survive. The cached file's mtime is set to the source's, and a cached file counts as
  valid only while its size and mtime equal the source's as listed; anything else is copied again.
- Copies are atomic and safe with many processes on one ``directory``: each copy goes to a
  unique temporary name beside its target (``.airfs-tmp-...``) and is published with ``link()``,
  which fails if another process published it first (then that copy is used, ours is dropped).
  Readers never see a partial file.
- Size bound: the total size of published files is kept in ``directory/.airfs-cache.lock``,
  updated under ``flock`` by every process. When an insertion takes it over ``max_bytes``, the
  inserting process scans the directory and deletes the least recently used files (by atime;
  every hit sets the atime explicitly, so ``noatime`` mounts do not matter) until the total is at
  most ``low_water * max_bytes``, never the file it just inserted. Temporary files of copies in
  flight are not counted; abandoned ones (a killed process) older than an hour are removed.
  A file larger than ``max_bytes`` is not cached: its source path is returned.
- The bound holds for what this class writes: files put in ``directory`` by hand are counted at
  the next scan (when the counter is missing, or at an eviction).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import secrets
import shutil
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

log = logging.getLogger("airfs.data")

LOCK_NAME = ".airfs-cache.lock"
TMP_PREFIX = ".airfs-tmp-"
_STALE_TMP_S = 3600.0


def copy_from_origin(src: str, dst: str) -> int:
    """Copy the file ``src`` to the new path ``dst``; return the number of bytes copied.

    This is the only place where the local cache reads the origin (tests count its calls).
    Uses ``sendfile`` where the kernel allows it."""
    shutil.copyfile(src, dst)
    return os.stat(dst).st_size


@dataclass(frozen=True)
class LocalCacheStats:
    """What one :class:`LocalCache` object (one process) did."""

    hits: int
    copies: int
    bytes_copied: int
    evictions: int
    uncached: int


class LocalCache:
    """Files copied from an origin directory into ``directory``, at most ``max_bytes`` of them
    (``None``: 80% of the cache file system's free space plus what the cache holds, measured at
    first use). Safe to use from many threads and processes at once; see the module doc."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        max_bytes: int | None = None,
        *,
        low_water: float = 0.9,
    ) -> None:
        if max_bytes is not None and max_bytes <= 0:
            raise ValueError(f"max_bytes must be positive, not {max_bytes}")
        if not 0.0 < low_water <= 1.0:
            raise ValueError(f"low_water must be in (0, 1], not {low_water}")
        self.directory = os.path.abspath(os.fspath(directory))
        self._max_bytes = max_bytes
        self.low_water = low_water
        self._mutex = threading.Lock()
        self._hits = self._copies = self._bytes = self._evictions = self._uncached = 0

    # ----------------------------------------------------------------------------- public

    @property
    def max_bytes(self) -> int:
        """The size bound, in bytes."""
        if self._max_bytes is None:
            os.makedirs(self.directory, exist_ok=True)
            with self._locked() as fd:
                usage = self._read_usage(fd)
            st = os.statvfs(self.directory)
            self._max_bytes = max(1, int(0.8 * (usage + st.f_bavail * st.f_frsize)))
        return self._max_bytes

    def path_for(self, namespace: str, relpath: str) -> str:
        """Where the copy of ``relpath`` (relative to an origin directory) lives."""
        rel = os.path.normpath(relpath)
        if rel.startswith("..") or os.path.isabs(rel):
            raise ValueError(f"{relpath!r} is not a relative path inside the origin directory")
        return os.path.join(self.directory, namespace, rel)

    def get(self, src: str, dest: str, size: int, mtime_ns: int) -> tuple[str, bool]:
        """A local path holding the content of ``src`` (listed with ``size`` and ``mtime_ns``),
        and whether it was already cached. Copies ``src`` to ``dest`` (a :meth:`path_for` path)
        unless a valid copy is there. Errors reading ``src`` or writing the cache propagate."""
        if self._valid(dest, size, mtime_ns):
            with self._mutex:
                self._hits += 1
            return dest, True
        limit = self.max_bytes  # before taking the lock: computing it may need the lock
        if size > limit:
            warn_once(
                f"uncached:{self.directory}",
                f"{src} ({size} bytes) is larger than the local cache limit ({self.max_bytes} "
                "bytes): served from the origin, uncached",
            )
            with self._mutex:
                self._uncached += 1
            return src, False
        parent = os.path.dirname(dest)
        os.makedirs(parent, exist_ok=True)
        tmp = os.path.join(
            parent, f"{TMP_PREFIX}{os.getpid()}-{threading.get_ident()}-{secrets.token_hex(4)}"
        )
        try:
            copied = copy_from_origin(src, tmp)
            os.utime(tmp, ns=(time.time_ns(), mtime_ns))
            # Publishing and counting happen under the lock, so that a scan never sees a
            # published file that is not counted yet (it would be counted twice).
            with self._locked() as fd:
                usage = self._read_usage(fd)
                added = self._publish(tmp, dest, copied, size, mtime_ns)
                if added:
                    usage += added
                    if usage > limit:
                        usage = self._evict_locked(protect=dest)
                    self._write_usage(fd, usage)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        with self._mutex:
            self._copies += 1
            self._bytes += copied
        return dest, False

    def usage(self) -> int:
        """Bytes of published files, as counted (scans the directory if never counted)."""
        os.makedirs(self.directory, exist_ok=True)
        with self._locked() as fd:
            return self._read_usage(fd)

    def scan(self) -> int:
        """Recount the directory, evict down to the bound if over it, and return the usage."""
        os.makedirs(self.directory, exist_ok=True)
        with self._locked() as fd:
            usage = self._evict_locked(protect=None)
            self._write_usage(fd, usage)
            return usage

    def stats(self) -> LocalCacheStats:
        """What this object did so far."""
        with self._mutex:
            return LocalCacheStats(
                self._hits, self._copies, self._bytes, self._evictions, self._uncached
            )

    # ---------------------------------------------------------------------------- private

    @staticmethod
    def _valid(path: str, size: int, mtime_ns: int) -> bool:
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return False
        if st.st_size != size or st.st_mtime_ns != mtime_ns:
            return False
        try:
            os.utime(path, ns=(time.time_ns(), mtime_ns))  # LRU: mark as used now
        except FileNotFoundError:  # evicted by another process in between
            return False
        return True

    def _publish(self, tmp: str, dest: str, copied: int, size: int, mtime_ns: int) -> int:
        """Move ``tmp`` to ``dest`` unless a valid copy is there; return the bytes added."""
        while True:
            try:
                os.link(tmp, dest)
                return copied
            except FileExistsError:
                pass
            try:
                st = os.stat(dest)
            except FileNotFoundError:
                continue  # evicted in between: try to link again
            if st.st_size == size and st.st_mtime_ns == mtime_ns:
                return 0  # another process published the same version first
            os.replace(tmp, dest)  # an older version: replace it
            return copied - st.st_size

    @contextlib.contextmanager
    def _locked(self) -> Iterator[int]:
        fd = os.open(os.path.join(self.directory, LOCK_NAME), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield fd
        finally:
            os.close(fd)  # releases the lock

    def _read_usage(self, fd: int) -> int:
        raw = os.pread(fd, 8, 0)
        if len(raw) == 8:
            return int.from_bytes(raw, "little", signed=True)
        usage = self._evict_locked(protect=None)
        self._write_usage(fd, usage)
        return usage

    @staticmethod
    def _write_usage(fd: int, usage: int) -> None:
        os.pwrite(fd, max(0, usage).to_bytes(8, "little", signed=True), 0)

    def _evict_locked(self, protect: str | None) -> int:
        """Count the directory and, if over the bound, delete least recently used files down to
        the low-water mark. Must hold the lock. Returns the bytes left."""
        now = time.time()
        entries: list[tuple[int, str, int]] = []
        total = 0
        for dirpath, _dirnames, filenames in os.walk(self.directory):
            for name in filenames:
                path = os.path.join(dirpath, name)
                if name == LOCK_NAME and dirpath == self.directory:
                    continue
                try:
                    st = os.lstat(path)
                except FileNotFoundError:
                    continue
                if name.startswith(TMP_PREFIX):
                    if now - st.st_ctime > _STALE_TMP_S:
                        with contextlib.suppress(FileNotFoundError):
                            os.unlink(path)
                    continue
                total += st.st_size
                entries.append((st.st_atime_ns, path, st.st_size))
        limit = self._max_bytes
        if limit is None or total <= limit:
            return total
        target = int(self.low_water * limit)
        entries.sort()
        evicted = 0
        for _atime, path, size in entries:
            if total <= target:
                break
            if path == protect:
                continue
            try:
                os.unlink(path)
                evicted += 1
            except FileNotFoundError:
                pass
            total -= size
        with self._mutex:
            self._evictions += evicted
        return total


_warned: set[str] = set()
_warned_lock = threading.Lock()


def warn_once(key: str, message: str) -> None:
    """Log ``message`` as a warning the first time ``key`` is seen in this process."""
    with _warned_lock:
        if key in _warned:
            return
        _warned.add(key)
    log.warning("%s", message)
