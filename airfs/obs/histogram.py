"""Latency histograms: a cheap tally on the request path, a frozen record for status and metrics.

:class:`Latencies` keeps, per operation name, one list of bucket counts and a sum of seconds.
:meth:`Latencies.observe` is what the request path calls: one ``bisect`` over the fixed bucket
bounds, one list item increment, one float addition (nothing else is allocated once the
operation has been seen). It is meant for one thread (the trio loop): it takes no lock.

:meth:`Latencies.snapshot` returns frozen :class:`LatencyHistogram` records (bounds, counts per
bucket, sum). The metrics endpoint turns them into Prometheus histograms at scrape time
(:mod:`airfs.obs.metrics`), ``airfs status`` prints p50/p99 from :meth:`LatencyHistogram.quantile`.

Buckets: :data:`BOUNDS`, 10 µs to 10 s in 1-2.5-5 steps, so that both an answer from memory or a
local disk (tens of µs) and an S3 request (tens of ms to seconds) land in a bucket of their own
size. A bucket holds the observations ``<=`` its bound and above the previous one (Prometheus'
``le``); the last one, above 10 s, is ``+Inf``.
"""

from __future__ import annotations

import itertools
import math
from bisect import bisect_left
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["BOUNDS", "Latencies", "LatencyHistogram", "bucket_label"]

#: upper bounds of the finite buckets, in seconds (increasing); a last ``+Inf`` bucket follows
BOUNDS: tuple[float, ...] = (
    0.00001, 0.000025, 0.00005,
    0.0001, 0.00025, 0.0005,
    0.001, 0.0025, 0.005,
    0.01, 0.025, 0.05,
    0.1, 0.25, 0.5,
    1.0, 2.5, 5.0,
    10.0,
)  # fmt: skip


def bucket_label(bound: float) -> str:
    """The ``le`` label of a bucket bound, as Prometheus writes it (``+Inf`` for infinity)."""
    if math.isinf(bound):
        return "+Inf"
    return repr(float(bound))


@dataclass(frozen=True, slots=True)
class LatencyHistogram:
    """Durations of one operation. ``bounds`` are the finite upper bounds (seconds);
    ``counts`` has one more item than ``bounds``: ``counts[i]`` observations in
    ``(bounds[i-1], bounds[i]]``, the last one above ``bounds[-1]`` (not cumulative);
    ``sum`` is the total of the observations, in seconds."""

    bounds: tuple[float, ...]
    counts: tuple[int, ...]
    sum: float

    def __post_init__(self) -> None:
        if len(self.counts) != len(self.bounds) + 1:
            raise ValueError(f"{len(self.counts)} counts for {len(self.bounds)} bounds")

    @property
    def count(self) -> int:
        """Observations in all buckets."""
        return sum(self.counts)

    def cumulative(self) -> list[tuple[float, int]]:
        """(upper bound, observations ``<=`` it) per bucket, ending with (inf, :attr:`count`):
        Prometheus' ``_bucket`` samples."""
        out: list[tuple[float, int]] = []
        total = 0
        for bound, n in zip((*self.bounds, math.inf), self.counts, strict=True):
            total += n
            out.append((bound, total))
        return out

    def quantile(self, q: float) -> float | None:
        """Estimate of the ``q`` quantile (0 <= q <= 1) in seconds, as Prometheus'
        ``histogram_quantile`` does it: linear within the bucket that holds the rank (from 0
        in the first bucket); the highest finite bound when the rank falls in ``+Inf``. None
        without observations."""
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"quantile must be within [0, 1], got {q}")
        total = self.count
        if total == 0:
            return None
        rank = q * total
        below = 0
        for i, n in enumerate(self.counts):
            if n and below + n >= rank:
                if i == len(self.bounds):
                    return self.bounds[-1]
                lower = self.bounds[i - 1] if i else 0.0
                return lower + (self.bounds[i] - lower) * max(0.0, rank - below) / n
            below += n
        return self.bounds[-1]  # not reached: rank <= total

    def to_dict(self) -> dict[str, Any]:
        """The record as ``airfs status --json`` shows it: cumulative ``buckets`` keyed by
        their ``le`` label (ending at ``+Inf``), ``count``, ``sum`` and the p50/p99 estimates
        (seconds, rounded to the microsecond; None without observations)."""
        p50, p99 = self.quantile(0.5), self.quantile(0.99)
        return {
            "count": self.count,
            "sum": round(self.sum, 6),
            "p50": None if p50 is None else round(p50, 6),
            "p99": None if p99 is None else round(p99, 6),
            "buckets": {bucket_label(b): n for b, n in self.cumulative()},
        }


class Latencies:
    """Per-operation latency tallies over :data:`BOUNDS` (see the module docstring)."""

    __slots__ = ("_counts", "bounds")

    def __init__(self, bounds: tuple[float, ...] = BOUNDS) -> None:
        if not bounds or any(b <= a for a, b in itertools.pairwise(bounds)):
            raise ValueError("bucket bounds must be a non-empty increasing sequence")
        if bounds[0] <= 0 or math.isinf(bounds[-1]):
            raise ValueError("bucket bounds must be positive and finite (+Inf is implicit)")
        self.bounds = bounds
        #: per operation: the count of each bucket (the last one +Inf), then the sum of
        #: seconds (one list, so an observation touches one object)
        self._counts: dict[str, list[float]] = {}

    def observe(self, op: str, seconds: float, n: int = 1) -> None:
        """Count ``n`` ``op``s that took ``seconds`` each."""
        counts = self._counts.get(op)
        if counts is None:
            counts = self._counts[op] = [0] * (len(self.bounds) + 1) + [0.0]
        counts[bisect_left(self.bounds, seconds)] += n
        counts[-1] += seconds * n

    def snapshot(self) -> dict[str, LatencyHistogram]:
        """A frozen record per operation observed at least once."""
        return {
            op: LatencyHistogram(self.bounds, tuple(int(n) for n in c[:-1]), c[-1])
            for op, c in self._counts.items()
        }


def as_dicts(histograms: Mapping[str, LatencyHistogram]) -> dict[str, dict[str, Any]]:
    """``{op: record.to_dict()}``, sorted by operation name."""
    return {op: h.to_dict() for op, h in sorted(histograms.items())}
