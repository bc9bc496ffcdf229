"""The block cache: persistent, checksummed, LRU-evicted; with the prefetcher it forms the read
path (:class:`CachedReadPath`)."""

from .blockcache import CachedReader, CachedReadPath
from .index import CacheDamaged, CacheInUse, set_aside
from .stats import CacheStatistics

__all__ = [
    "CacheDamaged",
    "CacheInUse",
    "CacheStatistics",
    "CachedReadPath",
    "CachedReader",
    "set_aside",
]
