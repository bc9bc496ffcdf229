"""Fixtures shared by every test layer.

* ``seaweed``: one real SeaweedFS S3 server for the session (127.0.0.1, stopped by PID);
* ``origin_spec``: an empty origin to mount, parametrised over ``posix`` (a directory) and
  ``s3`` (a fresh prefix of the SeaweedFS bucket), with a synchronous view of it for checks;
* ``volume``: a real airfs mount of that origin, torn down after the test.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from airfs.origin.posix import PosixOrigin
from airfs.testing.fixtures import OriginSpec, Volume
from airfs.testing.mountfix import fuse_available, teardown_all
from airfs.testing.seaweed import SeaweedServer, find_weed, seaweed_server


@pytest.fixture(scope="session")
def seaweed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedServer]:
    """One SeaweedFS server for the session (stopped at the end even if tests fail)."""
    try:
        find_weed()
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    with seaweed_server(tmp_path_factory.mktemp("seaweed")) as srv:
        yield srv


@pytest.fixture(params=["posix", pytest.param("s3", marks=pytest.mark.s3)])
def origin_spec(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[OriginSpec]:
    if request.param == "posix":
        d = tmp_path / "origin"
        d.mkdir()
        view = PosixOrigin(str(d))
        yield OriginSpec("posix", str(d), {}, [], view, d)
        view.close()
        return
    from airfs.origin.s3 import S3Origin

    srv: SeaweedServer = request.getfixturevalue("seaweed")
    url = srv.url(f"m-{uuid.uuid4().hex[:12]}")
    view = S3Origin.from_url(url, env=srv.env)
    yield OriginSpec("s3", url, dict(srv.env), ["--s3-endpoint", srv.endpoint], view)
    view.close()


@pytest.fixture
def make_volume(origin_spec: OriginSpec, tmp_path: Path) -> Iterator[Callable[..., Volume]]:
    """Mount the parametrised origin (extra mount arguments allowed); torn down after."""
    if not fuse_available():
        pytest.skip("needs /dev/fuse and fusermount3")
    made: list[Volume] = []

    def make(*extra: str) -> Volume:
        (tmp_path / "mnt").mkdir(exist_ok=True)
        v = Volume(origin_spec, tmp_path, None, list(extra))  # type: ignore[arg-type]
        v.m = v.mount()
        made.append(v)
        return v

    yield make
    teardown_all(v.m for v in made)


@pytest.fixture
def volume(make_volume: Callable[..., Volume]) -> Volume:
    return make_volume()
