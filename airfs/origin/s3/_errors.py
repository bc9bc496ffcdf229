"""Error translation: obstore, HTTP and socket failures to the typed origin errors."""

from __future__ import annotations

import errno
import http.client
import re

import obstore.exceptions as oe

from ..base import (
    Conflict,
    NoSpace,
    NotFound,
    NotSupported,
    OriginError,
    PermissionDenied,
    Stalled,
    Transient,
    from_oserror,
)

_STATUS_RE = re.compile(r"status code: (\d{3})")
CODE_RE = re.compile(r"<Code>([^<]+)</Code>")
_NETWORK_HINTS = (
    "error sending request",
    "connection",
    "timed out",
    "timeout",
    "dns error",
    "broken pipe",
    "reset by peer",
    "incomplete",
)
#: how a deadline overrun reads in obstore's (reqwest's) error text
_TIMEOUT_HINTS = ("kind: timeout", "timedout", "timed out", "operation timed out")


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    line = text.splitlines()[0] if text else type(exc).__name__
    return line if len(line) <= 300 else line[:297] + "..."


def classify(
    where: str,
    *,
    status: int | None,
    code: str | None,
    detail: str,
    network: bool = False,
    stalled: bool = False,
) -> OriginError:
    """The typed error for an S3 failure; ``where`` starts the one-line message. ``stalled``:
    a deadline passed without an answer (:class:`Stalled`)."""
    tag = code or (f"HTTP {status}" if status else "")
    if stalled:
        return Stalled(f"{where}: the S3 endpoint did not answer in time ({detail})", errno.EIO)
    if network:
        return Transient(f"{where}: cannot reach the S3 endpoint ({detail})", errno.EIO)
    if status == 404 or code in ("NoSuchKey", "NoSuchBucket"):
        if code == "NoSuchBucket":
            return NotFound(f"{where}: the bucket does not exist")
        return NotFound(f"{where}: not found")
    if status == 412 or code == "PreconditionFailed":
        return Conflict(f"{where}: changed at the origin (precondition failed)")
    if status in (401, 403) or code in ("AccessDenied", "SignatureDoesNotMatch"):
        return PermissionDenied(f"{where}: access denied ({tag})")
    if status == 501 or code == "NotImplemented":
        return NotSupported(f"{where}: not supported by this S3 server ({tag})")
    if status == 507 or code == "EntityTooLarge":
        return NoSpace(f"{where}: the S3 server refused the size ({tag})")
    retry_codes = ("SlowDown", "RequestTimeout", "InternalError", "ServiceUnavailable")
    if (status is not None and (status >= 500 or status in (408, 429))) or code in retry_codes:
        return Transient(f"{where}: S3 server error ({tag}), retry later")
    return OriginError(f"{where}: {detail}")


def status_of(exc: BaseException) -> int | None:
    m = _STATUS_RE.search(str(exc))
    return int(m.group(1)) if m else None


def s3_code(exc: BaseException) -> str | None:
    c = CODE_RE.search(str(exc))
    return c.group(1) if c else None


def translate(exc: BaseException, where: str) -> OriginError:
    """Map an obstore (or socket/OS) exception to the typed origin error."""
    if isinstance(exc, OriginError):
        return exc
    msg = str(exc)
    status, code = status_of(exc), s3_code(exc)
    detail = first_line(exc)
    if isinstance(exc, ValueError | oe.InvalidPathError) or "Could not parse path" in msg:
        return OriginError(f"{where}: not a valid S3 key ({detail})", errno.EINVAL)
    if isinstance(exc, FileNotFoundError | oe.NotFoundError):
        status = status or 404
    elif isinstance(exc, oe.PreconditionError | oe.AlreadyExistsError | oe.NotModifiedError):
        status = 412
    elif isinstance(exc, PermissionError | oe.PermissionDeniedError | oe.UnauthenticatedError):
        status = status if status in (401, 403) else 403
    elif isinstance(exc, oe.NotSupportedError):
        return NotSupported(f"{where}: {detail}")
    elif status is None and (
        isinstance(exc, TimeoutError | ConnectionError | http.client.HTTPException)
        or any(h in msg.lower() for h in _NETWORK_HINTS)
    ):
        stalled = isinstance(exc, TimeoutError) or any(h in msg.lower() for h in _TIMEOUT_HINTS)
        return classify(where, status=None, code=None, detail=detail, network=True, stalled=stalled)
    elif status is None and isinstance(exc, OSError) and exc.errno:
        return from_oserror(exc, where)
    return classify(where, status=status, code=code, detail=detail)
