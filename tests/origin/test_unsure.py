"""What a failed put may have left at the origin (:mod:`airfs.writeback.unsure`), against a
real SeaweedFS (S3: the MD5 ETag is compared) and a POSIX directory (the bytes are read back):
an object with a kept fingerprint is recognised as ours, any other is not, and only ours is
removed by :func:`~airfs.writeback.unsure.drop_leftover`."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path

import pytest
import trio

from airfs.origin.aio import AsyncOrigin
from airfs.origin.base import NotFound, Origin
from airfs.origin.posix import PosixOrigin
from airfs.writeback import unsure


def _fp(data: bytes) -> tuple[int, str]:
    return len(data), hashlib.md5(data, usedforsecurity=False).hexdigest()


@pytest.fixture(params=["s3", "posix"])
def origin(request: pytest.FixtureRequest, tmp_path: Path) -> Origin:
    if request.param == "s3":
        make: Callable[..., Origin] = request.getfixturevalue("s3_origin_factory")
        o = make()
        assert o.capabilities.md5_etag
        return o
    (tmp_path / "origin").mkdir()
    return PosixOrigin(str(tmp_path / "origin"))


def test_only_an_object_with_a_kept_fingerprint_is_ours(origin: Origin, tmp_path: Path) -> None:
    ours, theirs = b"what our failed put sent\n" * 100, b"another writer's bytes!!\n" * 100
    assert len(ours) == len(theirs)  # the size alone tells nothing
    src = tmp_path / "src"

    def put(path: str, data: bytes) -> None:
        src.write_bytes(data)
        origin.put(path, str(src))

    put("mine", ours)
    put("other", theirs)
    a = AsyncOrigin(origin)

    async def main() -> None:
        kept = [_fp(b"an older failed put"), _fp(ours)]
        assert await unsure.holds_one(a, "mine", origin.stat("mine"), kept)
        assert not await unsure.holds_one(a, "other", origin.stat("other"), kept)
        fd = os.open(src, os.O_RDONLY)
        try:
            assert unsure.md5_of_file(fd, len(theirs)) == _fp(theirs)[1]
        finally:
            os.close(fd)
        await unsure.drop_leftover(a, "other", kept)  # not ours: stays
        await unsure.drop_leftover(a, "mine", kept)  # ours: removed
        await unsure.drop_leftover(a, "absent", kept)  # nothing there: nothing to do

    trio.run(main)
    assert origin.read_range("other", 0, 1 << 20) == theirs
    with pytest.raises(NotFound):
        origin.stat("mine")
