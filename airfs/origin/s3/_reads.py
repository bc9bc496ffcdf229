"""Reads: stat, one-level listings (with the modes of listed objects), ranged GETs."""

from __future__ import annotations

import builtins
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import obstore

if TYPE_CHECKING:
    from obstore import GetOptions

from ..base import Conflict, Entry, FsStats, IsADir, NotADir, NotFound, NotSupported, split
from ._config import LIST_HEADS, PROBE_PREFIX
from ._core import S3Base
from ._errors import status_of, translate


class Reads(S3Base):
    """The read side of the S3 origin."""

    def stat(self, path: str) -> Entry:
        if not path:
            return self._dir_entry("")
        meta = self._head(path)
        if meta is not None:
            return self._file_entry(split(path)[1], meta, self._mode_of(path, meta))
        if self._is_dir(path):
            return self._dir_entry(split(path)[1])
        raise NotFound(f"{self._where(path)}: not found")

    def list(self, path: str) -> builtins.list[Entry]:
        try:
            res = obstore.list_with_delimiter(self._store, path or None)
        except Exception as exc:
            raise translate(exc, self._where(path)) from None
        cut = len(path) + 1 if path else 0
        out: dict[str, Entry] = {}
        for p in res["common_prefixes"]:
            name = p[cut:]
            if name:
                out[name] = self._dir_entry(name)
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
            mode = self._known_mode(p, meta.get("e_tag") or "")
            if mode is None and not self.list_heads:
                mode = self.default_mode
            if mode is None:
                unknown.append((name, meta))
            else:
                out[name] = self._file_entry(name, meta, mode)
        for name, seen, mode in self._modes_of(unknown):
            out[name] = self._file_entry(name, seen, mode)
        if not out and not has_marker and path:
            if self._head(path) is not None:
                raise NotADir(f"{self._where(path)}: not a directory")
            raise NotFound(f"{self._where(path)}: not found")
        return builtins.list(out.values())

    def _modes_of(
        self, listed: builtins.list[tuple[str, Mapping[str, Any]]]
    ) -> builtins.list[tuple[str, Mapping[str, Any], int]]:
        """The modes of listed objects this origin has not seen yet: one HEAD each, in
        parallel (an object gone meanwhile is left out; one that changed keeps the listed
        size and version, with the mode of what the HEAD saw: never wider than stored)."""
        if not listed:
            return []

        def one(item: tuple[str, Mapping[str, Any]]) -> tuple[str, Mapping[str, Any], int] | None:
            name, meta = item
            head = self._head(meta["path"])
            if head is None:
                return None
            return name, meta, self._mode_of(meta["path"], head)

        if len(listed) == 1:
            found = [one(listed[0])]
        else:
            with ThreadPoolExecutor(min(LIST_HEADS, len(listed))) as pool:
                found = builtins.list(pool.map(one, listed))
        return [f for f in found if f is not None]

    def read_range(self, path: str, offset: int, size: int, version: str | None = None) -> bytes:
        where = self._where(path)
        if size <= 0:
            self._check_version(path, version)
            return b""
        options: GetOptions = {"range": (offset, offset + size)}
        if version is not None:
            options["if_match"] = version
        try:
            res = obstore.get(self._store, path, options=options)
            if version is not None and res.meta.get("e_tag") != version:
                raise Conflict(f"{where}: changed at the origin (version {version} is gone)")
            return bytes(res.bytes())
        except Exception as exc:
            if status_of(exc) == 416:  # offset at or past the end of the object
                past_end = True
            else:
                past_end = False
                err = translate(exc, where)
        if past_end:
            self._check_version(path, version)
            return b""
        if isinstance(err, Conflict):
            raise Conflict(f"{where}: changed at the origin (version {version} is gone)")
        if isinstance(err, NotFound) and self._is_dir(path):
            raise IsADir(f"{where}: is a directory")
        raise err

    def _check_version(self, path: str, version: str | None) -> None:
        meta = self._head(path)
        if meta is None:
            if self._is_dir(path):
                raise IsADir(f"{self._where(path)}: is a directory")
            raise NotFound(f"{self._where(path)}: not found")
        if version is not None and meta.get("e_tag") != version:
            raise Conflict(
                f"{self._where(path)}: changed at the origin (version {version} is gone)"
            )

    def readlink(self, path: str) -> str:
        raise NotSupported(f"{self._where(path)}: symbolic links are not supported on S3 origins")

    def statfs(self) -> FsStats:
        return FsStats(
            block_size=4096,
            total_blocks=1 << 40,
            free_blocks=1 << 40,
            total_files=1 << 40,
            free_files=1 << 40,
        )
