"""The file listing of a :class:`~airfs.data.VolumeDataset`, and the identities derived from it.
Needs no torch.

- :func:`list_files` lists ``(relative path, size, mtime_ns)`` of the files under a root, once,
  recursively and sorted by relative path: regular files and symlinks to files; directories
  reached through symlinks are not entered; names starting with ``.`` are skipped unless
  ``include_hidden``; ``pattern`` (``fnmatch``, ``*`` also matches ``/``) is matched against the
  relative path and ``keep`` is called with the absolute path. Errors of ``os.scandir``
  (``PermissionError`` included) propagate.
- :func:`fingerprint` identifies a listing by its relative paths (a resume state records it);
  :func:`namespace` names a root's directory in a shared local cache (by its real path).
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import zlib
from collections.abc import Callable, Sequence

Entry = tuple[str, int, int]
"""``(relative path, size, mtime_ns)`` of one listed file."""


def list_files(
    root: str,
    pattern: str | None,
    keep: Callable[[str], bool] | None,
    include_hidden: bool,
) -> list[Entry]:
    """``(relative path, size, mtime_ns)`` of the files under ``root``, sorted by path."""
    out: list[Entry] = []
    stack = [""]
    while stack:
        rel_dir = stack.pop()
        with os.scandir(os.path.join(root, rel_dir)) as it:
            for entry in it:
                if not include_hidden and entry.name.startswith("."):
                    continue
                rel = os.path.join(rel_dir, entry.name) if rel_dir else entry.name
                if entry.is_dir(follow_symlinks=False):
                    stack.append(rel)
                    continue
                if not entry.is_file():
                    continue
                if pattern is not None and not fnmatch.fnmatchcase(rel, pattern):
                    continue
                if keep is not None and not keep(os.path.join(root, rel)):
                    continue
                st = entry.stat()
                out.append((rel, st.st_size, st.st_mtime_ns))
    out.sort()
    return out


def fingerprint(entries: Sequence[Entry]) -> int:
    """A CRC-32 of the listing's relative paths, in order (sizes and mtimes do not count)."""
    return zlib.crc32("\0".join(e[0] for e in entries).encode())


def namespace(root: str) -> str:
    """The name of ``root``'s directory in a local cache: 16 hex digits of its real path's hash."""
    return hashlib.sha256(os.path.realpath(root).encode()).hexdigest()[:16]
