"""What airfs keeps in an object's user metadata (``x-amz-meta-airfs-*``), and how it reads it."""

from __future__ import annotations

import datetime as dt

#: User metadata holding a file's mode (``x-amz-meta-airfs-mode``: octal digits).
MODE_ATTR = "airfs-mode"
#: Mode of objects without :data:`MODE_ATTR` (written by other tools), unless configured.
DEFAULT_MODE = 0o644

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def parse_mode(value: str | None) -> int | None:
    """The permission bits stored as octal digits, or None if absent or not a mode."""
    if not value:
        return None
    try:
        mode = int(value, 8)
    except ValueError:
        return None
    return mode if 0 <= mode <= 0o7777 else None


def ns_of(when: dt.datetime | None) -> int:
    """Nanoseconds since the epoch of an S3 timestamp (naive means UTC; None gives 0)."""
    if when is None:
        return 0
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return (when - _EPOCH) // dt.timedelta(microseconds=1) * 1000
