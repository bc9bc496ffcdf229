"""Puts that failed but may have landed: their fingerprints, and whether the origin holds one.

A put can land at the origin and still report a failure (its response lost to a timeout or
a reset connection). Until a later commit of the same file lands, the origin may hold those
bytes under the file's name, although the journal says it holds the version before. The
uploader keeps a fingerprint (size, MD5) of every version whose put failed with a transient
error (``PathState.unsure``, journaled with the file's records), so that:

* a later commit *If-Match* the version before is not reported as a conflict when the origin
  holds one of them (:meth:`~airfs.writeback.uploader.Uploader` commits over it);
* a file never committed before that is deleted or renamed locally removes such a leftover
  from its old name (:func:`drop_leftover`), and nothing else: an object that is not one of
  ours (another writer's) is left alone.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re

import trio

from airfs.origin.aio import AsyncOrigin
from airfs.origin.base import Entry, NotFound, OriginError

log = logging.getLogger(__name__)

MD5_ETAG = re.compile(r'^"?([0-9a-fA-F]{32})"?$')
#: bytes read back from the origin at most to compare an object with ours (no MD5 ETag)
COMPARE_MAX = 1 << 30

Fingerprint = tuple[int, str]


def md5_of_file(fd: int, size: int) -> str:
    """MD5 of the first ``size`` bytes of ``fd`` (blocking: run it in a worker thread)."""
    h = hashlib.md5(usedforsecurity=False)
    off = 0
    while off < size:
        data = os.pread(fd, min(8 << 20, size - off), off)
        if not data:
            break
        h.update(data)
        off += len(data)
    return h.hexdigest()


def worth_keeping(size: int) -> bool:
    """Whether a failed put of ``size`` bytes is fingerprinted: not past :data:`COMPARE_MAX`
    (such an object could only be told apart by an MD5 ETag, which S3 gives to single-part
    puts only, and those stop at 64 MiB by default: a multi-GB hash for nothing)."""
    return size <= COMPARE_MAX


async def origin_md5(origin: AsyncOrigin, path: str, entry: Entry) -> str | None:
    """The MD5 of origin object ``entry``: its ETag where that is one, else its bytes read
    back (None past :data:`COMPARE_MAX` or when it cannot be read)."""
    m = MD5_ETAG.match(entry.version)
    if origin.capabilities.md5_etag and m:
        return m.group(1).lower()
    if entry.size > COMPARE_MAX:
        return None
    sync = origin.sync

    def digest() -> str:
        h = hashlib.md5(usedforsecurity=False)
        off = 0
        while off < entry.size:
            data = sync.read_range(path, off, min(8 << 20, entry.size - off), entry.version)
            if not data:
                break
            h.update(data)
            off += len(data)
        return h.hexdigest()

    try:
        return await trio.to_thread.run_sync(digest)
    except OriginError:
        return None


async def holds_one(
    origin: AsyncOrigin, path: str, entry: Entry, unsure: list[Fingerprint]
) -> bool:
    """Whether origin object ``entry`` (at ``path``) has one of the ``unsure`` fingerprints."""
    ours = {digest for size, digest in unsure if size == entry.size}
    return bool(ours) and await origin_md5(origin, path, entry) in ours


async def drop_leftover(origin: AsyncOrigin, path: str, unsure: list[Fingerprint]) -> None:
    """Delete what a failed put of ours may have left at ``path`` (a file never committed,
    deleted or renamed away locally): only an object with one of the ``unsure``
    fingerprints. Errors are logged, never raised (the local operation is done)."""
    if not unsure:
        return
    try:
        entry = await origin.stat(path)
        if await holds_one(origin, path, entry, unsure):
            log.info("%s: removing what a failed commit of ours left at the origin", path)
            await origin.delete(path)
    except NotFound:
        pass
    except OriginError as exc:
        log.error("%s: could not remove what a failed commit left at the origin: %s", path, exc)
