"""The block cache: persistent, checksummed, LRU-evicted; with the prefetcher it forms the read
path (:class:`CachedReadPath`)."""

from .index import CacheInUse
from .readpath import CachedReader, CachedReadPath

__all__ = ["CacheInUse", "CachedReadPath", "CachedReader"]
