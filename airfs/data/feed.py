"""Where a :class:`~airfs.data.VolumeDataset`'s paths come from, ahead of the consumer.

- :func:`mount_paths`: the files are on an airfs mount. The mount's own paths are yielded, and
  the mount's daemon is asked (through :func:`airfs.control.client.prefetch`, from one
  background thread) to prefetch the next ``window`` files, a new request whenever fewer than
  half a window remain requested ahead. If a request fails, a warning is logged once per mount
  and no more requests are sent; iteration goes on.
- :func:`cached_paths`: anywhere else. A pool of ``copy_threads`` threads copies up to
  ``prefetch_files`` files ahead into a :class:`~airfs.data.localcache.LocalCache`, and the
  copies' paths are yielded in order (the source path when a file is too large to cache). Copy
  errors propagate at the file they belong to.

Both are generators: closing one cancels the requests or copies not yet started. Both count
into a :class:`~airfs.data.stats.WorkerCounters`.
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

from ..control import client
from .listing import Entry
from .localcache import LocalCache, warn_once
from .stats import BYTES, COPIES, HITS, PREFETCH, WAIT_NS, WorkerCounters


def mount_paths(
    root: str, entries: Sequence[Entry], mountpoint: str, window: int, counters: WorkerCounters
) -> Iterator[str]:
    """The paths of ``entries`` under ``root`` (on the mount at ``mountpoint``), prefetching."""
    paths = [os.path.join(root, rel) for rel, _, _ in entries]
    requested = 0
    enabled = True
    sent: deque[Future[None]] = deque()
    with ThreadPoolExecutor(1, thread_name_prefix="airfs-prefetch") as pool:
        try:
            for i, path in enumerate(paths):
                while sent and sent[0].done():
                    exc = sent.popleft().exception()
                    if exc is not None and enabled:
                        enabled = False
                        warn_once(
                            f"prefetch:{mountpoint}",
                            f"airfs: cannot ask the daemon of {mountpoint} to prefetch "
                            f"({exc}); reading without prefetch",
                        )
                if enabled and requested < len(paths) and requested - i <= max(1, window // 2):
                    end = min(len(paths), i + window)
                    sent.append(pool.submit(client.prefetch, mountpoint, paths[requested:end]))
                    counters.local[PREFETCH] += 1
                    counters.flush()
                    requested = end
                yield path
        finally:
            for fut in sent:
                fut.cancel()


def cached_paths(
    root: str,
    entries: Sequence[Entry],
    cache: LocalCache,
    namespace: str,
    *,
    copy_threads: int,
    prefetch_files: int,
    counters: WorkerCounters,
) -> Iterator[str]:
    """The paths of local copies of ``entries`` under ``root``, in ``cache`` under
    ``namespace``, copied by ``copy_threads`` threads up to ``prefetch_files`` ahead."""
    pending: deque[tuple[int, str, Future[tuple[str, bool]]]] = deque()
    todo = iter(entries)
    with ThreadPoolExecutor(copy_threads, thread_name_prefix="airfs-copy") as pool:

        def fill() -> None:
            while len(pending) < prefetch_files:
                entry = next(todo, None)
                if entry is None:
                    return
                rel, size, mtime_ns = entry
                src = os.path.join(root, rel)
                dest = cache.path_for(namespace, rel)
                fut = pool.submit(cache.get, src, dest, size, mtime_ns)
                pending.append((size, src, fut))

        try:
            fill()
            while pending:
                size, src, fut = pending.popleft()
                t0 = time.perf_counter_ns()
                path, hit = fut.result()
                counters.local[WAIT_NS] += time.perf_counter_ns() - t0
                if hit:
                    counters.local[HITS] += 1
                elif path != src:  # copied now (path == src: too large to cache)
                    counters.local[COPIES] += 1
                    counters.local[BYTES] += size
                fill()
                yield path
        finally:
            for _, _, fut in pending:
                fut.cancel()
