"""Fixtures for the torch package tests.

``volume_dir`` is the directory a test treats as the volume (its origin as the user sees it).
Here it is a plain temporary directory; parametrising this fixture over an airfs mount runs
the same test bodies through the mount.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

if importlib.util.find_spec("torch") is None:  # torch is an optional extra
    collect_ignore_glob = ["test_*.py"]
else:
    from distpool import DistPool, shared_pools


@pytest.fixture(params=["dir", pytest.param("mount", marks=pytest.mark.mount)])
def volume_dir(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Path]:
    """The volume a test reads and writes: a plain directory, and the same test body again
    through a real airfs mount (of a directory origin), torn down after the test."""
    if request.param == "dir":
        d = tmp_path / "volume"
        d.mkdir()
        yield d
        return
    from airfs.testing.mountfix import fuse_available, mount, teardown

    if not fuse_available():
        pytest.skip("needs /dev/fuse and fusermount3")
    origin, mnt = tmp_path / "origin", tmp_path / "volume"
    origin.mkdir()
    mnt.mkdir()
    m = mount(str(origin), mnt, tmp_path / "airfs-cache")
    try:
        yield mnt
    finally:
        teardown(m)


@pytest.fixture
def cache_dir(tmp_path: Path) -> Path:
    """A private local cache directory for VolumeDataset copies."""
    d = tmp_path / "local-cache"
    d.mkdir()
    return d


@pytest.fixture(scope="session")
def dist_pool() -> Iterator[Callable[[int], DistPool]]:
    """``dist_pool(n)``: a shared gloo group of ``n`` forked processes (made on first use,
    remade if a test broke it, closed at the end of the session)."""
    yield from shared_pools()
