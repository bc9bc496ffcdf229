"""The block cache: persistent, checksummed, LRU-evicted; with the prefetcher it forms the read
path (:class:`CachedReadPath`)."""

from .blockcache import CachedReader, CachedReadPath
from .index import CacheInUse
from .stats import CacheStatistics

__all__ = ["CacheInUse", "CacheStatistics", "CachedReadPath", "CachedReader"]
