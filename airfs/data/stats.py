"""A :class:`~airfs.data.VolumeDataset`'s counters, shared by the process that made it and its
DataLoader workers.

The counters live in one shared-memory ``int64`` tensor of :data:`SLOTS` rows (made by
:func:`new_table`): row ``i`` belongs to DataLoader worker ``i`` (workers past 255 share row 255),
row :data:`MAIN_SLOT` to the process that made the dataset; columns are :data:`FILES`,
:data:`WAIT_NS`, :data:`HITS`, :data:`COPIES`, :data:`BYTES`, :data:`PREFETCH`. Every iterator adds
to its own row through a :class:`WorkerCounters`; :func:`summary` sums the rows into a
:class:`DatasetStats`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

# The tensor stays below torch's parallel grain size (32768 elements), so that making and
# filling it never enters an OpenMP region (see airfs.data.dataset).
SLOTS = 257  # stats rows: DataLoader workers 0..255, then the process that made the dataset
MAIN_SLOT = SLOTS - 1
FILES, WAIT_NS, HITS, COPIES, BYTES, PREFETCH = range(6)
NSTATS = 6


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


def new_table() -> torch.Tensor:
    """A zeroed ``(SLOTS, NSTATS)`` table in shared memory (reaches forked or spawned workers)."""
    table = torch.zeros((SLOTS, NSTATS), dtype=torch.int64)
    table.share_memory_()  # type: ignore[no-untyped-call]  # (torch leaves it unannotated)
    return table


def slot_for(worker: int | None) -> int:
    """The row of DataLoader worker ``worker``, or of the main process for ``None``."""
    return min(worker, MAIN_SLOT - 1) if worker is not None else MAIN_SLOT


def summary(table: torch.Tensor) -> DatasetStats:
    """The sum of every row of ``table``."""
    s = table.sum(dim=0).tolist()
    return DatasetStats(
        files=s[FILES],
        fetch_wait_s=s[WAIT_NS] / 1e9,
        cache_hits=s[HITS],
        origin_copies=s[COPIES],
        bytes_copied=s[BYTES],
        prefetch_requests=s[PREFETCH],
    )


class WorkerCounters:
    """One iterator's counters: summed locally, added to its row of the shared stats tensor
    every 32 files or 50 ms (a tensor update costs tens of microseconds) and at the end."""

    def __init__(self, shared: torch.Tensor, slot: int) -> None:
        self._shared = shared
        self._slot = slot
        self.local = [0] * NSTATS
        self._files = 0
        self._last = time.monotonic()

    def tick(self) -> None:
        """One file was yielded: flush if 32 files or 50 ms have passed since the last flush."""
        self._files += 1
        if self._files >= 32 or time.monotonic() - self._last > 0.05:
            self.flush()

    def flush(self) -> None:
        """Add the local counts to the shared row now and reset them."""
        if any(self.local):
            self._shared[self._slot] += torch.tensor(self.local, dtype=torch.int64)
            self.local = [0] * NSTATS
        self._files = 0
        self._last = time.monotonic()
