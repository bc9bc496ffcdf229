"""Multipart uploads that a :class:`~airfs.origin.base.PutCancel` stops
(``Capabilities.cancel_puts``): what lets a rename or unlink of a file whose commit is
uploading go on at once instead of waiting for the whole upload.

The upload is obstore's (``put_async``, run on an event loop of its own in the calling worker
thread), reading the file through :class:`StoppableFile`. Once the cancel is set:

* if the end of the file has not been read yet, no later read succeeds (the file *refuses*,
  under the lock its reads take), so the upload can never be completed: its task is dropped
  at once, the parts in flight with it, and ``abort_own`` aborts the upload left behind (the
  object never appears; if that fails, it is logged and the daemon's clean-up of old uploads
  aborts it later); without ``abort_own`` (no signing client to find the upload) the
  upload goes on to its next read, which fails, and obstore aborts it itself (slower: the
  parts in flight are sent first);
* if the end has been read, the completion may be under way: the upload is let finish, and
  the put returns as if never cancelled. obstore reads up to ``max_concurrency`` parts ahead
  of those it has sent, so this is the case for the last ``max_concurrency x chunk_size``
  bytes of a file (128 MiB with the S3 origin's defaults): a stop is quick for an upload
  of a big file until its last 128 MiB, and never for a file not much bigger than that.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import io
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import obstore

from ..base import PutCancel

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer

__all__ = ["POLL_S", "StoppableFile", "stoppable_multipart"]

log = logging.getLogger(__name__)

#: how often a running upload looks at its cancel
POLL_S = 0.02


class StoppableFile(io.RawIOBase):
    """A local file read by an upload, which can be made to refuse every later read
    (:meth:`refuse`) unless its end has been read already."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self._f = open(path, "rb", buffering=0)  # noqa: SIM115 (closed by close())
        self._lock = threading.Lock()
        self.eof = False
        #: reads refused from now on (:meth:`refuse`)
        self.refused = False

    def refuse(self) -> bool:
        """Refuse every later read; False (and nothing refused) if the end of the file has
        been read: the upload may be completing."""
        with self._lock:
            if not self.eof:
                self.refused = True
            return self.refused

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        return self._f.seek(offset, whence)

    def tell(self) -> int:
        return self._f.tell()

    def read(self, size: int = -1) -> bytes:
        """What obstore calls (a part's worth at a time): ``os.read`` into a new ``bytes``,
        the copy made with the GIL released (``RawIOBase.read`` would zero a buffer and copy
        it again with the GIL held, stalling the trio loop for each part)."""
        with self._lock:
            if self.refused:
                raise OSError(errno.ECANCELED, "upload cancelled")
            data = self._f.readall() if size < 0 else os.read(self._f.fileno(), size)
            if size < 0 or len(data) < size:  # (a short read of a file: its end; never
                self.eof = True  # relying on a reader asking once more for nothing)
            return data

    def readinto(self, b: WriteableBuffer) -> int:
        with self._lock:
            if self.refused:
                raise OSError(errno.ECANCELED, "upload cancelled")
            n = self._f.readinto(b) or 0
            if n < memoryview(b).nbytes:
                self.eof = True
            return n

    def close(self) -> None:
        self._f.close()
        super().close()


def stoppable_multipart(
    store: Any,
    key: str,
    body: Path,
    cancel: PutCancel,
    abort_own: Callable[[], object] | None,
    **put_kw: Any,
) -> dict[str, Any] | None:
    """``obstore.put(store, key, body, use_multipart=True, **put_kw)``, stopped by
    ``cancel`` as the module docstring says. Returns obstore's result, or None when it was
    stopped (nothing published). Raises obstore's exceptions otherwise."""
    src = StoppableFile(body)

    async def run() -> dict[str, Any] | None:
        task = asyncio.ensure_future(
            obstore.put_async(store, key, src, use_multipart=True, **put_kw)
        )
        while True:
            done, _ = await asyncio.wait({task}, timeout=POLL_S)
            if done:
                return dict(task.result())
            if cancel.cancelled and src.refuse() and abort_own is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
                return None

    try:
        res = asyncio.run(run())
    except Exception:
        if src.refused:  # our refusal failed it (obstore aborted the upload)
            return None
        raise
    finally:
        src.close()
    if res is None and abort_own is not None:
        try:
            abort_own()
        except Exception as exc:  # the put is stopped all the same: it can never complete
            log.warning(
                "%s: could not abort a stopped upload (its parts stay until the next mount's "
                "clean-up of uploads older than an hour): %s",
                key,
                exc,
            )
    return res
