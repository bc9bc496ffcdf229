"""The kernel transport's :class:`~airfs.core.kernelcache.Invalidator`: the core's requests to
drop what the kernel keeps, written to ``/dev/fuse`` by a thread of its own.

Never on the trio loop: ``FUSE_NOTIFY_INVAL_ENTRY`` takes the directory's lock in the kernel,
and a LOOKUP in that directory holds it until the daemon answers; written from the loop, the
notification would wait for a reply the loop can no longer send. The thread writes what it is
given in order; a notification the kernel refuses (ENOENT: it no longer holds that name or
inode) is not an error.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
from collections.abc import Callable

from . import proto

log = logging.getLogger(__name__)

#: a request to the thread: (code, payload); None stops it
_Item = tuple[int, bytes] | None


class Notifier:
    """Writes invalidations to ``fd`` from a daemon thread (started at once); ``close``
    stops it. ``send(code, payload)`` writes one (the session's :meth:`notify`)."""

    def __init__(self, send: Callable[[int, bytes], bool], *, expire_only: bool = False) -> None:
        self._send = send
        #: the kernel can expire a name without dropping its inode (``HAS_EXPIRE_ONLY``)
        self.expire_only = expire_only
        self._q: queue.SimpleQueue[_Item] = queue.SimpleQueue()
        self.sent = 0
        self.refused = 0
        self._thread = threading.Thread(target=self._run, name="airfs-notify", daemon=True)
        self._thread.start()

    def entry(self, parent: int, name: str, *, expire: bool = False) -> None:
        flags = proto.EXPIRE_ONLY if expire and self.expire_only else 0
        payload = proto.inval_entry(parent, os.fsencode(name), flags)
        self._q.put((proto.NOTIFY_INVAL_ENTRY_CODE, payload))

    def inode(self, ino: int, *, pages: bool) -> None:
        payload = proto.inval_inode(ino) if pages else proto.inval_inode(ino, -1, 0)
        self._q.put((proto.NOTIFY_INVAL_INODE_CODE, payload))

    def pages(self, ino: int, off: int, length: int) -> None:
        """Drop the kernel's cached pages of inode ``ino`` in ``[off, off + length)``. The
        kernel also forgets the inode's attributes: the next ``stat`` or read (with
        ``AUTO_INVAL_DATA``) asks the daemon, which answers within its TTL without the
        origin."""
        self._q.put((proto.NOTIFY_INVAL_INODE_CODE, proto.inval_inode(ino, off, length)))

    def close(self, timeout: float = 5.0) -> None:
        """Stop the thread once what it was given is written (at most ``timeout`` s)."""
        self._q.put(None)
        self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            item = self._q.get()
            if item is None:
                return
            if self._send(*item):
                self.sent += 1
            else:
                self.refused += 1
