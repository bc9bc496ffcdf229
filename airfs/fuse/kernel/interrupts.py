"""Which interrupted requests the kernel transport gives up on.

The kernel sends ``FUSE_INTERRUPT`` for a request whose caller got *any* signal while it
waited, and then keeps waiting for the answer: what the daemon replies is what the caller's
system call returns. A signal with a handler (SIGCHLD from a finished child — torch's
DataLoader installs one —, SIGALRM, SIGUSR1, Python's SIGINT) is not a request to fail the
call: a local file system never answers ``opendir``, ``stat`` or ``read`` with EINTR, and most
programs (Python's ``os.scandir``, C code relying on ``SA_RESTART``) do not retry it. So an
interrupted request is given up (answered EINTR) only when its caller is being killed: a
fatal signal (SIGKILL, or one whose default action ends the process) has made the kernel add
SIGKILL to the pending set of every thread of that process, which ``/proc/TID/status``
shows. Any other interrupt is counted and the request answered normally.
"""

from __future__ import annotations

import signal

_SIGKILL_BIT = 1 << (signal.SIGKILL - 1)


def caller_dying(tid: int) -> bool:
    """Whether thread ``tid`` (the ``pid`` of a FUSE request header, in the daemon's pid
    namespace) has SIGKILL pending, or no longer exists (nobody waits for the answer). A
    ``tid`` of 0 (a caller outside the daemon's pid namespace) cannot be checked: False."""
    if tid <= 0:
        return False
    try:
        with open(f"/proc/{tid}/status", "rb") as f:
            for line in f:
                if line.startswith((b"SigPnd:", b"ShdPnd:")) and (
                    int(line.split()[1], 16) & _SIGKILL_BIT
                ):
                    return True
    except (FileNotFoundError, ProcessLookupError):
        return True
    except OSError:
        return False
    return False
