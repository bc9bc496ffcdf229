"""What both FUSE adapters answer a request that failed (``airfs.fuse.policy``)."""

from __future__ import annotations

import errno
import logging

import pytest

from airfs.fuse.policy import failure_errno
from airfs.origin.base import NotFound

log = logging.getLogger("airfs.test.policy")


def test_an_origin_error_answers_its_own_errno() -> None:
    assert failure_errno(log, "lookup", NotFound("x: not found")) == errno.ENOENT
    assert failure_errno(log, "open", OSError(errno.EACCES, "no")) == errno.EACCES


@pytest.mark.expect_log(r"lookup failed")
def test_an_error_built_wrong_answers_eio_instead_of_ending_the_session() -> None:
    """An ``OSError`` whose errno is not a number (arguments swapped: the message first)
    used to be answered as is: the reply could not be encoded and the daemon died."""
    bad = OSError("s3://b/new\nline: not a valid S3 key", errno.EINVAL)
    assert not isinstance(bad.errno, int)
    assert failure_errno(log, "lookup", bad) == errno.EIO
    assert failure_errno(log, "lookup", ValueError("a bug")) == errno.EIO
