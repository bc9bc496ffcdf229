"""Writes of fetched parts into cache files that bypass the page cache (``O_DIRECT``).

A cold sequential read fills the cache file with every byte it reads. Written through the page
cache, each of those bytes takes a newly allocated page: a ``memcpy`` plus, later, the kernel's
write-back of the dirty page. On a virtual machine whose freed memory goes back to the host
(free page reporting, a balloon: where this was measured, freed pages are returned within
2-3 s), a page the guest takes again is faulted in by the host first: 2-3 CPU seconds per GiB
written, against 0.2 s into recycled memory and 0.02 s for the same write with ``O_DIRECT``
(the disk's DMA copies from the buffer). The bytes of a part written this way are served to
their reader from the part's buffer (:mod:`airfs.cache.fetch` keeps it until read), so the
page cache is not needed for them at all.

:class:`DirectWriter` writes a part's block-aligned bytes with ``O_DIRECT``: from the part's
own buffer when it is page-aligned (a buffer of :class:`~airfs.cache.buffers.PartBuffers`),
else from one of a few page-aligned bounce buffers (the copy runs in ``memmove`` without the
GIL); the unaligned tail of an object's last part goes through the page cache. It reopens
the cache file through ``/proc/self/fd`` for each write (the shared descriptor keeps its
flags: readers use it). Where the file system refuses ``O_DIRECT`` (tmpfs) or ``/proc`` is
missing, it writes through the page cache from then on.
``AIRFS_DIRECT_WRITES=0`` in the daemon's environment turns it off (and with it the buffers
kept for readers): the page cache then takes every write, as before. Thread-safe.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import mmap
import os
import threading

from .store import write_all

__all__ = ["ALIGN", "DirectWriter"]

log = logging.getLogger(__name__)

#: Offsets and lengths written with O_DIRECT are multiples of this (a page: enough for any
#: logical block size of the disks airfs runs on; the bounce buffers are page-aligned)
ALIGN = 4096


class _PyBuffer(ctypes.Structure):
    """CPython's ``Py_buffer`` (stable ABI): to read the address of a read-only buffer."""

    _fields_ = [
        ("buf", ctypes.c_void_p),
        ("obj", ctypes.py_object),
        ("len", ctypes.c_ssize_t),
        ("itemsize", ctypes.c_ssize_t),
        ("readonly", ctypes.c_int),
        ("ndim", ctypes.c_int),
        ("format", ctypes.c_char_p),
        ("shape", ctypes.c_void_p),
        ("strides", ctypes.c_void_p),
        ("suboffsets", ctypes.c_void_p),
        ("internal", ctypes.c_void_p),
    ]


_get_buffer = ctypes.pythonapi.PyObject_GetBuffer
_get_buffer.argtypes = [ctypes.py_object, ctypes.POINTER(_PyBuffer), ctypes.c_int]
_get_buffer.restype = ctypes.c_int
_release_buffer = ctypes.pythonapi.PyBuffer_Release
_release_buffer.argtypes = [ctypes.POINTER(_PyBuffer)]
_release_buffer.restype = None
_PyBUF_SIMPLE = 0


def address_of(src: bytes | memoryview) -> int:
    """The address of contiguous buffer ``src``'s first byte."""
    view = _PyBuffer()
    if _get_buffer(src, ctypes.byref(view), _PyBUF_SIMPLE) != 0:  # pragma: no cover
        raise BufferError("not a contiguous buffer")
    try:
        return view.buf or 0
    finally:
        _release_buffer(ctypes.byref(view))


def copy_released(dst: mmap.mmap, src: bytes | memoryview, n: int) -> None:
    """Copy the first ``n`` bytes of contiguous buffer ``src`` into ``dst`` with ``memmove``,
    the GIL released (a slice assignment would hold it: ~1 ms per 8 MiB that the trio loop
    waits for)."""
    if n > len(dst) or n > memoryview(src).nbytes:
        raise ValueError("copy larger than a buffer")
    dst_addr = ctypes.addressof(ctypes.c_char.from_buffer(dst))
    ctypes.memmove(dst_addr, address_of(src), n)  # src is held by the caller: still there


class DirectWriter:
    """Writes parts of up to ``max_size`` bytes into cache files with ``O_DIRECT``; at most
    ``buffers`` bounce buffers (callers beyond that wait for one)."""

    def __init__(self, max_size: int, buffers: int) -> None:
        self.max_size = -(-max_size // ALIGN) * ALIGN
        self.enabled = os.environ.get("AIRFS_DIRECT_WRITES", "1") != "0"
        self._free: list[mmap.mmap] = []
        self._made = 0
        self._limit = buffers
        self._cond = threading.Condition()
        self.direct_bytes = 0  # written with O_DIRECT (statistics, counted under the lock)
        self.unbounced_bytes = 0  # of which written from the caller's (aligned) buffer

    def _take(self) -> mmap.mmap:
        with self._cond:
            while not self._free and self._made >= self._limit:
                self._cond.wait()
            if self._free:
                return self._free.pop()
            self._made += 1
        return mmap.mmap(-1, self.max_size)  # page-aligned, recycled: touched once

    def _give(self, buf: mmap.mmap | None, written: int) -> None:
        """Count ``written`` bytes; give back the bounce buffer ``buf`` (None: the caller's
        own aligned buffer was written as it is)."""
        with self._cond:
            self.direct_bytes += written
            if buf is None:
                self.unbounced_bytes += written
                return
            self._free.append(buf)
            self._cond.notify()

    def write(self, fd: int, data: bytes | memoryview, offset: int) -> None:
        """Write all of ``data`` at ``offset`` of the file open as ``fd`` (raises OSError);
        its page-aligned run with ``O_DIRECT`` where possible, the rest through ``fd``."""
        n = memoryview(data).nbytes
        head = n - n % ALIGN if offset % ALIGN == 0 and n <= self.max_size else 0
        if not self.enabled or head == 0:
            write_all(fd, data, offset)
            return
        try:
            dfd = os.open(f"/proc/self/fd/{fd}", os.O_WRONLY | os.O_DIRECT | os.O_CLOEXEC)
        except OSError as exc:
            if exc.errno not in (errno.EINVAL, errno.ENOENT, errno.EOPNOTSUPP):
                raise
            log.info("cache: O_DIRECT writes not available (%s); using the page cache", exc)
            self.enabled = False
            write_all(fd, data, offset)
            return
        aligned = address_of(data) % ALIGN == 0  # a pool buffer (airfs.cache.buffers)
        buf = None if aligned else self._take()
        done = 0
        try:
            if buf is not None:
                copy_released(buf, data, head)
            with memoryview(data if buf is None else buf)[:head] as mv:
                while done < head:
                    done += os.pwrite(dfd, mv[done:], offset + done)
        finally:
            os.close(dfd)
            self._give(buf, done)
        if n > head:
            write_all(fd, memoryview(data)[head:], offset + head)
