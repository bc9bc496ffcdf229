"""Unity Catalog's error shape: every refusal is ``{"error_code": ..., "message": ...}`` with
the HTTP status the clients map it by (databricks-sdk raises ``NotFound``,
``PermissionDenied``, ``ResourceAlreadyExists``... from the pair)."""

from __future__ import annotations

import errno
from typing import Any

from airfs.catalog.model import CatalogError
from airfs.origin.base import (
    Conflict,
    Exists,
    InvalidName,
    IsADir,
    NameTooLong,
    NotADir,
    NotEmpty,
    NotFound,
    OriginError,
    PermissionDenied,
    Transient,
)


class ApiError(Exception):
    """A refusal: ``status`` (HTTP), ``code`` (Unity Catalog's ``error_code``), ``message``
    (one line for the caller; never a traceback)."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message

    def body(self) -> dict[str, Any]:
        return {"error_code": self.code, "message": self.message}


def bad_request(message: str) -> ApiError:
    return ApiError(400, "INVALID_PARAMETER_VALUE", message)


def not_found(message: str) -> ApiError:
    return ApiError(404, "RESOURCE_DOES_NOT_EXIST", message)


def denied(message: str) -> ApiError:
    return ApiError(403, "PERMISSION_DENIED", message)


#: a catalog command's errno → (HTTP status, error_code)
_CATALOG = {
    errno.ENOENT: (404, "RESOURCE_DOES_NOT_EXIST"),
    errno.EEXIST: (409, "RESOURCE_ALREADY_EXISTS"),
    errno.EACCES: (403, "PERMISSION_DENIED"),
    errno.EPERM: (403, "PERMISSION_DENIED"),
    errno.ENOTEMPTY: (400, "INVALID_STATE"),
    errno.EAGAIN: (503, "TEMPORARILY_UNAVAILABLE"),
}


def from_catalog(exc: CatalogError) -> ApiError:
    status, code = _CATALOG.get(exc.errno, (400, "INVALID_PARAMETER_VALUE"))
    return ApiError(status, code, str(exc))


def from_origin(exc: OriginError, what: str) -> ApiError:
    """An origin error met while serving ``what`` (a ``/Volumes/...`` path)."""
    reason = exc.strerror or str(exc)
    if isinstance(exc, NotFound):
        return ApiError(404, "NOT_FOUND", f"{what}: no such file or directory")
    if isinstance(exc, Exists | Conflict):
        return ApiError(409, "ALREADY_EXISTS", f"{what}: exists already")
    if isinstance(exc, NotEmpty):
        return ApiError(409, "RESOURCE_CONFLICT", f"{what}: directory not empty")
    if isinstance(exc, IsADir):
        return ApiError(400, "INVALID_PARAMETER_VALUE", f"{what}: is a directory")
    if isinstance(exc, NotADir):
        return ApiError(400, "INVALID_PARAMETER_VALUE", f"{what}: not a directory")
    if isinstance(exc, InvalidName | NameTooLong):
        return ApiError(400, "INVALID_PARAMETER_VALUE", f"{what}: {reason}")
    if isinstance(exc, PermissionDenied):
        return ApiError(403, "PERMISSION_DENIED", f"{what}: the origin refused ({reason})")
    if isinstance(exc, Transient):
        return ApiError(503, "TEMPORARILY_UNAVAILABLE", f"{what}: origin unavailable ({reason})")
    return ApiError(500, "INTERNAL_ERROR", f"{what}: origin error ({reason})")
