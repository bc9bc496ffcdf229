"""The Files API for volumes: ``/api/2.0/fs/files{path}`` (``PUT`` with ``overwrite``, ``GET``
with ``Range``, ``HEAD``, ``DELETE``) and ``/api/2.0/fs/directories{path}`` (``PUT``, ``GET``
with ``page_size``/``page_token``, ``HEAD``, ``DELETE``), ``path`` being
``/Volumes/CATALOG/SCHEMA/VOLUME/...``.

Every call is decided by :func:`airfs.catalog.model.allowed` with the mount's own operations
(``open_read``, ``readdir``, ``create``, ``unlink``, ``mkdir``, ``rmdir``): reading needs
``READ VOLUME``, changing ``WRITE VOLUME`` (and ``USE`` above); a volume the caller may not
see is 404 like one that does not exist. Bytes go to the origin as a node writes them: a
file is staged locally, then put with one atomic replace (``overwrite=false``, the default,
is a conditional put that must not find the file: 409 ``ALREADY_EXISTS``; ``If-Match:
"<ETag>"`` puts only over that version of the file, 412 otherwise); missing parent
directories are made first. Files are created ``0666`` and directories ``0777``: over the API
the grants alone decide, as for a volume's own directory.

Paths are taken percent-decoded once and refused (400) with an empty, ``.`` or ``..``
component, a NUL, a trailing slash on a file, or outside ``/Volumes/C/S/V``.
"""

from __future__ import annotations

import contextlib
import email.utils
import errno
import os
import tempfile
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass

from airfs.catalog.model import CatalogError, Who, allowed, check_name
from airfs.origin.base import Conflict, Entry, Exists, Kind, NotFound, OriginError

from .context import Api, Reply, Request, page_after, page_token
from .errors import ApiError, bad_request, from_catalog, from_origin

FILES = "/api/2.0/fs/files"
DIRECTORIES = "/api/2.0/fs/directories"
FILE_MODE = 0o666
DIR_MODE = 0o777
#: bytes read from the origin per chunk of a download
CHUNK = 4 << 20
PAGE = 1000


@dataclass(frozen=True, slots=True)
class VolumePath:
    """A checked ``/Volumes/...`` path: ``shown`` as the caller wrote it (decoded),
    ``origin`` the origin path (``cat/sch/vol/a/b``), ``depth`` its components (3: the
    volume itself)."""

    shown: str
    origin: str
    depth: int


def parse_path(raw: str, *, is_dir: bool) -> VolumePath:
    """Check the path part after ``/api/2.0/fs/files`` (or ``directories``), still escaped."""
    if "\0" in raw or "%00" in raw.lower():
        raise bad_request("path contains a NUL")
    try:
        path = urllib.parse.unquote(raw, errors="strict")
    except UnicodeDecodeError:
        raise bad_request("path is not UTF-8") from None
    if "\0" in path:
        raise bad_request("path contains a NUL")
    if is_dir and path.endswith("/") and len(path) > 1:
        path = path[:-1]
    parts = path.split("/")
    if parts[:2] != ["", "Volumes"] or len(parts) < 5:
        raise bad_request(f"path {path!r}: expected /Volumes/CATALOG/SCHEMA/VOLUME/...")
    rest = parts[2:]
    for p in rest:
        if p in ("", ".", ".."):
            raise bad_request(f"path {path!r}: empty, '.' and '..' components are refused")
    try:
        for p, what in zip(rest[:3], ("catalog", "schema", "volume"), strict=False):
            check_name(p, what)
    except CatalogError as exc:
        raise bad_request(f"path {path!r}: {exc}") from None
    return VolumePath(path, "/".join(rest), len(rest))


def check(api: Api, who: Who, op: str, vp: VolumePath) -> None:
    """Refuse ``op`` (a mount operation) on ``vp`` for ``who`` as the mount would: 404 for a
    volume that does not exist or is not visible, 403 for a missing privilege."""
    try:
        meta = api.meta()
    except CatalogError as exc:
        raise from_catalog(exc) from None
    except OriginError as exc:
        raise from_origin(exc, "the catalog") from None
    names = tuple(vp.origin.split("/")[:3])
    if meta.find(names) is None:
        raise ApiError(404, "NOT_FOUND", f"{vp.shown}: no such volume {'.'.join(names)}")
    d = allowed(meta, who, op, vp.origin)
    if d.ok:
        return
    if d.errno == errno.ENOENT:
        raise ApiError(404, "NOT_FOUND", f"{vp.shown}: no such volume {'.'.join(names)}")
    why = f"missing {d.missing}" if d.missing else d.reason
    raise ApiError(403, "PERMISSION_DENIED", f"{vp.shown}: not allowed ({why})")


def _query_bool(req: Request, key: str) -> bool:
    value = req.query.get(key, "false").lower()
    if value not in ("true", "false"):
        raise bad_request(f"{key} must be true or false, not {value!r}")
    return value == "true"


def make_parents(api: Api, vp: VolumePath, *, upto: int) -> None:
    """Make the directories of ``vp`` below the volume, the first ``upto`` components."""
    parts = vp.origin.split("/")
    for i in range(4, upto + 1):
        sub = "/".join(parts[:i])
        try:
            api.origin.mkdir(sub, DIR_MODE)
        except Exists:
            if api.origin.stat(sub).kind is not Kind.DIR:
                raise ApiError(
                    409, "ALREADY_EXISTS", f"/Volumes/{sub}: exists and is not a directory"
                ) from None


def commit(
    api: Api, vp: VolumePath, staged: str, *, overwrite: bool, if_match: str | None = None
) -> Entry:
    """Put local file ``staged`` at ``vp`` (atomic replace; conditional without
    ``overwrite``; with ``if_match``, a version tag as ``GET`` answers it in ``ETag``, only
    over that version: 412 otherwise, as a node's commit finds a conflict)."""
    expected = if_match if if_match is not None else (None if overwrite else "")
    try:
        api.origin.check_name(vp.origin)
        make_parents(api, vp, upto=vp.depth - 1)
        return api.origin.put(vp.origin, staged, expected, mode=FILE_MODE)
    except Conflict:
        if if_match is not None:
            raise ApiError(
                412, "PRECONDITION_FAILED", f"{vp.shown} is no longer version {if_match}"
            ) from None
        raise ApiError(409, "ALREADY_EXISTS", f"{vp.shown} exists (overwrite=false)") from None
    except OriginError as exc:
        raise from_origin(exc, vp.shown) from None


def stage_file(api: Api) -> str:
    fd, path = tempfile.mkstemp(prefix="put-", dir=api.stage_dir)
    os.close(fd)
    return path


def _stat_file(api: Api, vp: VolumePath) -> Entry:
    try:
        entry = api.origin.stat(vp.origin)
    except OriginError as exc:
        raise from_origin(exc, vp.shown) from None
    if entry.kind is Kind.DIR:
        raise ApiError(404, "NOT_FOUND", f"{vp.shown} is a directory (see {DIRECTORIES})")
    if entry.kind is not Kind.FILE:
        raise ApiError(404, "NOT_FOUND", f"{vp.shown} is not a regular file")
    return entry


def _range(header: str, size: int) -> tuple[int, int] | None:
    """``bytes=A-B`` / ``A-`` / ``-N`` → (start, end exclusive); None: the whole file."""
    if not header:
        return None
    unit, _, spec = header.partition("=")
    if unit.strip().lower() != "bytes" or "," in spec:
        raise ApiError(416, "INVALID_PARAMETER_VALUE", f"Range {header!r}: one bytes range only")
    first, _, last = spec.strip().partition("-")
    try:
        if first == "":
            n = int(last)
            start, end = max(size - n, 0), size
        else:
            start = int(first)
            end = int(last) + 1 if last else size
    except ValueError:
        raise ApiError(416, "INVALID_PARAMETER_VALUE", f"bad Range {header!r}") from None
    end = min(end, size)
    if start >= size or start >= end:
        raise ApiError(416, "INVALID_PARAMETER_VALUE", f"Range {header!r} outside 0-{size}")
    return start, end


def _chunks(api: Api, entry: Entry, vp: VolumePath, start: int, end: int) -> Iterator[bytes]:
    pos = start
    while pos < end:
        data = api.origin.read_range(vp.origin, pos, min(CHUNK, end - pos), entry.version)
        if not data:
            raise OSError(errno.EIO, f"{vp.shown}: ended at {pos} of {end}")
        yield data
        pos += len(data)


def serve_file(api: Api, req: Request, vp: VolumePath) -> Reply:
    """``GET``/``HEAD`` of a file already allowed: its bytes (or a ``Range`` of them) at one
    version (a file replaced meanwhile ends the transfer early: the client sees a short
    body and retries)."""
    entry = _stat_file(api, vp)
    mtime = entry.mtime_ns / 1e9
    headers = {
        "Content-Type": "application/octet-stream",
        "Last-Modified": email.utils.formatdate(mtime, usegmt=True),
        "Accept-Ranges": "bytes",
        "ETag": f'"{entry.version}"',
    }
    since = req.headers.get("If-Unmodified-Since")
    if since:
        with contextlib.suppress(TypeError, ValueError):
            limit = email.utils.parsedate_to_datetime(since).timestamp()
            if int(mtime) > limit:
                raise ApiError(412, "PRECONDITION_FAILED", f"{vp.shown} changed since {since}")
    span = _range(req.headers.get("Range", ""), entry.size)
    start, end = span or (0, entry.size)
    status = 200
    if span is not None:
        status = 206
        headers["Content-Range"] = f"bytes {start}-{end - 1}/{entry.size}"
    headers["Content-Length"] = str(end - start)
    if req.method == "HEAD":
        return Reply(status, b"", headers)
    return Reply(status, None, headers, _chunks(api, entry, vp, start, end))


def _files(api: Api, req: Request, raw: str) -> Reply:
    vp = parse_path(raw, is_dir=False)
    if vp.depth < 4:
        raise bad_request(f"{vp.shown} is a volume, not a file in one")
    if req.method in ("GET", "HEAD"):
        check(api, req.who, "open_read", vp)
        return serve_file(api, req, vp)
    if req.method == "PUT":
        overwrite = _query_bool(req, "overwrite")
        check(api, req.who, "create", vp)
        staged = stage_file(api)
        try:
            req.body.to_file(staged, api.limits.max_file)
            tag = req.headers.get("If-Match")
            commit(api, vp, staged, overwrite=overwrite, if_match=tag.strip('"') if tag else None)
        finally:
            os.unlink(staged)
        return Reply(204, b"")
    if req.method == "DELETE":
        check(api, req.who, "unlink", vp)
        try:
            api.origin.delete(vp.origin)
        except OriginError as exc:
            raise from_origin(exc, vp.shown) from None
        return Reply(204, b"")
    raise ApiError(405, "BAD_REQUEST", f"{req.method} is not supported on {FILES}")


def _entry(vp: VolumePath, e: Entry) -> dict[str, object]:
    is_dir = e.kind is Kind.DIR
    out: dict[str, object] = {
        "path": f"{vp.shown}/{e.name}" + ("/" if is_dir else ""),
        "is_directory": is_dir,
        "name": e.name,
    }
    if not is_dir:
        out["file_size"] = e.size
        out["last_modified"] = e.mtime_ns // 1_000_000
    return out


def _listing(api: Api, req: Request, vp: VolumePath) -> Reply:
    raw_size = req.query.get("page_size", "0") or "0"
    try:
        size = int(raw_size)
    except ValueError:
        raise bad_request(f"page_size {raw_size!r} is not a number") from None
    if size < 0:
        raise bad_request("page_size must not be negative")
    size = min(size or PAGE, PAGE)
    try:
        entries = sorted(
            (e for e in api.origin.list(vp.origin) if e.kind in (Kind.FILE, Kind.DIR)),
            key=lambda e: e.name,
        )
    except OriginError as exc:
        raise from_origin(exc, vp.shown) from None
    token = req.query.get("page_token")
    if token:
        after = page_after(token)
        entries = [e for e in entries if e.name > after]
    chunk = entries[:size]
    body: dict[str, object] = {"contents": [_entry(vp, e) for e in chunk]}
    if len(entries) > size:
        body["next_page_token"] = page_token(chunk[-1].name)
    return Reply(body=body)


def _directories(api: Api, req: Request, raw: str) -> Reply:
    vp = parse_path(raw, is_dir=True)
    if req.method in ("GET", "HEAD"):
        check(api, req.who, "readdir", vp)
        try:
            kind = api.origin.stat(vp.origin).kind
        except OriginError as exc:
            raise from_origin(exc, vp.shown) from None
        if kind is not Kind.DIR:
            raise ApiError(404, "NOT_FOUND", f"{vp.shown} is not a directory")
        return Reply(200, b"") if req.method == "HEAD" else _listing(api, req, vp)
    if req.method == "PUT":
        if vp.depth == 3:  # the volume's own directory: there already
            check(api, req.who, "create", VolumePath(vp.shown, vp.origin + "/x", 4))
        else:
            check(api, req.who, "mkdir", vp)
        try:
            make_parents(api, vp, upto=vp.depth)
        except NotFound:
            raise ApiError(404, "NOT_FOUND", f"{vp.shown}: the volume has no directory") from None
        except OriginError as exc:
            raise from_origin(exc, vp.shown) from None
        return Reply(204, b"")
    if req.method == "DELETE":
        check(api, req.who, "rmdir", vp)
        try:
            api.origin.rmdir(vp.origin)
        except OriginError as exc:
            raise from_origin(exc, vp.shown) from None
        return Reply(204, b"")
    raise ApiError(405, "BAD_REQUEST", f"{req.method} is not supported on {DIRECTORIES}")


def handle(api: Api, req: Request) -> Reply:
    """A Files API call (``req.raw_path`` starts with :data:`FILES` or :data:`DIRECTORIES`)."""
    if req.raw_path.startswith(FILES + "/"):
        return _files(api, req, req.raw_path[len(FILES) :])
    if req.raw_path.startswith(DIRECTORIES + "/"):
        return _directories(api, req, req.raw_path[len(DIRECTORIES) :])
    raise ApiError(404, "ENDPOINT_NOT_FOUND", f"no endpoint {req.raw_path}")
