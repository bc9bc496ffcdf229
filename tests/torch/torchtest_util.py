"""Small helpers shared by the torch package tests (no fixtures here: see conftest.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from airfs.control.client import find_mount


def on_mount(path: str | Path) -> bool:
    """Whether ``path`` is on an airfs mount (then VolumeDataset keeps no copy of its own)."""
    return find_mount(str(path)) is not None


def plain_only(path: str | Path, why: str) -> None:
    """Skip the calling test when ``path`` is on an airfs mount."""
    if on_mount(path):
        pytest.skip(f"plain directories only: {why}")


def make_files(root: Path, count: int, size: int = 64, subdirs: int = 3) -> list[Path]:
    """``count`` files under ``root`` spread over ``subdirs`` directories, each ``size`` bytes
    long and starting with its own relative path (so content identifies the file)."""
    out = []
    for i in range(count):
        rel = f"class{i % subdirs}/item{i:05d}.bin"
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        head = rel.encode()
        p.write_bytes((head + b"\0" * max(0, size - len(head)))[: max(size, len(head))])
        out.append(p)
    return out


def identity(path: str) -> str:
    """The relative path a file made by :func:`make_files` names in its content."""
    with open(path, "rb") as f:
        return f.read(64).split(b"\0", 1)[0].decode()


def tree_size(path: Path) -> int:
    """Bytes of the regular files under ``path`` (not counting airfs temp and lock files); may
    run while other processes add and evict files."""
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            if name.startswith(".airfs-"):
                continue
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except FileNotFoundError:  # evicted by a running worker since the listing
                continue
    return total
