"""Test fixtures' value types: an origin to mount and a mounted volume (used by
``tests/conftest.py`` and by the tests that receive them)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from airfs.origin.base import Origin

from .mountfix import Mounted, mount, teardown


@dataclass
class OriginSpec:
    """An origin to mount: ``spec`` for ``--origin``, the environment and extra mount
    arguments it needs, and ``view``, a synchronous origin on the same data for assertions."""

    kind: str
    spec: str
    env: dict[str, str]
    args: list[str]
    view: Origin
    dir: Path | None = None  # the directory, for posix


@dataclass
class Volume:
    """A mounted origin. ``remount`` unmounts (draining) and mounts again on the same cache."""

    spec: OriginSpec
    tmp: Path
    m: Mounted
    extra: list[str] = field(default_factory=list)

    @property
    def root(self) -> Path:
        return self.m.mountpoint

    def remount(self, *extra: str) -> Mounted:
        self.m.umount()
        teardown(self.m)
        self.m = self.mount(*extra)
        return self.m

    def mount(self, *extra: str) -> Mounted:
        return mount(
            self.spec.spec,
            self.tmp / "mnt",
            self.tmp / "cache",
            *self.spec.args,
            *self.extra,
            *extra,
            env=self.spec.env,
        )

    def origin_put(self, rel: str, data: bytes) -> None:
        """Write ``rel`` at the origin itself (another writer than this mount)."""
        src = self.tmp / "origin-put.tmp"
        src.write_bytes(data)
        try:
            self.spec.view.put(rel, str(src))
        finally:
            src.unlink()

    def origin_move(self, rel: str, src: Path) -> None:
        """Move the local file ``src`` to ``rel`` at the origin itself (renamed into a POSIX
        origin, keeping its holes; uploaded to S3 and removed)."""
        if self.spec.dir is not None:
            os.replace(src, self.spec.dir / rel)
        else:
            self.spec.view.put(rel, str(src))
            src.unlink()

    def origin_files(self, rel_dir: str, files: dict[str, bytes]) -> dict[str, bytes]:
        """Write ``files`` (name -> bytes) into the directory ``rel_dir`` at the origin itself
        (made first on a POSIX origin; S3 needs none); returns ``files``."""
        if self.spec.dir is not None:
            (self.spec.dir / rel_dir).mkdir(parents=True, exist_ok=True)
        for name, data in files.items():
            self.origin_put(f"{rel_dir}/{name}", data)
        return files

    def origin_bytes(self, rel: str) -> bytes:
        e = self.spec.view.stat(rel)
        return self.spec.view.read_range(rel, 0, e.size) if e.size else b""
