"""Sets and maps of relative paths indexed by directory, so that "what is in this directory"
and "what is at or under this directory" cost O(answer + depth), not O(everything known).

Paths are the origin's relative paths (``""`` the root, ``"a/b"``; no leading or trailing
slash). :class:`PathIndex` is the index itself; :class:`PathDict` is a ``dict`` that keeps
one in step with its keys, whichever way they are set or deleted, so code that writes
``d[path] = x`` / ``del d[path]`` needs no change to stay indexed.

Cost: adding or removing a path touches each of its ancestors once (O(depth)). Not
thread-safe (the trio loop owns every user).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

V = TypeVar("V")


def _parent(path: str) -> str:
    return path.rpartition("/")[0]


class PathIndex:
    """A set of paths with, per directory, its members directly inside and its
    subdirectories that have members below them."""

    __slots__ = ("_below", "_files", "_members", "_subdirs")

    def __init__(self, paths: Iterable[str] = ()) -> None:
        self._members: set[str] = set()
        #: directory -> its members directly inside (insertion order)
        self._files: dict[str, dict[str, None]] = {}
        #: directory -> its child directories that have members at any depth below them
        self._subdirs: dict[str, dict[str, None]] = {}
        #: directory -> how many members are strictly below it
        self._below: dict[str, int] = {}
        for p in paths:
            self.add(p)

    def __len__(self) -> int:
        return len(self._members)

    def __contains__(self, path: object) -> bool:
        return path in self._members

    def __iter__(self) -> Iterator[str]:
        return iter(self._members)

    def add(self, path: str) -> None:
        if path in self._members:
            return
        self._members.add(path)
        if not path:
            return  # the root is nobody's child
        self._files.setdefault(_parent(path), {})[path] = None
        d = path
        while d:
            d = _parent(d)
            n = self._below.get(d, 0)
            self._below[d] = n + 1
            if n == 0 and d:
                self._subdirs.setdefault(_parent(d), {})[d] = None

    def discard(self, path: str) -> None:
        if path not in self._members:
            return
        self._members.discard(path)
        if not path:
            return
        parent = _parent(path)
        files = self._files[parent]
        del files[path]
        if not files:
            del self._files[parent]
        d = path
        while d:
            d = _parent(d)
            n = self._below[d] - 1
            if n:
                self._below[d] = n
                continue
            del self._below[d]
            if d:
                up = _parent(d)
                subs = self._subdirs[up]
                del subs[d]
                if not subs:
                    del self._subdirs[up]

    def clear(self) -> None:
        self._members.clear()
        self._files.clear()
        self._subdirs.clear()
        self._below.clear()

    def children(self, directory: str) -> list[str]:
        """Members directly inside ``directory``."""
        return list(self._files.get(directory, ()))

    def under(self, directory: str) -> list[str]:
        """Members equal to ``directory`` or anywhere below it (every member for the root)."""
        out = [directory] if directory in self._members else []
        stack = [directory]
        while stack:
            d = stack.pop()
            out.extend(p for p in self._files.get(d, ()) if p != directory)
            stack.extend(self._subdirs.get(d, ()))
        return out

    def has_under(self, directory: str) -> bool:
        """Whether some member is strictly below ``directory``."""
        return directory in self._below


class PathDict(dict[str, V]):
    """A ``dict`` keyed by path whose keys are kept in a :class:`PathIndex` (``index``)."""

    def __init__(self) -> None:
        super().__init__()
        self.index = PathIndex()

    def __setitem__(self, path: str, value: V) -> None:
        super().__setitem__(path, value)
        self.index.add(path)

    def __delitem__(self, path: str) -> None:
        super().__delitem__(path)
        self.index.discard(path)

    def pop(self, path: str, /, *default: Any) -> Any:
        if path in self:
            value = super().pop(path)
            self.index.discard(path)
            return value
        if default:
            return default[0]
        raise KeyError(path)

    def popitem(self) -> tuple[str, V]:
        path, value = super().popitem()
        self.index.discard(path)
        return path, value

    def setdefault(self, path: str, default: V, /) -> V:
        if path not in self:
            self[path] = default
        return self[path]

    def update(self, *args: Any, **kwargs: V) -> None:
        for k, v in dict(*args, **kwargs).items():
            self[k] = v

    def __ior__(self, other: Any) -> PathDict[V]:  # type: ignore[override,misc]
        self.update(other)
        return self

    def clear(self) -> None:
        super().clear()
        self.index.clear()

    def children(self, directory: str) -> list[str]:
        """Keys directly inside ``directory``."""
        return self.index.children(directory)

    def under(self, directory: str) -> list[str]:
        """Keys equal to ``directory`` or below it (every key for the root)."""
        return self.index.under(directory)
