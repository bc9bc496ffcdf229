"""The core's statistics record (``Filesystem.statistics()``): what ``airfs status`` shows
under ``fs`` and what the metrics endpoint exports as ``airfs_core_*``."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from airfs.obs.histogram import LatencyHistogram, as_dicts

from .kernelcache import KernelCacheStats


@dataclass(frozen=True, slots=True)
class CoreStats:
    """A snapshot of the filesystem core. Counters run since the core was built.

    ``inodes`` (nodes in the inode table, the root included), ``open_files`` (open handles),
    ``ops`` (requests served, by operation, counted when they start), ``latency`` (their
    durations, by operation, counted when they end: see :func:`airfs.core.base.counted`),
    and the directory-listing cache: ``listings`` (directories held), ``listing_hits`` /
    ``listing_negative_hits`` (lookups answered from a listing, found / absent), ``relists``
    (listings fetched again), ``ahead_hits`` (names answered by a walk's stats asked ahead:
    :mod:`airfs.core.listings`); ``fast_opens`` (opens answered inline: a fresh version
    complete in the block cache, no origin call); ``fetched_ahead`` (files of a directory read
    in its listing's order handed to the background prefetch: :mod:`airfs.core.ahead`);
    ``joined_asks`` (names answered by a question of the origin already in flight for the
    same name: :meth:`~airfs.core.revalidate.Revalidation.origin_entry`)."""

    inodes: int
    open_files: int
    listings: int
    listing_hits: int
    listing_negative_hits: int
    relists: int
    ahead_hits: int = 0
    fast_opens: int = 0
    fetched_ahead: int = 0
    joined_asks: int = 0
    #: what the kernel keeps past the TTL (:class:`~airfs.core.kernelcache.KernelCacheStats`)
    kernel: KernelCacheStats | None = None
    ops: Mapping[str, int] = field(default_factory=dict)
    latency: Mapping[str, LatencyHistogram] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The record as ``airfs status`` prints it (the layout it always had)."""
        return {
            "inodes": self.inodes,
            "open_files": self.open_files,
            "ops": dict(self.ops),
            "listings": self.listings,
            "listing_hits": self.listing_hits,
            "listing_negative_hits": self.listing_negative_hits,
            "relists": self.relists,
            "ahead_hits": self.ahead_hits,
            "fast_opens": self.fast_opens,
            "fetched_ahead": self.fetched_ahead,
            "joined_asks": self.joined_asks,
            "kernel_cache": dataclasses.asdict(self.kernel) if self.kernel is not None else None,
            "latency": as_dicts(self.latency),
        }
