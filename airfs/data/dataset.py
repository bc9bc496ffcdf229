"""``VolumeDataset``: the files under a directory as local paths, sharded over ranks and workers.

See :class:`VolumeDataset` for the contract. The parts it is made of: :mod:`airfs.data.listing`
(the file list), :mod:`airfs.data.sharding` (who reads what), :mod:`airfs.data.resume` (the
mid-epoch state and its trackers), :mod:`airfs.data.feed` (the mount's prefetch, or the copies
into :mod:`airfs.data.localcache` when the directory is not an airfs mount) and
:mod:`airfs.data.stats` (the counters). This module holds the state shared with DataLoader
workers and ties the parts together.
"""

from __future__ import annotations

import json
import logging
import os
import struct
import tempfile
from collections.abc import Callable, Generator, Iterator
from typing import Any

import torch
from torch.utils.data import IterableDataset, get_worker_info

from ..catalog.explain import explain
from ..control import client
from . import sharding
from .feed import cached_paths, mount_paths
from .listing import Entry, fingerprint, list_files, namespace
from .localcache import LocalCache
from .resume import STATE_VERSION as STATE_VERSION
from .resume import LoaderProgress, Progress, check_matches, fresh_state, validated
from .sharding import Layout, Segment, Uneven
from .stats import FILES, WorkerCounters, new_table, slot_for, summary
from .stats import DatasetStats as DatasetStats

log = logging.getLogger("airfs.data")

# The shared state blob stays below torch's parallel grain size (32768 elements), as the stats
# table does (airfs.data.stats), so that making and filling it never enters an OpenMP region:
# GNU OpenMP hangs in a process forked from one that used it, and datasets are often made in
# forked processes.
_BLOB_CAPACITY = 1 << 14


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
    _local_progress: Progress | None
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
            self._entries: list[Entry] = list_files(self.root, pattern, filter, include_hidden)
        except PermissionError as exc:  # a governed volume says which privilege is missing
            raise explain(exc, exc.filename or self.root, "read") from exc
        self._fingerprint = fingerprint(self._entries)
        self._namespace = namespace(self.root)
        # Shared with DataLoader workers (fork or spawn), so that set_epoch / load_state_dict
        # made in the main process reach persistent workers.
        # (torch leaves Tensor.share_memory_ unannotated)
        self._blob: torch.Tensor = torch.zeros(_BLOB_CAPACITY, dtype=torch.uint8)
        self._blob.share_memory_()  # type: ignore[no-untyped-call]
        self._stats: torch.Tensor = new_table()
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
        self._set_state(validated(state))

    def stats(self) -> DatasetStats:
        """Counters so far, over this process and its DataLoader workers."""
        return summary(self._stats)

    def __iter__(self) -> Iterator[str]:
        info = get_worker_info()
        worker, num_workers = (info.id, info.num_workers) if info is not None else (0, 1)
        rank, world = self._rank_world()
        state = self._current_state()
        layout, offset = self._layout(state, rank, world, num_workers)
        mine = (worker + offset) % layout.num_workers  # this worker's slice of the layout
        entries = [self._entries[i] for i in layout.worker_items(mine)]
        progress = Progress(state, layout, rank, world, mine, own_only=info is not None)
        self._local_progress = progress
        if info is None:
            self._progress_source = progress.state
        counters = WorkerCounters(self._stats, slot_for(worker if info is not None else None))
        mountpoint = client.find_mount(self.root)
        paths: Iterator[str]
        if mountpoint is not None and self.mount_prefetch:
            paths = mount_paths(self.root, entries, mountpoint, self.prefetch_files, counters)
        elif mountpoint is not None:
            paths = (os.path.join(self.root, rel) for rel, _, _ in entries)
        elif self.local_cache:
            paths = self._iter_cached(entries, counters)
        else:
            paths = (os.path.join(self.root, rel) for rel, _, _ in entries)
        try:
            for path in paths:
                progress.count += 1
                counters.local[FILES] += 1
                counters.tick()
                yield path
        finally:
            if isinstance(paths, Generator):
                paths.close()  # stops copies / prefetch requests now, not at garbage collection
            counters.flush()

    # ------------------------------------------------------------- used by airfs.data.loader

    def _begin_loader_iteration(
        self, num_workers: int, batch_size: int | None, drop_last: bool
    ) -> LoaderProgress:
        """Called by :class:`airfs.data.DataLoader` in the main process when it starts an
        iteration with ``num_workers`` > 0 workers; the returned tracker is then what
        :meth:`state_dict` reports."""
        rank, world = self._rank_world()
        state = self._current_state()
        layout, offset = self._layout(state, rank, world, num_workers)
        tracker = LoaderProgress(state, layout, offset, rank, world, batch_size, drop_last)
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
        return fresh_state(
            epoch=epoch, seed=seed, num_files=len(self._entries), fingerprint=self._fingerprint
        )

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
        check_matches(
            state,
            root=self.root,
            num_files=len(self._entries),
            fingerprint=self._fingerprint,
            rank=rank,
            world=world,
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

    def _iter_cached(self, entries: list[Entry], counters: WorkerCounters) -> Iterator[str]:
        if self._cache is None:
            self._cache = LocalCache(self.cache_dir, self.cache_max_bytes)
        yield from cached_paths(
            self.root,
            entries,
            self._cache,
            self._namespace,
            copy_threads=self.copy_threads,
            prefetch_files=self.prefetch_files,
            counters=counters,
        )


def _dist_rank_world() -> tuple[int, int] | None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return None
