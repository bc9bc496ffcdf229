"""``DataLoader``: torch's DataLoader with defaults for reading many files, wait counters, and
mid-epoch state for :class:`~airfs.data.VolumeDataset`."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.utils.data

from .dataset import VolumeDataset
from .resume import LoaderProgress


@dataclass(frozen=True)
class LoaderStats:
    """What a :class:`DataLoader` measured since it was made. Log ``last_wait_s`` per step."""

    batches: int
    """Batches handed to the consumer."""
    wait_s: float
    """Total time the consumer spent blocked in ``next()`` waiting for a batch."""
    last_wait_s: float
    """That wait for the latest batch."""
    max_wait_s: float
    fetch_wait_s: float
    """Total time the dataset's iterators (all workers) spent blocked waiting for a file fetch;
    0 when the loader holds no :class:`VolumeDataset`."""
    last_fetch_wait_s: float
    """Of which, during the latest batch's interval."""
    files: int
    cache_hits: int
    origin_copies: int


def default_num_workers() -> int:
    """Workers when none is given: one per CPU this process may use, at most 8."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    return max(1, min(8, cpus))


class DataLoader(torch.utils.data.DataLoader):  # type: ignore[type-arg]
    """A ``torch.utils.data.DataLoader`` for file datasets, with these defaults where an
    argument is left ``None``: ``num_workers`` = :func:`default_num_workers`,
    ``prefetch_factor`` = 4 and ``persistent_workers`` = True (with workers), ``pin_memory`` =
    ``torch.cuda.is_available()``. Every other argument means what it means to torch.

    Reading ahead: each worker keeps ``prefetch_factor`` batches ready, and a
    :class:`VolumeDataset` inside keeps fetching its next files (copies or mount prefetch)
    while batches wait, so files arrive while the model computes.

    Counters: :meth:`stats` and :attr:`last_wait_s` say how long the consumer waited for each
    batch, and how long the dataset waited on file fetches.

    State: when the dataset is a :class:`VolumeDataset`, or wraps one (found in the wrapper's
    attributes, two levels deep, or given as ``volume_dataset``), :meth:`state_dict` returns
    how far the consumer got, per worker, counted from the batches handed out; feed it to
    :meth:`load_state_dict` of a new loader to resume mid-epoch. This needs ``in_order=True``
    and wrappers that turn each path into exactly one sample (not filtering); a mismatch that
    shows is reported by :meth:`state_dict` raising ``RuntimeError``.
    """

    def __init__(
        self,
        dataset: torch.utils.data.Dataset[Any],
        batch_size: int | None = 1,
        shuffle: bool | None = None,
        sampler: Any = None,
        batch_sampler: Any = None,
        num_workers: int | None = None,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        pin_memory: bool | None = None,
        drop_last: bool = False,
        timeout: float = 0,
        worker_init_fn: Callable[[int], None] | None = None,
        multiprocessing_context: Any = None,
        generator: Any = None,
        *,
        prefetch_factor: int | None = None,
        persistent_workers: bool | None = None,
        pin_memory_device: str = "",
        in_order: bool = True,
        volume_dataset: VolumeDataset | None = None,
    ) -> None:
        if num_workers is None:
            num_workers = default_num_workers()
        if prefetch_factor is None and num_workers > 0:
            prefetch_factor = 4
        if persistent_workers is None:
            persistent_workers = num_workers > 0
        if pin_memory is None:
            pin_memory = torch.cuda.is_available()
        super().__init__(
            dataset,
            batch_size=batch_size,
            shuffle=shuffle,
            sampler=sampler,
            batch_sampler=batch_sampler,
            num_workers=num_workers,
            collate_fn=collate_fn,
            pin_memory=pin_memory,
            drop_last=drop_last,
            timeout=timeout,
            worker_init_fn=worker_init_fn,
            multiprocessing_context=multiprocessing_context,
            generator=generator,
            prefetch_factor=prefetch_factor,
            persistent_workers=persistent_workers,
            pin_memory_device=pin_memory_device,
            in_order=in_order,
        )
        self.volume_dataset = volume_dataset or _find_volume_dataset(dataset)
        self._tracker: LoaderProgress | None = None
        self._batches = 0
        self._wait = 0.0
        self._last_wait = 0.0
        self._max_wait = 0.0
        self._last_fetch_wait = 0.0

    @property
    def last_wait_s(self) -> float:
        """Seconds the consumer waited for the latest batch."""
        return self._last_wait

    def stats(self) -> LoaderStats:
        """Counters so far (cheap: read a few numbers)."""
        ds = self.volume_dataset.stats() if self.volume_dataset is not None else None
        return LoaderStats(
            batches=self._batches,
            wait_s=self._wait,
            last_wait_s=self._last_wait,
            max_wait_s=self._max_wait,
            fetch_wait_s=ds.fetch_wait_s if ds else 0.0,
            last_fetch_wait_s=self._last_fetch_wait,
            files=ds.files if ds else 0,
            cache_hits=ds.cache_hits if ds else 0,
            origin_copies=ds.origin_copies if ds else 0,
        )

    def state_dict(self) -> dict[str, Any]:
        """``{"dataset": ...}``: the :class:`VolumeDataset` state as of the batches consumed."""
        return {"dataset": self._require_volume_dataset().state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict` (of this loader, or one with another worker count)."""
        self._require_volume_dataset().load_state_dict(state["dataset"])

    def __iter__(self) -> _CountingIter:  # type: ignore[override]
        vds = self.volume_dataset
        self._tracker = None
        if vds is not None and self.num_workers > 0 and self.in_order:
            self._tracker = vds._begin_loader_iteration(
                self.num_workers,
                self.batch_size if self._auto_collation else None,
                self.drop_last,
            )
        return _CountingIter(self, super().__iter__())

    def _require_volume_dataset(self) -> VolumeDataset:
        if self.volume_dataset is None:
            raise RuntimeError(
                "this DataLoader holds no VolumeDataset (pass volume_dataset= if a wrapper "
                "hides it)"
            )
        return self.volume_dataset

    def _record(self, wait: float) -> None:
        self._batches += 1
        self._wait += wait
        self._last_wait = wait
        self._max_wait = max(self._max_wait, wait)
        if self._tracker is not None:
            self._tracker.advance()


class _CountingIter:
    """Wraps torch's loader iterator: times each ``next()`` and counts batches."""

    def __init__(self, loader: DataLoader, inner: Iterator[Any]) -> None:
        self._loader = loader
        self._inner = inner
        vds = loader.volume_dataset
        self._fetch_wait = vds.stats().fetch_wait_s if vds is not None else 0.0

    def __iter__(self) -> _CountingIter:
        return self

    def __len__(self) -> int:
        return len(self._inner)  # type: ignore[arg-type]

    def __next__(self) -> Any:
        t0 = time.perf_counter()
        try:
            batch = next(self._inner)
        except StopIteration:
            if self._loader._tracker is not None:
                self._loader._tracker.finish()
            raise
        self._loader._record(time.perf_counter() - t0)
        vds = self._loader.volume_dataset
        if vds is not None:
            fetch_wait = vds.stats().fetch_wait_s
            self._loader._last_fetch_wait = fetch_wait - self._fetch_wait
            self._fetch_wait = fetch_wait
        return batch


def _find_volume_dataset(obj: object, depth: int = 2) -> VolumeDataset | None:
    """``obj`` if it is a VolumeDataset, else one found among its attributes (depth-limited)."""
    if isinstance(obj, VolumeDataset):
        return obj
    if depth == 0:
        return None
    attrs: Iterable[object] = getattr(obj, "__dict__", {}).values()
    for value in attrs:
        if isinstance(value, VolumeDataset):
            return value
    for value in getattr(obj, "__dict__", {}).values():
        if isinstance(value, torch.utils.data.Dataset):
            found = _find_volume_dataset(value, depth - 1)
            if found is not None:
                return found
    return None
