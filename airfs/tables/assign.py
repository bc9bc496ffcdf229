"""Which rows each (rank, DataLoader worker) reads in an epoch: pure functions, no I/O.

The units of a table (row groups, :mod:`airfs.tables.plan`) have uneven row counts, and every
rank must yield the same number of rows or one would hang in a collective. So the split is by
rows, not by units:

1. **Epoch order.** The units are put in this epoch's order, the same in every process: as
   planned, or with ``shuffle`` permuted as a pure function of ``(seed, epoch)``
   (:func:`airfs.data.sharding.epoch_order`). Concatenated, they form the epoch's *stream* of
   ``N`` rows.
2. **Rank span.** Every rank reads ``P`` rows (:func:`airfs.data.sharding.per_rank_count` of
   ``N``): ``uneven="drop"`` leaves out the last ``N mod W`` rows of the stream,
   ``uneven="pad"`` wraps around and reads a few rows from the start of the stream again. Rank
   ``r`` takes rows ``[r P, (r + 1) P)``: a contiguous run of units, cut inside at most two.
3. **Worker span.** A rank's ``P`` rows (or what is left of them on resume, see below) are cut
   into ``K`` contiguous parts for its ``K`` DataLoader workers, of sizes differing by at most
   one; worker ``w`` reads part ``w``.

A *piece* is a run of rows of one unit: ``(unit, start, stop)``. A rank's rows are addressed by
their offset in its span, ``0..P-1``; an *interval list* of such offsets says which are left.

**Resume.** A layout is a worker count and, per worker, how many rows of its part were consumed.
Resuming with the same worker count skips those prefixes. With another count, every consumed
row is removed from the rank's interval list and what is left is cut into the new parts; the old
layout goes into the *history*, so that the next resume can do the same again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from airfs.util.layoutstate import UNKNOWN as UNKNOWN  # re-exported

from ..data.sharding import Uneven, check_rank, epoch_order, per_rank_count

Interval = tuple[int, int]  # [start, stop) offsets in a rank's span


@dataclass(frozen=True)
class Piece:
    """Rows ``[start, stop)`` of unit ``unit`` (offsets within the unit's rows)."""

    unit: int
    start: int
    stop: int

    @property
    def rows(self) -> int:
        return self.stop - self.start


def rank_pieces(
    unit_rows: Sequence[int],
    *,
    rank: int,
    world_size: int,
    epoch: int,
    seed: int,
    shuffle: bool,
    uneven: Uneven,
) -> list[Piece]:
    """Rank ``rank``'s span of the epoch's stream (steps 1-2), as pieces in stream order.
    Their rows add up to :func:`rows_per_rank` exactly."""
    check_rank(rank, world_size)
    if any(n <= 0 for n in unit_rows):
        raise ValueError("every unit must have at least one row")
    order = epoch_order(len(unit_rows), seed=seed, epoch=epoch, shuffle=shuffle)
    total = sum(unit_rows)
    per_rank = per_rank_count(total, world_size, uneven)
    begin = rank * per_rank
    out: list[Piece] = []
    if per_rank == 0:
        return out
    # walk the (wrapping) stream from `begin` for per_rank rows
    offsets = []
    acc = 0
    for u in order:
        offsets.append(acc)
        acc += unit_rows[u]
    want = per_rank
    pos = begin % total
    while want > 0:
        i = _find(offsets, pos)
        u = order[i]
        start = pos - offsets[i]
        take = min(unit_rows[u] - start, want)
        out.append(Piece(u, start, start + take))
        want -= take
        pos = (pos + take) % total
    return out


def rows_per_rank(unit_rows: Sequence[int], world_size: int, uneven: Uneven) -> int:
    """How many rows every rank reads in one epoch."""
    return per_rank_count(sum(unit_rows), world_size, uneven)


def _find(offsets: Sequence[int], pos: int) -> int:
    """The index ``i`` with ``offsets[i] <= pos < offsets[i + 1]`` (binary search)."""
    lo, hi = 0, len(offsets) - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if offsets[mid] <= pos:
            lo = mid
        else:
            hi = mid - 1
    return lo


def length(intervals: Sequence[Interval]) -> int:
    return sum(b - a for a, b in intervals)


def cut(intervals: Sequence[Interval], num_parts: int) -> list[list[Interval]]:
    """``intervals`` cut into ``num_parts`` contiguous parts of sizes differing by at most one
    (the first ``L mod K`` parts one longer), in order."""
    if num_parts < 1:
        raise ValueError(f"num_parts must be >= 1, not {num_parts}")
    total = length(intervals)
    base, extra = divmod(total, num_parts)
    sizes = [base + (1 if k < extra else 0) for k in range(num_parts)]
    parts: list[list[Interval]] = [[] for _ in range(num_parts)]
    k = 0
    room = sizes[0] if sizes else 0
    for a, b in intervals:
        while a < b:
            while room == 0 and k < num_parts - 1:
                k += 1
                room = sizes[k]
            take = min(b - a, room)
            parts[k].append((a, a + take))
            a += take
            room -= take
    return parts


def drop_prefix(intervals: Sequence[Interval], n: int) -> list[Interval]:
    """``intervals`` less their first ``n`` rows."""
    if not 0 <= n <= length(intervals):
        raise ValueError(f"position {n} is outside 0..{length(intervals)}")
    out = []
    for a, b in intervals:
        if n >= b - a:
            n -= b - a
            continue
        out.append((a + n, b))
        n = 0
    return out


@dataclass(frozen=True)
class Segment:
    """A finished layout: ``num_workers`` workers, worker ``w`` consumed ``positions[w]``."""

    num_workers: int
    positions: tuple[int, ...]




def remaining(span: int, history: Sequence[Segment]) -> list[Interval]:
    """The offsets of a rank's span of ``span`` rows left after the finished layouts."""
    intervals: list[Interval] = [(0, span)] if span else []
    for seg in history:
        if len(seg.positions) != seg.num_workers or UNKNOWN in seg.positions:
            raise ValueError(f"bad history entry {seg}")
        parts = cut(intervals, seg.num_workers)
        intervals = [
            iv for part, p in zip(parts, seg.positions, strict=True) for iv in drop_prefix(part, p)
        ]
    return intervals


@dataclass(frozen=True)
class Layout:
    """How a rank's rows are spread over its workers in one iteration: ``parts[w]`` (offsets in
    the rank's span) for worker ``w``, which first skips ``skip[w]`` rows of it."""

    parts: tuple[tuple[Interval, ...], ...]
    skip: tuple[int, ...]
    history: tuple[Segment, ...]

    @property
    def num_workers(self) -> int:
        return len(self.parts)

    def worker_intervals(self, worker: int) -> list[Interval]:
        """What worker ``worker`` reads in this iteration, in order."""
        if not 0 <= worker < self.num_workers:
            raise ValueError(f"worker {worker} is not in 0..{self.num_workers - 1}")
        if self.skip[worker] == UNKNOWN:
            raise ValueError(f"the resume state does not hold worker {worker}'s position")
        return drop_prefix(self.parts[worker], self.skip[worker])


def resolve_layout(
    span: int,
    *,
    history: Sequence[Segment],
    num_workers: int,
    positions: Sequence[int],
    new_num_workers: int,
) -> Layout:
    """The layout an iteration with ``new_num_workers`` workers uses for a rank's span of
    ``span`` rows, given a resume state: ``history``, then the current layout of
    ``num_workers`` workers of which worker ``w`` consumed ``positions[w]`` rows."""
    if new_num_workers < 1:
        raise ValueError(f"new_num_workers must be >= 1, not {new_num_workers}")
    if len(positions) != num_workers:
        raise ValueError(f"{len(positions)} positions for {num_workers} workers")
    hist = tuple(history)
    left = remaining(span, hist)
    if all(p == 0 for p in positions):
        parts = cut(left, new_num_workers)
        return Layout(tuple(map(tuple, parts)), (0,) * new_num_workers, hist)
    parts = cut(left, num_workers)
    for part, p in zip(parts, positions, strict=True):
        if p != UNKNOWN and not 0 <= p <= length(part):
            raise ValueError(f"position {p} is outside 0..{length(part)}")
    if num_workers == new_num_workers:
        return Layout(tuple(map(tuple, parts)), tuple(positions), hist)
    if UNKNOWN in positions:
        raise ValueError(
            "this state holds only some workers' positions (a per-worker state, e.g. from "
            "torchdata's StatefulDataLoader): it can only resume with the same num_workers"
        )
    hist = (*hist, Segment(num_workers, tuple(positions)))
    parts = cut(remaining(span, hist), new_num_workers)
    return Layout(tuple(map(tuple, parts)), (0,) * new_num_workers, hist)


def to_pieces(rank_span: Sequence[Piece], intervals: Sequence[Interval]) -> list[Piece]:
    """The pieces of units that the offsets ``intervals`` of a rank's span (``rank_span``, from
    :func:`rank_pieces`) stand for, in order."""
    starts = []
    acc = 0
    for p in rank_span:
        starts.append(acc)
        acc += p.rows
    out = []
    for a, b in intervals:
        while a < b:
            i = _find(starts, a)
            p = rank_span[i]
            off = a - starts[i]
            take = min(p.rows - off, b - a)
            out.append(Piece(p.unit, p.start + off, p.start + off + take))
            a += take
    return out
