"""The pyfuse3 transport keeps libfuse's "reply to a request that is gone" line out of the
error log (it recurred at unmount: a RELEASEDIR answered after the kernel dropped it, which the
mounted tests' log check counted as a daemon error), and keeps every other libfuse error."""

from __future__ import annotations

import logging

import pytest

from airfs.fuse.transport import GoneRequestReplies


def test_gone_request_replies_are_not_errors(caplog: pytest.LogCaptureFixture) -> None:
    log = logging.getLogger("test.pyfuse3.gone")
    log.addFilter(GoneRequestReplies())
    with caplog.at_level(logging.INFO, logger="test.pyfuse3.gone"):
        log.error("fuse_releasedir(): fuse_reply_* failed with No such file or directory")
        log.error("fuse_read(): fuse_reply_* failed with Invalid argument")
        log.error("fuse_release(): something else: No such file or directory")
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == [
        "fuse_read(): fuse_reply_* failed with Invalid argument",
        "fuse_release(): something else: No such file or directory",
    ]
