"""The block cache's counters and the frozen record :meth:`CachedReadPath.statistics` returns.

:class:`Counters` is the mutable tally the cache's parts add to as they work (plain integer
attributes: the hot path increments them inline). :class:`CacheStatistics` is an immutable
snapshot of the counters plus the cache's current sizes; ``airfs status`` shows its
:meth:`~CacheStatistics.to_dict` (the same keys, in the same order, as the fields).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["CacheStatistics", "Counters"]


class Counters:
    """Event counters, all starting at 0 (see :class:`CacheStatistics` for their meaning)."""

    __slots__ = (
        "adopted_bytes",
        "corrupt_blocks",
        "evicted_bytes",
        "evictions",
        "fetched_at_lookup",
        "hit_bytes",
        "index_flushes",
        "index_map_loads",
        "kept_hit_bytes",
        "miss_bytes",
        "origin_bytes_read",
        "origin_requests",
        "prefetch_abandoned",
        "prefetch_bytes",
        "prefetch_hits",
        "prefetch_resets",
        "prefetch_waits",
        "prefetch_window_max",
        "reads",
        "uncached_bytes",
        "warm_batches",
        "warm_bytes",
    )

    adopted_bytes: int
    corrupt_blocks: int
    evicted_bytes: int
    evictions: int
    fetched_at_lookup: int
    hit_bytes: int
    index_flushes: int
    index_map_loads: int
    kept_hit_bytes: int
    miss_bytes: int
    origin_bytes_read: int
    origin_requests: int
    prefetch_abandoned: int
    prefetch_bytes: int
    prefetch_hits: int
    prefetch_resets: int
    prefetch_waits: int
    prefetch_window_max: int
    reads: int
    uncached_bytes: int
    warm_batches: int
    warm_bytes: int

    def __init__(self) -> None:
        for name in self.__slots__:
            setattr(self, name, 0)


@dataclass(frozen=True, slots=True)
class CacheStatistics:
    """A snapshot of the block cache. Counters run since the read path was created; sizes are
    bytes.

    Space: ``cache_bytes_used`` (cached blocks + space reserved for fetches in flight),
    ``cache_bytes_limit`` (``cache_size``), ``cache_bytes_limit_now`` (lowered by
    ``min_free``), ``min_free``, ``disk_free_bytes`` (last ``statvfs``), ``cache_objects``,
    ``block_size``, ``checksum_chunk``.

    Traffic: ``reads``; ``hit_bytes`` (served from cache files), ``miss_bytes`` (served from a
    fetch a read waited for); ``origin_bytes_read``, ``origin_requests``.

    Space events: ``evictions`` (objects dropped + block runs punched), ``evicted_bytes``,
    ``corrupt_blocks`` (checksum failures, refetched), ``uncached_bytes`` (fetched but not
    kept: no room), ``warm_bytes``, ``adopted_bytes``; ``warm_batches`` (worker-thread jobs
    that fetched several small files of a warm, one after another: ``WholeBatches``).

    Prefetch: ``prefetch_window_current`` (largest window of the open sequential streams),
    ``prefetch_window_max`` (largest ever), ``prefetch_bytes`` (fetched ahead),
    ``prefetch_hits`` (prefetched blocks later read from the cache), ``prefetch_waits`` (reads
    that waited for a prefetch in flight), ``prefetch_resets`` (streams broken by far jumps),
    ``prefetch_abandoned`` (queued prefetches dropped after a jump/close).

    Now: ``inflight_bytes`` (fetched bytes held in memory: fetches in flight and parts not yet
    written into the cache file), ``inflight_peak_bytes``, ``inflight_budget``;
    ``inflight_waits`` (prefetch parts that waited for the budget);
    ``readers_open``; ``index_pending`` (objects not yet written to the index),
    ``index_flushes`` (index transactions), ``index_map_loads`` (worker-thread jobs that
    loaded block maps from the index: the first use of each cached object after a start,
    those asked at once loaded together).

    Cold sequential reads (:mod:`airfs.cache.direct`): ``direct_write_bytes`` (parts written
    into cache files bypassing the page cache), ``kept_bytes`` (now: stored prefetched parts
    whose buffers are kept for their reader, within ``inflight_bytes``), ``kept_hit_bytes``
    (served from those buffers, also counted in ``hit_bytes``); ``part_buffers_leased``
    (parts read into a reused page-aligned buffer, :mod:`airfs.cache.buffers`),
    ``part_buffers_mapped`` (such buffers mapped: a pool that works maps few).

    Cold small files: ``fetched_at_lookup`` (files read whole by the request that revalidated
    their name, stored without a second origin read: ``ReadPath.store_fetched``).
    """

    cache_dir: str
    cache_bytes_used: int
    cache_bytes_limit: int
    cache_bytes_limit_now: int
    min_free: int
    disk_free_bytes: int
    cache_objects: int
    block_size: int
    checksum_chunk: int
    reads: int
    hit_bytes: int
    miss_bytes: int
    origin_bytes_read: int
    origin_requests: int
    evictions: int
    evicted_bytes: int
    corrupt_blocks: int
    uncached_bytes: int
    warm_bytes: int
    warm_batches: int
    adopted_bytes: int
    prefetch_window_current: int
    prefetch_window_max: int
    prefetch_bytes: int
    prefetch_hits: int
    prefetch_waits: int
    prefetch_resets: int
    prefetch_abandoned: int
    inflight_bytes: int
    inflight_peak_bytes: int
    inflight_budget: int
    inflight_waits: int
    readers_open: int
    index_pending: int
    index_flushes: int
    index_map_loads: int = 0
    direct_write_bytes: int = 0
    kept_bytes: int = 0
    kept_hit_bytes: int = 0
    part_buffers_leased: int = 0
    part_buffers_mapped: int = 0
    fetched_at_lookup: int = 0
    kind: Literal["cached"] = "cached"

    def to_dict(self) -> dict[str, Any]:
        """The record as JSON-ready ``{name: value}``, ``kind`` first (what ``airfs status``
        prints)."""
        out: dict[str, Any] = {"kind": self.kind}
        for f in dataclasses.fields(self):
            if f.name != "kind":
                out[f.name] = getattr(self, f.name)
        return out
