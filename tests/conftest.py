"""Fixtures shared by every test layer.

* ``seaweed``: one real SeaweedFS S3 server for the session (127.0.0.1, stopped by PID);
* ``origin_spec``: an empty origin to mount, parametrised over ``posix`` (a directory) and
  ``s3`` (a fresh prefix of the SeaweedFS bucket), with a synchronous view of it for checks;
* ``volume``: a real airfs mount of that origin, torn down after the test.
"""

from __future__ import annotations

import logging
import os
import re
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from airfs.origin.posix import PosixOrigin
from airfs.testing.fixtures import OriginSpec, Volume
from airfs.testing.mountfix import fuse_available, teardown_all
from airfs.testing.seaweed import SeaweedServer, find_weed, seaweed_server


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``slow`` run only with ``AIRFS_SLOW_TESTS=1``."""
    if os.environ.get("AIRFS_SLOW_TESTS") == "1":
        return
    skip = pytest.mark.skip(reason="slow test: set AIRFS_SLOW_TESTS=1 to run it")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


class _ErrorRecords(logging.Handler):
    """Collects what airfs logged at ERROR or above (or with a traceback) in one test."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno >= logging.ERROR or record.exc_info:
            self.records.append(record)


@pytest.fixture(autouse=True)
def airfs_log_check(request: pytest.FixtureRequest) -> Iterator[None]:
    """The in-process counterpart of the mounted tests' daemon-log check: a test fails if
    code under ``airfs`` logged an error or a traceback that it did not declare with
    ``@pytest.mark.expect_log("regex", ...)`` (matched against the message and traceback)."""
    handler = _ErrorRecords()
    logger = logging.getLogger("airfs")
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)
    patterns = [
        re.compile(p) for m in request.node.iter_markers("expect_log") for p in m.args
    ]
    bad = []
    for r in handler.records:
        text = r.getMessage()
        if r.exc_info:
            text += "\n" + logging.Formatter().formatException(r.exc_info)
        if not any(p.search(text) for p in patterns):
            bad.append(f"{r.name} {r.levelname}: {text}")
    if bad:
        pytest.fail("unexpected in the log:\n" + "\n".join(bad[:5]), pytrace=False)


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
