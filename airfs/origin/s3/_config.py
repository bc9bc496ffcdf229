"""Tunables of the S3 origin (sizes, limits, names of hidden objects)."""

from __future__ import annotations

MiB = 1 << 20
#: Files up to this size go in one PUT (conditional where the server allows); larger ones are
#: multipart uploads (the PUT body is held in memory, so this also bounds memory per upload).
DEFAULT_SINGLE_PUT_MAX = 64 * MiB
DEFAULT_PART_SIZE = 16 * MiB
DEFAULT_PUT_CONCURRENCY = 8
#: Overall limit for one HTTP request (a single PUT, one part, one ranged GET).
DEFAULT_TIMEOUT = 300.0
#: Objects named like this (at the root of the origin) are hidden: the conditional-put probe.
PROBE_PREFIX = ".airfs-probe-"
#: Modes remembered per key (with the ETag they belong to), and HEADs in flight per listing.
MODE_CACHE_MAX = 1 << 20
LIST_HEADS = 32
