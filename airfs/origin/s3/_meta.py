"""What airfs keeps in an object's user metadata, and how it reads it back.

Every object (and directory marker, where the server keeps a marker's metadata) that airfs
writes carries, as S3 user metadata (``x-amz-meta-<key>``):

* ``airfs-mode``: the permission bits, octal digits (``644``);
* ``airfs-uid`` / ``airfs-gid``: the owner, decimal;
* ``airfs-mtime``: the modification time, decimal nanoseconds since the epoch.

A key that is absent (an object written by another tool) or unreadable reads as None: the
origin's default mode, no owner (the mount's default owner applies), and ``Last-Modified`` as
the mtime.
"""

from __future__ import annotations

import datetime as dt
import email.utils
from collections.abc import Mapping
from dataclasses import dataclass

#: User metadata holding a file's mode (``x-amz-meta-airfs-mode``: octal digits).
MODE_ATTR = "airfs-mode"
UID_ATTR = "airfs-uid"
GID_ATTR = "airfs-gid"
#: nanoseconds since the epoch, decimal
MTIME_ATTR = "airfs-mtime"
#: Mode of objects without :data:`MODE_ATTR` (written by other tools), unless configured.
DEFAULT_MODE = 0o644
#: S3 sends user metadata as headers with this prefix (obstore strips it)
HEADER_PREFIX = "x-amz-meta-"
#: owners are 32-bit on Linux; ``(uid_t)-1`` means "no change" and is never stored
_ID_MAX = (1 << 32) - 2

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


@dataclass(frozen=True, slots=True)
class Meta:
    """The attributes stored with one object; None: not stored."""

    mode: int | None = None
    uid: int | None = None
    gid: int | None = None
    mtime_ns: int | None = None

    def attributes(self) -> dict[str, str]:
        """The user metadata to write (keys without the ``x-amz-meta-`` prefix)."""
        out: dict[str, str] = {}
        if self.mode is not None:
            out[MODE_ATTR] = f"{self.mode & 0o7777:o}"
        if self.uid is not None:
            out[UID_ATTR] = str(self.uid)
        if self.gid is not None:
            out[GID_ATTR] = str(self.gid)
        if self.mtime_ns is not None:
            out[MTIME_ATTR] = str(self.mtime_ns)
        return out

    def headers(self) -> dict[str, str]:
        """The same as request headers (``x-amz-meta-airfs-mode: 644``, ...)."""
        return {HEADER_PREFIX + k: v for k, v in self.attributes().items()}


def parse_mode(value: str | None) -> int | None:
    """The permission bits stored as octal digits, or None if absent or not a mode."""
    if not value:
        return None
    try:
        mode = int(value, 8)
    except ValueError:
        return None
    return mode if 0 <= mode <= 0o7777 else None


def _parse_int(value: str | None, high: int) -> int | None:
    if not value or not value.strip().isdigit():
        return None
    n = int(value)
    return n if 0 <= n <= high else None


def parse(attributes: Mapping[str, str]) -> Meta:
    """The :class:`Meta` in user metadata as obstore reports it (keys without the prefix,
    any case); malformed values read as absent."""
    low = {k.lower(): v for k, v in attributes.items()}
    return Meta(
        mode=parse_mode(low.get(MODE_ATTR)),
        uid=_parse_int(low.get(UID_ATTR), _ID_MAX),
        gid=_parse_int(low.get(GID_ATTR), _ID_MAX),
        mtime_ns=_parse_int(low.get(MTIME_ATTR), (1 << 63) - 1),
    )


def from_headers(headers: Mapping[str, str]) -> Meta:
    """The :class:`Meta` in the headers of a raw reply (``x-amz-meta-...``)."""
    n = len(HEADER_PREFIX)
    return parse({k[n:]: v for k, v in headers.items() if k.lower().startswith(HEADER_PREFIX)})


def ns_of(when: dt.datetime | None) -> int:
    """Nanoseconds since the epoch of an S3 timestamp (naive means UTC; None gives 0)."""
    if when is None:
        return 0
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return (when - _EPOCH) // dt.timedelta(microseconds=1) * 1000


def iso_ns(value: str | None) -> int:
    """Nanoseconds since the epoch of an ISO 8601 time (a listing's ``LastModified``); 0 if
    unreadable."""
    if not value:
        return 0
    try:
        return ns_of(dt.datetime.fromisoformat(value.strip().replace("Z", "+00:00")))
    except ValueError:
        return 0


def http_date_ns(value: str | None) -> int:
    """Nanoseconds since the epoch of an HTTP date (``Last-Modified``); 0 if unreadable."""
    if not value:
        return 0
    try:
        return ns_of(email.utils.parsedate_to_datetime(value))
    except (TypeError, ValueError):
        return 0
