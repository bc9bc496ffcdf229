"""A test hook: kill the process at a named point, to test what a crash there leaves.

``AIRFS_CRASH_AT=NAME`` in a daemon's environment makes :func:`crash_point` ``NAME`` send the
process SIGKILL (as ``kill -9`` would, with nothing flushed or cleaned up). The variable is read
once, at import; without it every point is a no-op (one string comparison). The points:

* ``put-before-publish``: an origin's put has done everything but make its object visible at
  the name (POSIX: the temporary file is written, fsynced and its precondition checked, not
  yet renamed over the name; S3: the PUT is about to be sent);
* ``put-after-publish``: the object is at the name (POSIX: renamed; S3: the PUT answered),
  the put has not returned (so the journal does not know the commit landed).
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
