"""Fixtures for the tables tests.

* ``table_dir``: where a test writes its tables: a plain directory, and the same test body again
  through a real airfs mount of a directory origin (torn down after the test);
* the session-wide ``seaweed``, ``origin_spec`` and ``volume`` fixtures of ``tests/conftest.py``
  run the mounted tests over POSIX and S3 origins;
* ``dist_pool(n)``: a shared gloo group of ``n`` forked processes (``tests/torch/distpool.py``).

Tests marked ``slow`` here are skipped unless ``AIRFS_SLOW_TESTS=1``.
"""

from __future__ import annotations

import importlib.util
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

_missing = [m for m in ("pyarrow", "deltalake", "torch") if importlib.util.find_spec(m) is None]
if _missing:  # the tables extra (and torch) are optional
    collect_ignore_glob = ["test_*.py"]

sys.path.insert(0, str(Path(__file__).parent.parent / "torch"))  # distpool, shared with torch



@pytest.fixture(scope="module")
def _module_mount(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One real airfs mount (of a directory origin) per test module, torn down after it."""
    from airfs.testing.mountfix import fuse_available, mount, teardown

    if not fuse_available():
        pytest.skip("needs /dev/fuse and fusermount3")
    tmp = tmp_path_factory.mktemp("tables-mount")
    origin, mnt = tmp / "origin", tmp / "volume"
    origin.mkdir()
    mnt.mkdir()
    m = mount(str(origin), mnt, tmp / "airfs-cache")
    try:
        yield mnt
    finally:
        teardown(m)


@pytest.fixture(params=["dir", pytest.param("mount", marks=pytest.mark.mount)])
def table_dir(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    """A fresh directory to write tables in: plain, then (same test body) a new directory on
    the module's airfs mount."""
    if request.param == "dir":
        d = tmp_path / "volume"
        d.mkdir()
        return d
    root: Path = request.getfixturevalue("_module_mount")
    d = root / f"{request.node.name.replace('[', '-').rstrip(']')}-{uuid.uuid4().hex[:8]}"
    d.mkdir()
    return d


@pytest.fixture(scope="session")
def dist_pool() -> Iterator[Callable[[int], object]]:
    """``dist_pool(n)``: a shared gloo group of ``n`` forked processes (made on first use,
    remade if a test broke it, closed at the end of the session)."""
    from distpool import shared_pools

    yield from shared_pools()


@pytest.fixture(autouse=True)
def _hf_offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Hugging Face datasets: no hub, a private cache."""
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
