"""Big replies written to ``/dev/fuse`` by a thread of their own, not by the trio loop.

A ``READ`` reply of a cold sequential read carries up to 1 MiB; its ``writev`` copies it into
the reader's page-cache pages (new pages, on a VM whose freed memory goes back to its host:
faulted in first), 0.3-0.5 ms during which the loop -- the one thread that reads requests --
answers nothing else. A burst of them (a fetched 8 MiB part wakes eight waiting reads) held
an ``OPEN`` of a cached file for 8-12 ms at p99 (``scripts/bench/cold_s3.py --cached-p99``).

:class:`ReplyWriter` takes such replies from the loop (a queue append and a notify: a few
microseconds) and writes them in order from one thread, which holds the GIL only to take the
next one (``os.writev`` releases it). Contracts:

* a reply's buffers are immutable (``bytes``, views of fetched parts): nothing may change
  them after they are queued (the read paths never reuse a buffer they answered with);
* whatever must reach the kernel before a reply (the take-over state log) is written by the
  caller before :meth:`ReplyWriter.put`;
* a reply the kernel refuses as malformed is answered ``EIO`` instead (as on the loop), one
  for a request that is gone (``ENOENT``) or a device unmounted (``ENODEV``) is dropped;
* :meth:`ReplyWriter.drain` returns once every queued reply is written (a daemon handing its
  connection over, or stopping, calls it); :meth:`ReplyWriter.close` drains and ends the
  thread.
"""

from __future__ import annotations

import collections
import errno
import logging
import os
import threading
import time
from typing import Any

from . import proto

log = logging.getLogger(__name__)

#: replies of at least this many bytes go to the writer thread (smaller ones cost the loop
#: less than the hand-over)
THREAD_MIN = 256 << 10


class ReplyWriter:
    """One thread writing queued replies to the device ``fd`` in their order."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._queue: collections.deque[tuple[int, list[Any]]] = collections.deque()
        self._cv = threading.Condition()
        self._busy = False
        self._closed = False
        #: replies written by the thread, and those the kernel refused (answered EIO)
        self.written = 0
        self.refused = 0
        self._thread = threading.Thread(target=self._run, name="airfs-replies", daemon=True)
        self._thread.start()

    def put(self, unique: int, parts: list[Any]) -> None:
        """Queue one reply (its header first in ``parts``) for request ``unique``."""
        with self._cv:
            self._queue.append((unique, parts))
            self._cv.notify()

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._queue and not self._closed:
                    self._busy = False
                    self._cv.notify_all()  # drain() waits for an idle writer
                    self._cv.wait()
                if not self._queue:
                    self._busy = False
                    self._cv.notify_all()
                    return
                unique, parts = self._queue.popleft()
                self._busy = True
            if not self._write(parts):
                self.refused += 1
                self._write([proto.out_header(unique, -errno.EIO, 0)])
            self.written += 1

    def _write(self, parts: list[Any]) -> bool:
        try:
            os.writev(self.fd, parts)
        except OSError as exc:
            if exc.errno in (errno.ENOENT, errno.ENODEV):
                return True  # the request is gone (interrupted), or the file system
            log.error("writing a reply to /dev/fuse: %s", exc)
            return False
        return True

    def drain(self, timeout: float = 10.0) -> bool:
        """Wait (blocking, at most ``timeout`` s) until every queued reply is written;
        False if some are still queued."""
        end = time.monotonic() + timeout
        with self._cv:
            while self._queue or self._busy:
                left = end - time.monotonic()
                if left <= 0 or not self._thread.is_alive():
                    return False
                self._cv.wait(left)
        return True

    def close(self) -> None:
        """Write what is queued, then end the thread."""
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        self._thread.join(10.0)
