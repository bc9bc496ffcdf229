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
#: The stall deadline: how long a request waits for the server's first byte, and then for
#: each next read of its answer (it resets on every byte that arrives, so a slow large
#: transfer is not cut; a server that accepts and never answers is). Also the socket
#: deadline of the signing client. Uploads and copies of more than :data:`BULK_MIN` bytes
#: wait for their answer up to the overall limit instead (the answer comes after the body).
DEFAULT_STALL_TIMEOUT = 10.0
#: Connecting may take at most this long (or the stall deadline, if shorter).
CONNECT_TIMEOUT = 5.0
BULK_MIN = 1 << 20
#: Objects named like this (at the root of the origin) are hidden: the conditional-put probe.
PROBE_PREFIX = ".airfs-probe-"
#: Modes remembered per key (with the ETag they belong to), and HEADs in flight per listing.
MODE_CACHE_MAX = 1 << 20
#: the most remembered attributes a daemon saves for the next one on its cache dir
KNOWN_SAVED_MAX = 200_000
LIST_HEADS = 32
