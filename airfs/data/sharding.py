"""Which files each (rank, DataLoader worker) reads in an epoch: pure functions, no torch.

The order of one epoch is computed in three steps, the same in every process:

1. **Epoch order.** The files, listed once and sorted, are numbered ``0..n-1``. With ``shuffle``
   they are permuted by a generator seeded from ``(seed, epoch)`` only (Python's ``random``
   seeded with a string, which is stable across Python versions and platforms).
2. **Rank slice.** Every rank must get the same number of files, or the ranks would run a
   different number of steps and one would hang in a collective. ``uneven="pad"`` repeats files
   from the start of the epoch order until ``n`` is a multiple of the world size (every file is
   read at least once; ``pad`` of them twice); ``uneven="drop"`` leaves out the last ``n mod
   world_size`` files of the epoch order (every file read at most once). Rank ``r`` takes
   positions ``r, r + W, r + 2W, ...``.
3. **Worker slice.** DataLoader worker ``w`` of ``K`` takes positions ``w, w + K, ...`` of its
   rank's list. In-process iteration (``num_workers=0``) is one worker.

Mid-epoch resume is expressed in the same terms: a *layout* is a worker count and, per worker,
how many of its files were consumed. Resuming with the same worker count skips those prefixes.
Resuming with another worker count removes every consumed file from the rank's list (by
position, so padded duplicates stay right) and splits what is left over the new workers; the old
layout goes into the *history* so that the next resume can do the same again.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from airfs.util.layoutstate import UNKNOWN as UNKNOWN  # re-exported

Uneven = Literal["pad", "drop"]



def epoch_order(num_files: int, *, seed: int, epoch: int, shuffle: bool) -> list[int]:
    """The indices ``0..num_files-1`` in this epoch's order: sorted, or permuted as a pure
    function of ``(seed, epoch)``."""
    if num_files < 0:
        raise ValueError(f"num_files must be >= 0, not {num_files}")
    order = list(range(num_files))
    if shuffle:
        random.Random(f"airfs-epoch-order:{seed}:{epoch}").shuffle(order)
    return order


def per_rank_count(num_files: int, world_size: int, uneven: Uneven) -> int:
    """How many files every rank reads in one epoch."""
    check_rank(0, world_size)
    if uneven == "pad":
        return -(-num_files // world_size)
    if uneven == "drop":
        return num_files // world_size
    raise ValueError(f"uneven must be 'pad' or 'drop', not {uneven!r}")


def rank_slice(order: Sequence[int], *, rank: int, world_size: int, uneven: Uneven) -> list[int]:
    """Rank ``rank``'s files, in order, out of an epoch order (step 2 of the module doc).

    Every rank gets exactly :func:`per_rank_count` files."""
    check_rank(rank, world_size)
    n = len(order)
    per_rank = per_rank_count(n, world_size, uneven)
    total = per_rank * world_size
    if total <= n:
        padded = list(order[:total])
    else:
        padded = list(order)
        while len(padded) < total:
            padded.extend(order[: total - len(padded)])
    return padded[rank::world_size]


def drop_consumed(items: Sequence[int], num_workers: int, positions: Sequence[int]) -> list[int]:
    """``items`` less what the workers of a layout consumed: worker ``w`` consumed the first
    ``positions[w]`` of ``items[w::num_workers]``. Removal is by position, not by value."""
    if num_workers < 1:
        raise ValueError(f"num_workers must be >= 1, not {num_workers}")
    if len(positions) != num_workers:
        raise ValueError(f"{len(positions)} positions for {num_workers} workers")
    if any(p == UNKNOWN for p in positions):
        raise ValueError(
            "this state holds only some workers' positions (a per-worker state, e.g. from "
            "torchdata's StatefulDataLoader): it can only resume with the same num_workers"
        )
    keep = [True] * len(items)
    for w, consumed in enumerate(positions):
        mine = range(w, len(items), num_workers)
        if not 0 <= consumed <= len(mine):
            raise ValueError(f"worker {w} position {consumed} is outside 0..{len(mine)}")
        for pos in mine[:consumed]:
            keep[pos] = False
    return [item for item, k in zip(items, keep, strict=True) if k]


@dataclass(frozen=True)
class Segment:
    """A finished layout: ``num_workers`` workers, of which worker ``w`` consumed
    ``positions[w]`` files of its slice."""

    num_workers: int
    positions: tuple[int, ...]


@dataclass(frozen=True)
class Layout:
    """How one rank's files for an epoch are spread over its workers at the start of an
    iteration: ``items`` (the files left after ``history``) split over ``num_workers`` workers,
    each of which first skips ``skip[w]`` of its slice (already consumed)."""

    items: tuple[int, ...]
    num_workers: int
    skip: tuple[int, ...]
    history: tuple[Segment, ...] = field(default=())

    def worker_items(self, worker: int) -> list[int]:
        """What worker ``worker`` yields in this iteration, in order."""
        if not 0 <= worker < self.num_workers:
            raise ValueError(f"worker {worker} is not in 0..{self.num_workers - 1}")
        if self.skip[worker] == UNKNOWN:
            raise ValueError(f"the resume state does not hold worker {worker}'s position")
        return list(self.items[worker :: self.num_workers][self.skip[worker] :])

    def remaining_counts(self) -> list[int]:
        """How many files each worker yields in this iteration."""
        if UNKNOWN in self.skip:
            raise ValueError("the resume state does not hold every worker's position")
        return [
            max(0, len(range(w, len(self.items), self.num_workers)) - self.skip[w])
            for w in range(self.num_workers)
        ]


def resolve_layout(
    rank_items: Sequence[int],
    *,
    history: Sequence[Segment],
    num_workers: int,
    positions: Sequence[int],
    new_num_workers: int,
) -> Layout:
    """The layout an iteration with ``new_num_workers`` workers uses, given a rank's files for
    the epoch and a resume state (``history`` of finished layouts, then the current layout of
    ``num_workers`` workers with ``positions`` consumed)."""
    if new_num_workers < 1:
        raise ValueError(f"new_num_workers must be >= 1, not {new_num_workers}")
    items = list(rank_items)
    for seg in history:
        items = drop_consumed(items, seg.num_workers, seg.positions)
    hist = tuple(history)
    if all(p == 0 for p in positions):
        return Layout(tuple(items), new_num_workers, (0,) * new_num_workers, hist)
    if num_workers == new_num_workers:
        if len(positions) != num_workers:
            raise ValueError(f"{len(positions)} positions for {num_workers} workers")
        return Layout(tuple(items), num_workers, tuple(positions), hist)
    items = drop_consumed(items, num_workers, positions)
    hist = (*hist, Segment(num_workers, tuple(positions)))
    return Layout(tuple(items), new_num_workers, (0,) * new_num_workers, hist)


def shard(
    num_files: int,
    *,
    rank: int,
    world_size: int,
    worker: int,
    num_workers: int,
    epoch: int = 0,
    seed: int = 0,
    shuffle: bool = True,
    uneven: Uneven = "pad",
) -> list[int]:
    """The file indices worker ``worker`` of ``num_workers`` (0 means in-process: one worker)
    on rank ``rank`` of ``world_size`` reads in epoch ``epoch``, from the start of the epoch."""
    order = epoch_order(num_files, seed=seed, epoch=epoch, shuffle=shuffle)
    mine = rank_slice(order, rank=rank, world_size=world_size, uneven=uneven)
    k = max(1, num_workers)
    if not 0 <= worker < k:
        raise ValueError(f"worker {worker} is not in 0..{k - 1}")
    return mine[worker::k]


def check_rank(rank: int, world_size: int) -> None:
    """ValueError unless ``0 <= rank < world_size``."""
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, not {world_size}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in 0..{world_size - 1}")
