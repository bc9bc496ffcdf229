"""Fixtures for the origin conformance suite: the same tests run on every origin.

* ``posix``: :class:`PosixOrigin` on a fresh temporary directory;
* ``memory``: :class:`MemoryOrigin`;
* ``s3``: :class:`S3Origin` on a real SeaweedFS server (one per test session, started on
  127.0.0.1 and always stopped at the end), a fresh key prefix per test.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from airfs.origin.base import Entry, Origin
from airfs.origin.posix import PosixOrigin
from airfs.origin.s3 import S3Origin
from airfs.testing.memory import MemoryOrigin
from airfs.testing.seaweed import SeaweedServer


def new_s3_origin(srv: SeaweedServer, **kwargs: Any) -> S3Origin:
    """An :class:`S3Origin` on a fresh prefix of the session's bucket."""
    return S3Origin.from_url(srv.url(f"t-{uuid.uuid4().hex[:12]}"), env=srv.env, **kwargs)


@pytest.fixture
def s3_origin_factory(seaweed: SeaweedServer) -> Iterator[Callable[..., S3Origin]]:
    """Make S3 origins on fresh prefixes (closed at the end of the test)."""
    made: list[S3Origin] = []

    def make(**kwargs: Any) -> S3Origin:
        o = new_s3_origin(seaweed, **kwargs)
        made.append(o)
        return o

    yield make
    for o in made:
        o.close()


@dataclass
class Case:
    """An origin under test, with what it is able to do."""

    name: str
    origin: Origin
    tmp: Path
    symlinks: bool  # symlink/readlink work
    modes: bool  # set_attrs stores the mode
    strict_parents: bool  # put into a missing parent directory fails (not implied)
    mtimes: bool = True  # set_attrs stores the mtime
    dir_attrs: bool = True  # mkdir/set_attrs keep a directory's mode and owner

    def put_bytes(self, path: str, data: bytes, if_match: str | None = None) -> Entry:
        src = self.tmp / f"src-{uuid.uuid4().hex}"
        src.write_bytes(data)
        try:
            return self.origin.put(path, str(src), if_match)
        finally:
            src.unlink()

    def read_all(self, path: str, version: str | None = None) -> bytes:
        size = self.origin.stat(path).size
        return self.origin.read_range(path, 0, size + 1, version)


@pytest.fixture(params=["posix", "memory", pytest.param("s3", marks=pytest.mark.s3)])
def case(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Case]:
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    origin: Origin
    if request.param == "posix":
        root = tmp_path / "root"
        root.mkdir()
        origin = PosixOrigin(str(root))
        c = Case("posix", origin, scratch, symlinks=True, modes=True, strict_parents=True)
    elif request.param == "memory":
        origin = MemoryOrigin()
        c = Case("memory", origin, scratch, symlinks=True, modes=True, strict_parents=True)
    else:
        srv = request.getfixturevalue("seaweed")
        s3 = new_s3_origin(srv)
        origin = s3
        c = Case("s3", origin, scratch, symlinks=False, modes=True, strict_parents=False)
        # SeaweedFS drops the metadata of directory markers (AWS S3 and MinIO keep it)
        c.dir_attrs = s3.client.marker_meta_kept()
    try:
        yield c
    finally:
        origin.close()


@pytest.fixture
def origin(case: Case) -> Origin:
    return case.origin
