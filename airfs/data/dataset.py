"""``VolumeDataset``: the files under a directory as local paths, sharded over ranks and workers.

See :class:`VolumeDataset` for the contract, :mod:`airfs.data.sharding` for who reads what, and
:mod:`airfs.data.localcache` for the copy kept when the directory is not an airfs mount.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import logging
import os
import struct
import tempfile
import time
import zlib
from collections import deque
from collections.abc import Callable, Generator, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import IterableDataset, get_worker_info

from ..catalog.explain import explain
from ..control import client
from . import sharding
from .localcache import LocalCache, _warn_once
from .sharding import UNKNOWN, Layout, Segment, Uneven

log = logging.getLogger("airfs.data")

STATE_VERSION = 1
# Both shared tensors stay below torch's parallel grain size (32768 elements), so that making
# and filling them never enters an OpenMP region: GNU OpenMP hangs in a process forked from one
# that used it, and datasets are often made in forked processes.
_BLOB_CAPACITY = 1 << 14
_SLOTS = 257  # stats rows: DataLoader workers 0..255, then the process that made the dataset
_MAIN_SLOT = _SLOTS - 1
_FILES, _WAIT_NS, _HITS, _COPIES, _BYTES, _PREFETCH = range(6)
_NSTATS = 6


@dataclass(frozen=True)
class DatasetStats:
    """Counters summed over the process that made the dataset and its DataLoader workers."""

    files: int
    """Paths yielded."""
    fetch_wait_s: float
    """Time iterators spent blocked waiting for a file copy to finish (local-cache mode)."""
    cache_hits: int
    """Files already in the local cache (local-cache mode)."""
    origin_copies: int
    """Files copied from the origin into the local cache (local-cache mode)."""
    bytes_copied: int
    prefetch_requests: int
    """Prefetch requests sent to the airfs daemon (mount mode)."""


class VolumeDataset(IterableDataset[str]):
    """An ``IterableDataset`` of local paths of the files under ``root``.

    **Listing.** The files are listed once, here, recursively and sorted by relative path
    (regular files and symlinks to files; directories reached through symlinks are not entered;
    names starting with ``.`` are skipped unless ``include_hidden``). ``pattern`` keeps the
    relative paths matching an ``fnmatch`` pattern (``*`` also matches ``/``: ``"*.jpg"`` means
    every ``.jpg`` at any depth); ``filter`` keeps the absolute paths it returns True for.

    **Sharding.** At iteration time (never here: a dataset made before
    ``init_process_group`` still shards), the rank and world size are read from
    ``torch.distributed`` (or taken from ``rank``/``world_size`` when given), and the worker
    from ``get_worker_info()``. Each epoch's files are spread as :mod:`airfs.data.sharding` says:
    every rank gets the same count, ``uneven="pad"`` repeating a few files and ``"drop"``
    leaving a few out when the count does not divide; within a rank, every file goes to exactly
    one worker. The order is sorted, or with ``shuffle`` a permutation fixed by
    ``(seed, epoch)``; :meth:`set_epoch` picks the epoch (call it before each epoch, as with
    ``DistributedSampler``; it reaches persistent DataLoader workers too).

    **Resume.** :meth:`state_dict` says how far this rank got in the epoch (epoch, seed, and per
    DataLoader worker how many files were consumed); after :meth:`load_state_dict` the next
    iteration over that epoch yields exactly the files not yet yielded, in the same order. With
    workers, take the state from :class:`airfs.data.DataLoader` (it counts consumed batches) or
    torchdata's ``StatefulDataLoader`` (it asks each worker); a state taken in the main process
    of a plain DataLoader with workers does not know their progress. The worker count may change
    between save and resume (except for a per-worker ``StatefulDataLoader`` state); a different
    world size, rank or file listing is refused with a ``RuntimeError`` at iteration.

    **Local files.** If ``root`` is on an airfs mount, the paths yielded are the mount's own:
    the mount caches them, and the dataset asks its daemon to prefetch the next
    ``prefetch_files`` files as iteration proceeds (from a background thread; if the daemon
    cannot be asked, a warning is logged once and iteration goes on without;
    ``mount_prefetch=False`` never asks). Anywhere else, each
    file is copied by a pool of ``copy_threads`` threads, ``prefetch_files`` ahead of the
    consumer, into a :class:`~airfs.data.localcache.LocalCache` under ``cache_dir`` (default:
    ``$AIRFS_DATA_CACHE``, else ``<tmp>/airfs-data-cache-<uid>``; processes may share it)
    bounded by ``cache_max_bytes``, and the copy's path is yielded (relative paths, and so class
    directories, are kept); later epochs use the copy and do not
    read the origin. ``local_cache=False`` yields the origin paths instead. Copy errors propagate.
    The cache must hold what is in flight, or a yielded path may be evicted before it is read:
    per worker about ``(prefetch_factor + 1) * batch_size + prefetch_files`` files.

    Decoding is the job of another dataset that wraps this one (paths in, tensors out).
    """

    # per-process state (set by _init_process_local, also after unpickling in a worker)
    _local_state: dict[str, Any] | None
    _local_progress: _Progress | None
    _progress_source: Callable[[], dict[str, Any]] | None
    _cache: LocalCache | None
    _dist_snapshot: tuple[int, int] | None

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        pattern: str | None = None,
        filter: Callable[[str], bool] | None = None,
        include_hidden: bool = False,
        shuffle: bool = True,
        seed: int = 0,
        uneven: Uneven = "pad",
        rank: int | None = None,
        world_size: int | None = None,
        local_cache: bool = True,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_max_bytes: int | None = None,
        copy_threads: int = 16,
        prefetch_files: int = 64,
        mount_prefetch: bool = True,
    ) -> None:
        if uneven not in ("pad", "drop"):
            raise ValueError(f"uneven must be 'pad' or 'drop', not {uneven!r}")
        if (rank is None) != (world_size is None):
            raise ValueError("give both rank and world_size, or neither")
        if world_size is not None and rank is not None:
            sharding.check_rank(rank, world_size)
        if copy_threads < 1 or prefetch_files < 1:
            raise ValueError("copy_threads and prefetch_files must be >= 1")
        self.root = os.path.abspath(os.fspath(root))
        if not os.path.isdir(self.root):
            raise NotADirectoryError(f"{self.root} is not a directory")
        self.shuffle = shuffle
        self.uneven: Uneven = uneven
        self.local_cache = local_cache
        self.cache_dir = os.path.abspath(
            os.fspath(cache_dir)
            if cache_dir is not None
            else os.environ.get("AIRFS_DATA_CACHE")
            or os.path.join(tempfile.gettempdir(), f"airfs-data-cache-{os.getuid()}")
        )
        self.cache_max_bytes = cache_max_bytes
        self.copy_threads = copy_threads
        self.prefetch_files = prefetch_files
        self.mount_prefetch = mount_prefetch
        self._rank = rank
        self._world_size = world_size
        try:
            self._entries = _list_files(self.root, pattern, filter, include_hidden)
        except PermissionError as exc:  # a governed volume says which privilege is missing
            raise explain(exc, exc.filename or self.root, "read") from exc
        self._fingerprint = zlib.crc32("\0".join(e[0] for e in self._entries).encode())
        self._namespace = hashlib.sha256(os.path.realpath(self.root).encode()).hexdigest()[:16]
        # Shared with DataLoader workers (fork or spawn), so that set_epoch / load_state_dict
        # made in the main process reach persistent workers.
        # (torch leaves Tensor.share_memory_ unannotated)
        self._blob: torch.Tensor = torch.zeros(_BLOB_CAPACITY, dtype=torch.uint8)
        self._blob.share_memory_()  # type: ignore[no-untyped-call]
        self._stats: torch.Tensor = torch.zeros((_SLOTS, _NSTATS), dtype=torch.int64)
        self._stats.share_memory_()  # type: ignore[no-untyped-call]
        self._write_shared(self._fresh_state(epoch=0, seed=seed))
        self._init_process_local()

    # ------------------------------------------------------------------------------- public

    @property
    def files(self) -> tuple[str, ...]:
        """The absolute origin paths of every listed file, sorted."""
        return tuple(os.path.join(self.root, rel) for rel, _, _ in self._entries)

    @property
    def epoch(self) -> int:
        """The epoch the next iteration reads."""
        return int(self._current_state()["epoch"])

    @property
    def seed(self) -> int:
        return int(self._current_state()["seed"])

    def __len__(self) -> int:
        """Files this rank yields in a whole epoch (rank and world size read now)."""
        _rank, world = self._rank_world()
        return sharding.per_rank_count(len(self._entries), world, self.uneven)

    def set_epoch(self, epoch: int) -> None:
        """Read epoch ``epoch`` next. A resume state loaded for another epoch is dropped."""
        state = self._current_state()
        if state["epoch"] == epoch:
            return
        self._set_state(self._fresh_state(epoch=epoch, seed=int(state["seed"])))

    def state_dict(self) -> dict[str, Any]:
        """Where this rank is in the current epoch: plain ints and lists (JSON-able).

        In the main process: the progress of the latest iteration (in-process, or through
        :class:`airfs.data.DataLoader`'s count of consumed batches), else the state as loaded.
        In a DataLoader worker (torchdata's ``StatefulDataLoader`` asks there): that worker's
        position only."""
        if get_worker_info() is None and self._progress_source is not None:
            return self._progress_source()
        if self._local_progress is not None:
            return self._local_progress.state()
        return dict(self._current_state())

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Make the next iteration over ``state["epoch"]`` yield what was not yet yielded.

        Checks the state's form here; the world size, rank and listing are checked against the
        running job at iteration."""
        self._set_state(_validated(state))

    def stats(self) -> DatasetStats:
        """Counters so far, over this process and its DataLoader workers."""
        s = self._stats.sum(dim=0).tolist()
        return DatasetStats(
            files=s[_FILES],
            fetch_wait_s=s[_WAIT_NS] / 1e9,
            cache_hits=s[_HITS],
            origin_copies=s[_COPIES],
            bytes_copied=s[_BYTES],
            prefetch_requests=s[_PREFETCH],
        )

    def __iter__(self) -> Iterator[str]:
        info = get_worker_info()
        worker, num_workers = (info.id, info.num_workers) if info is not None else (0, 1)
        rank, world = self._rank_world()
        state = self._current_state()
        layout, offset = self._layout(state, rank, world, num_workers)
        mine = (worker + offset) % layout.num_workers  # this worker's slice of the layout
        entries = [self._entries[i] for i in layout.worker_items(mine)]
        progress = _Progress(state, layout, rank, world, mine, own_only=info is not None)
        self._local_progress = progress
        if info is None:
            self._progress_source = progress.state
        slot = min(worker, _MAIN_SLOT - 1) if info is not None else _MAIN_SLOT
        counters = _Counters(self._stats, slot)
        mountpoint = client.find_mount(self.root)
        paths: Iterator[str]
        if mountpoint is not None and self.mount_prefetch:
            paths = self._iter_mount(entries, mountpoint, counters)
        elif mountpoint is not None:
            paths = (os.path.join(self.root, rel) for rel, _, _ in entries)
        elif self.local_cache:
            paths = self._iter_cached(entries, counters)
        else:
            paths = (os.path.join(self.root, rel) for rel, _, _ in entries)
        try:
            for path in paths:
                progress.yielded += 1
                counters.local[_FILES] += 1
                counters.tick()
                yield path
        finally:
            if isinstance(paths, Generator):
                paths.close()  # stops copies / prefetch requests now, not at garbage collection
            counters.flush()

    # ------------------------------------------------------------- used by airfs.data.loader

    def _begin_loader_iteration(
        self, num_workers: int, batch_size: int | None, drop_last: bool
    ) -> _LoaderProgress:
        """Called by :class:`airfs.data.DataLoader` in the main process when it starts an
        iteration with ``num_workers`` > 0 workers; the returned tracker is then what
        :meth:`state_dict` reports."""
        rank, world = self._rank_world()
        state = self._current_state()
        layout, offset = self._layout(state, rank, world, num_workers)
        tracker = _LoaderProgress(state, layout, offset, rank, world, batch_size, drop_last)
        self._progress_source = tracker.state
        return tracker

    # ------------------------------------------------------------------------------ private

    def _init_process_local(self) -> None:
        self._local_state = None
        self._local_progress = None
        self._progress_source = None
        self._cache = None
        self._dist_snapshot = getattr(self, "_dist_snapshot", None)

    def __getstate__(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        for key in ("_local_progress", "_progress_source", "_cache"):
            d[key] = None
        # A worker started with "spawn" has no process group: carry the parent's rank.
        snap = _dist_rank_world()
        if snap is not None:
            d["_dist_snapshot"] = snap
        return d

    def __setstate__(self, d: dict[str, Any]) -> None:
        self.__dict__.update(d)
        self._init_process_local()

    def _rank_world(self) -> tuple[int, int]:
        if self._rank is not None and self._world_size is not None:
            return self._rank, self._world_size
        live = _dist_rank_world()
        if live is not None:
            return live
        if self._dist_snapshot is not None:
            return self._dist_snapshot
        return 0, 1

    def _fresh_state(self, *, epoch: int, seed: int) -> dict[str, Any]:
        return {
            "version": STATE_VERSION,
            "epoch": int(epoch),
            "seed": int(seed),
            "rank": None,
            "world_size": None,
            "num_files": len(self._entries),
            "fingerprint": self._fingerprint,
            "history": [],
            "num_workers": 1,
            "positions": [0],
            "worker_offset": 0,
        }

    def _current_state(self) -> dict[str, Any]:
        if self._local_state is not None:
            return self._local_state
        return self._read_shared()

    def _set_state(self, state: dict[str, Any]) -> None:
        self._progress_source = None
        self._local_progress = None
        if get_worker_info() is not None:
            self._local_state = state  # one worker's own: must not clobber the others'
        else:
            self._local_state = None
            self._write_shared(state)

    def _write_shared(self, state: dict[str, Any]) -> None:
        data = json.dumps(state, separators=(",", ":")).encode()
        if len(data) + 8 > _BLOB_CAPACITY:
            raise ValueError(f"dataset state too large ({len(data)} bytes)")
        raw = bytearray(struct.pack("<Q", len(data)) + data)
        self._blob[: len(raw)] = torch.frombuffer(raw, dtype=torch.uint8)

    def _read_shared(self) -> dict[str, Any]:
        (n,) = struct.unpack("<Q", bytes(self._blob[:8].tolist()))
        state = json.loads(bytes(self._blob[8 : 8 + n].tolist()))
        assert isinstance(state, dict)
        return state

    def _layout(
        self, state: dict[str, Any], rank: int, world: int, num_workers: int
    ) -> tuple[Layout, int]:
        """The layout of this iteration, and the layout worker that DataLoader worker 0 takes
        (so that batches come in the order they would have without the interruption)."""
        if state["num_files"] != len(self._entries) or state["fingerprint"] != self._fingerprint:
            raise RuntimeError(
                f"the resume state was made for another listing of {self.root} "
                f"({state['num_files']} files, fingerprint {state['fingerprint']}; now "
                f"{len(self._entries)} files, fingerprint {self._fingerprint})"
            )
        if state["world_size"] is not None and state["world_size"] != world:
            raise RuntimeError(
                f"the resume state was saved with world size {state['world_size']}, the job now "
                f"runs with {world}: resuming mid-epoch needs the same world size (or start the "
                "next epoch: set_epoch(state['epoch'] + 1))"
            )
        if state["rank"] is not None and state["rank"] != rank:
            raise RuntimeError(
                f"the resume state belongs to rank {state['rank']}, loaded on rank {rank}"
            )
        order = sharding.epoch_order(
            len(self._entries), seed=state["seed"], epoch=state["epoch"], shuffle=self.shuffle
        )
        items = sharding.rank_slice(order, rank=rank, world_size=world, uneven=self.uneven)
        layout = sharding.resolve_layout(
            items,
            history=[Segment(int(k), tuple(p)) for k, p in state["history"]],
            num_workers=int(state["num_workers"]),
            positions=[int(p) for p in state["positions"]],
            new_num_workers=max(1, num_workers),
        )
        same = layout.num_workers == state["num_workers"] and not (
            len(layout.history) > len(state["history"])
        )
        return layout, int(state.get("worker_offset", 0)) % layout.num_workers if same else 0

    def _iter_mount(
        self, entries: list[tuple[str, int, int]], mountpoint: str, counters: _Counters
    ) -> Iterator[str]:
        paths = [os.path.join(self.root, rel) for rel, _, _ in entries]
        window = self.prefetch_files
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
                            _warn_once(
                                f"prefetch:{mountpoint}",
                                f"airfs: cannot ask the daemon of {mountpoint} to prefetch "
                                f"({exc}); reading without prefetch",
                            )
                    if enabled and requested < len(paths) and requested - i <= max(1, window // 2):
                        end = min(len(paths), i + window)
                        sent.append(pool.submit(client.prefetch, mountpoint, paths[requested:end]))
                        counters.local[_PREFETCH] += 1
                        counters.flush()
                        requested = end
                    yield path
            finally:
                for fut in sent:
                    fut.cancel()

    def _iter_cached(
        self, entries: list[tuple[str, int, int]], counters: _Counters
    ) -> Iterator[str]:
        if self._cache is None:
            self._cache = LocalCache(self.cache_dir, self.cache_max_bytes)
        cache = self._cache
        pending: deque[tuple[int, str, Future[tuple[str, bool]]]] = deque()
        todo = iter(entries)
        with ThreadPoolExecutor(self.copy_threads, thread_name_prefix="airfs-copy") as pool:

            def fill() -> None:
                while len(pending) < self.prefetch_files:
                    entry = next(todo, None)
                    if entry is None:
                        return
                    rel, size, mtime_ns = entry
                    src = os.path.join(self.root, rel)
                    dest = cache.path_for(self._namespace, rel)
                    fut = pool.submit(cache.get, src, dest, size, mtime_ns)
                    pending.append((size, src, fut))

            try:
                fill()
                while pending:
                    size, src, fut = pending.popleft()
                    t0 = time.perf_counter_ns()
                    path, hit = fut.result()
                    counters.local[_WAIT_NS] += time.perf_counter_ns() - t0
                    if hit:
                        counters.local[_HITS] += 1
                    elif path != src:  # copied now (path == src: too large to cache)
                        counters.local[_COPIES] += 1
                        counters.local[_BYTES] += size
                    fill()
                    yield path
            finally:
                for _, _, fut in pending:
                    fut.cancel()


class _Counters:
    """One iterator's counters: summed locally, added to its row of the shared stats tensor
    every 32 files or 50 ms (a tensor update costs tens of microseconds) and at the end."""

    def __init__(self, shared: torch.Tensor, slot: int) -> None:
        self._shared = shared
        self._slot = slot
        self.local = [0] * _NSTATS
        self._files = 0
        self._last = time.monotonic()

    def tick(self) -> None:
        self._files += 1
        if self._files >= 32 or time.monotonic() - self._last > 0.05:
            self.flush()

    def flush(self) -> None:
        if any(self.local):
            self._shared[self._slot] += torch.tensor(self.local, dtype=torch.int64)
            self.local = [0] * _NSTATS
        self._files = 0
        self._last = time.monotonic()


class _Progress:
    """How far one in-process iterator got (in the main process, or one DataLoader worker)."""

    def __init__(
        self,
        state: dict[str, Any],
        layout: Layout,
        rank: int,
        world: int,
        worker: int,
        *,
        own_only: bool,
    ) -> None:
        self._base = state
        self._layout = layout
        self._rank = rank
        self._world = world
        self._worker = worker
        self._own_only = own_only
        self.yielded = 0

    def state(self) -> dict[str, Any]:
        layout = self._layout
        positions = [UNKNOWN] * layout.num_workers if self._own_only else list(layout.skip)
        positions[self._worker] = layout.skip[self._worker] + self.yielded
        offset = int(self._base.get("worker_offset", 0)) if self._own_only else 0
        return _state_from(self._base, layout, positions, offset, self._rank, self._world)


class _LoaderProgress:
    """Infers per-worker positions from the number of batches a DataLoader has handed out.

    torch's DataLoader with an ``IterableDataset`` and ``in_order=True`` asks its workers for
    batches in turn (worker 0 first) and yields them in that order, skipping a worker once it is
    exhausted; so batch ``k`` comes from a known worker. This holds when the datasets between
    :class:`VolumeDataset` and the loader map each path to exactly one sample.

    DataLoader worker ``j`` serves layout worker ``(offset + j) % K``. The state records, as
    ``worker_offset``, the layout worker whose batch is due next, so that a resumed loader
    hands out the remaining batches in the very order the interrupted one would have."""

    def __init__(
        self,
        state: dict[str, Any],
        layout: Layout,
        offset: int,
        rank: int,
        world: int,
        batch_size: int | None,
        drop_last: bool,
    ) -> None:
        self._base = state
        self._layout = layout
        self._offset = offset
        self._rank = rank
        self._world = world
        k = layout.num_workers
        counts = layout.remaining_counts()
        # indexed by DataLoader worker j
        self._counts = [counts[(offset + j) % k] for j in range(k)]
        self._batch = batch_size or 1
        if batch_size is None:
            per_worker = list(self._counts)
        elif drop_last:
            per_worker = [c // batch_size for c in self._counts]
        else:
            per_worker = [-(-c // batch_size) for c in self._counts]
        self._expected = per_worker
        self._taken = [0] * k
        self._active = [j for j, n in enumerate(per_worker) if n > 0]
        self._next = 0
        self.broken: str | None = None

    def advance(self) -> None:
        """One more batch was handed to the consumer."""
        if not self._active:
            self.broken = "the DataLoader yielded more batches than the dataset's files allow"
            return
        j = self._active[self._next]
        self._taken[j] += 1
        if self._taken[j] == self._expected[j]:
            self._active.pop(self._next)
            if self._next >= len(self._active):
                self._next = 0
        else:
            self._next = (self._next + 1) % len(self._active)

    def finish(self) -> None:
        """The DataLoader's iterator is exhausted."""
        if self._active:
            self.broken = "the DataLoader yielded fewer batches than the dataset's files allow"

    def state(self) -> dict[str, Any]:
        if self.broken is not None:
            raise RuntimeError(
                f"cannot tell how far each worker got: {self.broken}. The datasets wrapping "
                "VolumeDataset must yield exactly one sample per path for airfs.data.DataLoader "
                "to count progress; use torchdata's StatefulDataLoader otherwise"
            )
        layout = self._layout
        k = layout.num_workers
        positions = list(layout.skip)
        for j in range(k):
            w = (self._offset + j) % k
            positions[w] += min(self._taken[j] * self._batch, self._counts[j])
        due = (self._offset + self._active[self._next]) % k if self._active else 0
        return _state_from(self._base, layout, positions, due, self._rank, self._world)


def _state_from(
    base: dict[str, Any],
    layout: Layout,
    positions: list[int],
    worker_offset: int,
    rank: int,
    world: int,
) -> dict[str, Any]:
    return {
        "version": STATE_VERSION,
        "epoch": base["epoch"],
        "seed": base["seed"],
        "rank": rank,
        "world_size": world,
        "num_files": base["num_files"],
        "fingerprint": base["fingerprint"],
        "history": [[seg.num_workers, list(seg.positions)] for seg in layout.history],
        "num_workers": layout.num_workers,
        "positions": positions,
        "worker_offset": worker_offset,
    }


_KEYS = {
    "version": int,
    "epoch": int,
    "seed": int,
    "num_files": int,
    "fingerprint": int,
    "history": list,
    "num_workers": int,
    "positions": list,
}


def _validated(state: dict[str, Any]) -> dict[str, Any]:
    """A normalised copy of a state, or ValueError saying what is wrong with it."""
    if not isinstance(state, dict):
        raise ValueError(f"a VolumeDataset state is a dict, not {type(state).__name__}")
    for key, typ in _KEYS.items():
        if not isinstance(state.get(key), typ):
            raise ValueError(f"VolumeDataset state: {key!r} missing or not {typ.__name__}")
    if state["version"] != STATE_VERSION:
        raise ValueError(f"VolumeDataset state version {state['version']} is not supported")
    k = int(state["num_workers"])
    positions = [int(p) for p in state["positions"]]
    if k < 1 or len(positions) != k or any(p < 0 and p != UNKNOWN for p in positions):
        raise ValueError(f"VolumeDataset state: bad positions {positions} for {k} workers")
    history = []
    for seg in state["history"]:
        sk, sp = int(seg[0]), [int(p) for p in seg[1]]
        if sk < 1 or len(sp) != sk or any(p < 0 for p in sp):
            raise ValueError(f"VolumeDataset state: bad history entry {seg}")
        history.append([sk, sp])
    out: dict[str, Any] = {
        key: int(state[key]) for key in ("version", "epoch", "seed", "num_files", "fingerprint")
    }
    for key in ("rank", "world_size"):
        v = state.get(key)
        out[key] = None if v is None else int(v)
    offset = int(state.get("worker_offset", 0))
    if not 0 <= offset < k:
        raise ValueError(f"VolumeDataset state: bad worker_offset {offset} for {k} workers")
    out.update(history=history, num_workers=k, positions=positions, worker_offset=offset)
    return out


def _dist_rank_world() -> tuple[int, int] | None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return None


def _list_files(
    root: str,
    pattern: str | None,
    keep: Callable[[str], bool] | None,
    include_hidden: bool,
) -> list[tuple[str, int, int]]:
    """``(relative path, size, mtime_ns)`` of the files under ``root``, sorted by path."""
    out: list[tuple[str, int, int]] = []
    stack = [""]
    while stack:
        rel_dir = stack.pop()
        with os.scandir(os.path.join(root, rel_dir)) as it:
            for entry in it:
                if not include_hidden and entry.name.startswith("."):
                    continue
                rel = os.path.join(rel_dir, entry.name) if rel_dir else entry.name
                if entry.is_dir(follow_symlinks=False):
                    stack.append(rel)
                    continue
                if not entry.is_file():
                    continue
                if pattern is not None and not fnmatch.fnmatchcase(rel, pattern):
                    continue
                if keep is not None and not keep(os.path.join(root, rel)):
                    continue
                st = entry.stat()
                out.append((rel, st.st_size, st.st_mtime_ns))
    out.sort()
    return out
