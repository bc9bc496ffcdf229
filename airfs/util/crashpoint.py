"""A test hook: kill the process at a named point, to test what a crash there leaves.

``AIRFS_CRASH_AT=NAME`` in a daemon's environment makes :func:`crash_point` ``NAME`` send the
process SIGKILL (as ``kill -9`` would, with nothing flushed or cleaned up). The variable is read
once, at import; without it every point is a no-op (one string comparison). The points:

* ``posix-put-written``: a POSIX origin's put has written and fsynced its temporary file and
  checked its precondition, and has not yet linked it at the name;
* ``posix-put-linked``: the temporary file was renamed over the name, the put has not returned
  (so the journal does not know the commit landed).
"""

from __future__ import annotations

import os
import signal

ENV = "AIRFS_CRASH_AT"
_AT = os.environ.get(ENV, "")


def crash_point(name: str) -> None:
    """SIGKILL this process if ``AIRFS_CRASH_AT`` names ``name`` (see the module docstring)."""
    if _AT and name == _AT:
        os.kill(os.getpid(), signal.SIGKILL)
