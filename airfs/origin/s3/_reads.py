"""Reads: stat, one-level listings (with the modes of listed objects), ranged GETs."""

from __future__ import annotations

import builtins
import dataclasses
import functools
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import obstore

if TYPE_CHECKING:
    from obstore import GetOptions, GetResult

from ..base import Conflict, Entry, FsStats, IsADir, NotADir, NotFound, NotSupported, split
from ._config import LIST_HEADS, PROBE_PREFIX
from ._core import S3Client
from ._errors import status_of, translate
from ._meta import Meta, parse


class Reads:
    """The read side of the S3 origin: stat, one-level listings, ranged GETs. No state of
    its own: it asks ``client`` (whose :class:`~._core.KnownAttrs` a listing reads)."""

    def __init__(self, client: S3Client) -> None:
        self.c = client

    def stat(self, path: str) -> Entry:
        if not path:
            return self.c.dir_entry("", mtime_ns=self.c.probe_time("")[2])
        meta = self.c.head(path)
        if meta is not None:
            return self.c.file_entry(split(path)[1], meta, meta["attrs"])
        marker, children, t = self.c.probe_time(path)
        if marker or children:
            return self._dir_stat(path, split(path)[1], t)
        raise NotFound(f"{self.c.where(path)}: not found")

    def _dir_stat(self, path: str, name: str, first_t: int | None = None) -> Entry:
        """A directory's entry: its marker's attributes where they are kept, else its stable
        time (``first_t`` where the caller probed already)."""
        got = self.c.dir_meta(path)
        if got is not None:
            return self.c.dir_entry(name, *got)
        t = self.c.probe_time(path)[2] if first_t is None else first_t
        return self.c.dir_entry(name, mtime_ns=t)

    def list(
        self, path: str, *, attrs: bool = True, heads_max: int | None = None
    ) -> builtins.list[Entry]:
        """One level. Listings carry no user metadata: the attributes of an object come from
        what this origin saw of that exact state (ETag and Last-Modified), else from a HEAD
        each, in parallel (``list_heads``; without it, the defaults). Subdirectories get
        their marker's attributes the same way where the server keeps them, else their
        stable time (:meth:`.S3Client.probe_time`, one small listing each, with ``list_heads``).
        ``attrs=False`` (``Capabilities.bare_lists``): no HEAD nor probe at all, the
        attributes not seen yet are the defaults, marked ``Entry.guessed`` (the names, kinds,
        sizes and versions are right: what a warm needs). ``heads_max``: the HEADs and probes
        are made only when there are at most that many, else none (the entries guessed)."""
        heads = self.c.list_heads and attrs
        try:
            res = obstore.list_with_delimiter(self.c.store, path or None)
        except Exception as exc:
            raise translate(exc, self.c.where(path)) from None
        cut = len(path) + 1 if path else 0
        out: dict[str, Entry] = {}
        dirs: builtins.list[tuple[str, str]] = []
        for p in res["common_prefixes"]:
            name = p[cut:]
            if name and not (not path and name.startswith(PROBE_PREFIX)):
                out[name] = self.c.dir_entry(name)
                dirs.append((name, p))
        has_marker = False
        unknown: builtins.list[tuple[str, Mapping[str, Any]]] = []
        for meta in res["objects"]:
            p = meta["path"]
            if p == path:  # the marker "path/" of the listed directory itself
                has_marker = True
                continue
            name = p[cut:]
            if not name or name in out or (not path and name.startswith(PROBE_PREFIX)):
                continue
            got = self.c.known.get(p, self.c.token(meta), recent=not heads)
            if got is None:
                unknown.append((name, meta))
            else:
                out[name] = self.c.file_entry(name, meta, got)
        if heads and heads_max is not None and len(unknown) + len(dirs) > heads_max:
            heads = False
        if heads:
            for name, entry in self._heads(unknown, dirs):
                out[name] = entry
        else:  # guessed unless the defaults are this origin's answer (no ``list_heads``)
            guessed = self.c.list_heads
            for name, listed in unknown:
                got = self.c.known.get(listed["path"], self.c.token(listed), recent=True)
                entry = self.c.file_entry(name, listed, got or Meta())
                out[name] = dataclasses.replace(entry, guessed=guessed)
            for name, _ in dirs:
                out[name] = dataclasses.replace(out[name], guessed=guessed)
        if not out and not has_marker and path:
            if self.c.head(path) is not None:
                raise NotADir(f"{self.c.where(path)}: not a directory")
            raise NotFound(f"{self.c.where(path)}: not found")
        return builtins.list(out.values())

    def _heads(
        self,
        files: builtins.list[tuple[str, Mapping[str, Any]]],
        dirs: builtins.list[tuple[str, str]],
    ) -> builtins.list[tuple[str, Entry]]:
        """The entries of listed objects this origin has not seen yet and of listed
        directories (one HEAD each, in parallel). An object gone meanwhile is left out; one
        that changed keeps the listed size and version, with the attributes the HEAD saw
        (never a mode wider than stored)."""

        def file(item: tuple[str, Mapping[str, Any]]) -> tuple[str, Entry] | None:
            name, meta = item
            head = self.c.head(meta["path"])
            if head is None:
                return None
            return name, self.c.file_entry(name, meta, head["attrs"])

        def directory(item: tuple[str, str]) -> tuple[str, Entry] | None:
            name, p = item
            return name, self._dir_stat(p.rstrip("/"), name)

        jobs: builtins.list[Callable[[], tuple[str, Entry] | None]] = [
            *(functools.partial(file, f) for f in files),
            *(functools.partial(directory, d) for d in dirs),
        ]
        if not jobs:
            return []
        if len(jobs) == 1:
            found = [jobs[0]()]
        else:
            with ThreadPoolExecutor(min(LIST_HEADS, len(jobs))) as pool:
                found = builtins.list(pool.map(lambda job: job(), jobs))
        return [f for f in found if f is not None]

    def read_range(self, path: str, offset: int, size: int, version: str | None = None) -> bytes:
        return bytes(self.read_range_buffer(path, offset, size, version))

    def read_range_buffer(
        self, path: str, offset: int, size: int, version: str | None = None
    ) -> memoryview:
        """:meth:`read_range`'s bytes as a view of the response body (no copy)."""
        if size <= 0:
            self._check_version(path, version)
            return memoryview(b"")
        res = self._get_range(path, offset, size, version)
        if res is None:
            return memoryview(b"")
        try:
            return memoryview(res.bytes())
        except Exception as exc:
            raise self._failed(exc, path, version) from None

    def read_range_into(
        self, path: str, offset: int, buf: memoryview, version: str | None = None
    ) -> int:
        """:meth:`read_range` of ``len(buf)`` bytes into the writable ``buf``, as the response
        body arrives (its chunks copied in; no buffer of the whole range); the number of
        bytes read (short only at the end of the object). Raises :class:`Conflict` when the
        server sends more than asked."""
        size = len(buf)
        if size <= 0:
            self._check_version(path, version)
            return 0
        res = self._get_range(path, offset, size, version)
        if res is None:
            return 0
        pos = 0
        try:
            for chunk in res.stream(min_chunk_size=0):  # the client's chunks, as they come
                n = len(chunk)
                if pos + n > size:
                    raise Conflict(f"{self.c.where(path)}: more than {size} bytes sent")
                buf[pos : pos + n] = chunk
                pos += n
        except Conflict:
            raise
        except Exception as exc:
            raise self._failed(exc, path, version) from None
        return pos

    def _get_range(
        self, path: str, offset: int, size: int, version: str | None
    ) -> GetResult | None:
        """The GET of ``size`` bytes at ``offset`` (its body not read yet), or None when
        ``offset`` is at or past the end of the object (still of ``version``)."""
        options: GetOptions = {"range": (offset, offset + size)}
        if version is not None:
            options["if_match"] = version
        try:
            res = obstore.get(self.c.store, path, options=options)
        except Exception as exc:
            if status_of(exc) != 416:  # 416: offset at or past the end of the object
                raise self._failed(exc, path, version) from None
            res = None
        if res is None:
            self._check_version(path, version)
            return None
        if version is not None and res.meta.get("e_tag") != version:
            where = self.c.where(path)
            raise Conflict(f"{where}: changed at the origin (version {version} is gone)")
        if offset == 0:  # its answer carries the object's metadata: a listing's HEAD less
            self.c.known.remember(path, self.c.token(res.meta), parse(res.attributes))
        return res

    def _failed(self, exc: Exception, path: str, version: str | None) -> Exception:
        """The error to raise for a failed ranged GET of ``path``."""
        where = self.c.where(path)
        err = translate(exc, where)
        if isinstance(err, Conflict):
            return Conflict(f"{where}: changed at the origin (version {version} is gone)")
        if isinstance(err, NotFound) and self.c.is_dir(path):
            return IsADir(f"{where}: is a directory")
        return err

    def read_small(self, path: str, most: int) -> tuple[Entry, memoryview | None]:
        """One GET of ``path``: its entry as a HEAD would give it (remembered for listings)
        and, when it has at most ``most`` bytes, its content (else None: the answer's body is
        not read). Raises :class:`NotFound` when there is no object ``path`` (a directory
        included: ask :meth:`stat`)."""
        where = self.c.where(path)
        if not path:
            raise NotFound(f"{where}: not an object")
        try:
            res = obstore.get(self.c.store, path)
            attrs = parse(res.attributes)
            self.c.known.remember(path, self.c.token(res.meta), attrs)
            entry = self.c.file_entry(split(path)[1], res.meta, attrs)
            if entry.size > most:
                return entry, None
            body = memoryview(res.bytes())
        except Exception as exc:
            raise translate(exc, where) from None
        if len(body) != entry.size:
            raise Conflict(f"{where}: changed while read ({len(body)} of {entry.size} bytes)")
        return entry, body

    def _check_version(self, path: str, version: str | None) -> None:
        meta = self.c.head(path)
        if meta is None:
            if self.c.is_dir(path):
                raise IsADir(f"{self.c.where(path)}: is a directory")
            raise NotFound(f"{self.c.where(path)}: not found")
        if version is not None and meta.get("e_tag") != version:
            raise Conflict(
                f"{self.c.where(path)}: changed at the origin (version {version} is gone)"
            )

    def readlink(self, path: str) -> str:
        raise NotSupported(f"{self.c.where(path)}: symbolic links are not supported on S3 origins")

    def statfs(self) -> FsStats:
        return FsStats(
            block_size=4096,
            total_blocks=1 << 40,
            free_blocks=1 << 40,
            total_files=1 << 40,
            free_files=1 << 40,
        )
