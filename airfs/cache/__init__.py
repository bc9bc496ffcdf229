"""The block cache: persistent, checksummed, LRU-evicted; with the prefetcher it forms the read
path (:class:`CachedReadPath`).

Modules, each the one owner of its state (users import from this package only):

``blockcache``  :class:`CachedReadPath` / :class:`CachedReader`: life cycle, the ReadPath interface
``reads``       one read: cut into cached runs and parts, served, planned again on a bad block
``objects``     the object table (LRU order, by path), bytes used, eviction, dirty marks
``evict``       the space limit (cache size, free-disk floor) and the eviction plan
``fetch``       parts: single-flight range reads from the origin, prefetch, warm, adopt
``hits``        cache hits from the data files, checksums verified, on the loop when possible
``files``       data-file descriptors, creation, and the background deletions and hole punches
``persist``     the object table mirrored to the LMDB index in batches; orphaned files
``index``       the LMDB index itself (format, records, lock, damage checks)
``store``       the data-file layout, checksums and the blocking file I/O helpers
``stats``       the counters and the frozen :class:`CacheStatistics` record
"""

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
