"""What a mount opens before it serves: its origin (a directory, the directory beneath the
mountpoint, or an S3 bucket; wrapped in a latency emulator when asked) and its read path (the
block cache, or direct origin reads with ``--no-cache``). Errors are :class:`MountError` with a
one-line reason."""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any

import trio

from airfs.core.readpath import DirectReadPath, ReadPath
from airfs.origin.aio import AsyncOrigin
from airfs.origin.base import Origin, OriginError
from airfs.origin.latency import LatencyOrigin
from airfs.origin.posix import PosixOrigin, tmp_tag

from .config import MountConfig, MountError

if TYPE_CHECKING:
    from airfs.origin.s3 import S3Origin

log = logging.getLogger("airfs")


def open_origin(cfg: MountConfig, overlay_fd: int | None) -> Origin:
    """Build the origin named by the config (wrapped in a latency emulator if asked).
    Raises :class:`MountError`."""
    origin = _open_origin(cfg, overlay_fd)
    if cfg.emulate_latency or cfg.emulate_bandwidth:
        return LatencyOrigin(
            origin, cfg.emulate_latency, cfg.emulate_bandwidth, cfg.emulate_request_size
        )
    return origin


def posix_of(origin: Origin) -> PosixOrigin | None:
    """The POSIX origin ``origin`` is (or emulates the latency of), else None."""
    inner = origin.inner if isinstance(origin, LatencyOrigin) else origin
    return inner if isinstance(inner, PosixOrigin) else None


def s3_of(origin: Origin) -> S3Origin | None:
    """The S3 origin ``origin`` is (or emulates the latency of), else None."""
    from airfs.origin.s3 import S3Origin

    inner = origin.inner if isinstance(origin, LatencyOrigin) else origin
    return inner if isinstance(inner, S3Origin) else None


def known_file(cache_dir: str) -> str:
    """Where an S3 mount keeps what it knows of objects' stored attributes between daemons."""
    return os.path.join(cache_dir, "s3-known.json")


def load_known(origin: Origin, cache_dir: str) -> None:
    """An S3 origin remembers the attributes the previous daemon on ``cache_dir`` saved:
    its first listings HEAD only the objects not seen before (or changed since)."""
    s3 = s3_of(origin)
    if s3 is not None:
        n = s3.load_known(known_file(cache_dir))
        if n:
            log.info("remembered the stored attributes of %d S3 object(s)", n)


def save_known(origin: Origin, cache_dir: str) -> None:
    """Save what an S3 origin knows of objects' stored attributes (errors logged)."""
    s3 = s3_of(origin)
    if s3 is not None:
        try:
            s3.save_known(known_file(cache_dir))
        except OSError as exc:
            log.warning("cannot save the known S3 attributes: %s", exc)


async def keep_known(origin: Origin, cache_dir: str, interval: float = 120.0) -> None:
    """Forever: every ``interval`` seconds, save what an S3 origin knows of objects' stored
    attributes when it changed (a daemon killed loses at most that much); nothing for other
    origins."""
    s3 = s3_of(origin)
    if s3 is None:
        return
    saved = -1
    while True:
        await trio.sleep(interval)
        now = s3.client.known.changes
        if now != saved:
            await trio.to_thread.run_sync(save_known, origin, cache_dir)
            saved = now


def _open_origin(cfg: MountConfig, overlay_fd: int | None) -> Origin:
    spec = cfg.origin
    try:
        if spec is None:
            assert overlay_fd is not None
            return PosixOrigin(cfg.mountpoint, dir_fd=overlay_fd, tag=tmp_tag(cfg.cache_dir))
        if spec.startswith("s3://"):
            try:
                from airfs.origin.s3 import S3Origin
            except ImportError as exc:  # pragma: no cover - s3 support is part of the package
                raise MountError(f"S3 origins are not available: {exc}") from None
            extra: dict[str, Any] = {}
            if cfg.s3_default_mode is not None:
                extra["default_mode"] = cfg.s3_default_mode
            if cfg.s3_timeout is not None:
                extra["stall_timeout"] = cfg.s3_timeout
            return S3Origin.from_url(
                spec,
                endpoint=cfg.s3_endpoint,
                region=cfg.s3_region,
                path_style=cfg.s3_path_style,
                list_heads=cfg.s3_list_heads,
                **extra,
            )
        if "://" in spec and not spec.startswith("file://"):
            raise MountError(f"unsupported origin {spec!r} (use a directory or s3://bucket/prefix)")
        return PosixOrigin(spec.removeprefix("file://"), tag=tmp_tag(cfg.cache_dir))
    except OriginError as exc:
        raise MountError(f"origin {spec or cfg.mountpoint}: {exc.strerror or exc}") from None


async def make_readpath(cfg: MountConfig, origin: AsyncOrigin, nursery: trio.Nursery) -> ReadPath:
    """The block cache + prefetcher (direct origin reads with ``no_cache``)."""
    if cfg.no_cache:
        return DirectReadPath(origin)
    from airfs.cache import CacheDamaged, CachedReadPath, CacheInUse, set_aside

    blocks = os.path.join(cfg.cache_dir, "blocks")
    for attempt in range(2):
        try:
            return await CachedReadPath.create(
                nursery, origin, blocks, cache_size=cfg.cache_size, min_free=cfg.min_free
            )
        except CacheInUse as exc:
            raise MountError(str(exc)) from None
        except CacheDamaged as exc:
            if not cfg.rebuild_cache or attempt:
                raise MountError(
                    f"{exc}; mount with --rebuild-cache to move it aside and start with an "
                    "empty block cache (pending writes are kept)"
                ) from None
            moved = await trio.to_thread.run_sync(set_aside, exc.path)
            log.warning("%s; moved to %s, starting with an empty block cache", exc, moved)
    raise AssertionError("unreachable")
