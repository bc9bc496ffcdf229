"""The one place that builds the filesystem's object graph: origin → read path → write-back
(staging + journal recovery + uploader) → core, each teardown registered beside its
construction in one ``AsyncExitStack``.

Used by the daemon (:mod:`airfs.daemon.process`, which adds the FUSE transport and the control
socket on top) and by the tests, so no test rebuilds the graph by hand. Leaving the context is a
*crash-like* stop of the write path: nothing is drained (callers drain first with
``uploader.flush("")`` when they mean to); what is journaled is replayed by the next build on
the same cache dir.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass

import trio

from airfs.catalog.service import CatalogService
from airfs.core.attrs import Owner
from airfs.core.context import Guard
from airfs.core.fs import Filesystem
from airfs.core.readpath import DirectReadPath, ReadPath
from airfs.origin.aio import AsyncOrigin
from airfs.origin.base import Entry, Origin, split
from airfs.writeback.recovery import RecoveryReport, open_area, recover
from airfs.writeback.staging import StagingArea
from airfs.writeback.uploader import Uploader

log = logging.getLogger(__name__)

ReadPathFactory = Callable[[AsyncOrigin, trio.Nursery], Awaitable[ReadPath]]


@dataclass
class Built:
    """The running pieces of one filesystem."""

    origin: AsyncOrigin
    root: Entry
    readpath: ReadPath
    area: StagingArea
    uploader: Uploader
    fs: Filesystem
    recovery: RecoveryReport
    nursery: trio.Nursery
    #: the governed-volumes catalog of the origin (ungoverned while the origin has none)
    catalog: CatalogService


async def _direct(origin: AsyncOrigin, nursery: trio.Nursery) -> ReadPath:
    return DirectReadPath(origin)


@contextlib.asynccontextmanager
async def build(
    origin: Origin,
    cache_dir: str,
    *,
    ttl: float = 1.0,
    immutable: bool = False,
    staging_size: int = 100 << 30,
    staging_min_free: int | None = None,
    write_wait: float = 30.0,
    allow_devices: bool = False,
    guard: Guard | None = None,
    owner: Owner | None = None,
    readpath: ReadPathFactory = _direct,
    rebuild_journal: bool = False,
    journal_hint: str = "",
    keep_open: frozenset[str] = frozenset(),
    attempts: int = 5,
    upload_concurrency: int = 8,
    commit_delay: float = 0.0,
    upload: bool = True,
    remove_temporaries: Callable[[Iterable[str]], tuple[str, ...]] | None = None,
) -> AsyncIterator[Built]:
    """Build and run the core over ``origin`` with its state in ``cache_dir``.

    Raises :class:`~airfs.writeback.journal.JournalDamaged` when the journal cannot be
    trusted (see :func:`airfs.writeback.recovery.recover`), and the origin's errors when its
    root cannot be read. ``upload=False`` (tests) leaves the uploader stopped.
    ``staging_min_free``: the free space staged files leave on the cache filesystem (None:
    :func:`~airfs.writeback.space.default_min_free`; 0: no floor).
    ``remove_temporaries`` (:meth:`~airfs.origin.posix.PosixOrigin.remove_temporaries`) is
    given the directories where a commit cut short by a crash may have left this node's
    temporary files, after recovery and before the first commit. ``keep_open``: the paths
    a mount being taken over holds open for writing (recovery adopts their open versions
    and holds their commits; the caller ends both after the take-over:
    :func:`~airfs.writeback.recovery.finish_take_over`).

    ``guard`` None: the origin's catalog governs (:class:`~airfs.catalog.service.CatalogService`;
    while the origin has none, everything is allowed but its reserved name, and an
    ``airfs catalog init`` made later takes effect within the TTL, without a remount)."""
    async with contextlib.AsyncExitStack() as stack:
        aorigin = AsyncOrigin(origin, attempts=attempts)
        root = await aorigin.stat("")
        os.makedirs(cache_dir, mode=0o700, exist_ok=True)
        area = open_area(
            cache_dir,
            limit=staging_size,
            min_free=staging_min_free,
            rebuild=rebuild_journal,
            hint=journal_hint,
        )
        stack.callback(area.close)
        report = recover(area, rebuild=rebuild_journal, hint=journal_hint, keep_open=keep_open)
        if remove_temporaries is not None and report.paths:
            dirs = sorted({split(p)[0] for p in report.paths})
            removed = await trio.to_thread.run_sync(remove_temporaries, dirs)
            if removed:
                log.info(
                    "removed %d temporary file(s) of commits cut short by a crash: %s",
                    len(removed),
                    ", ".join(removed[:5]),
                )
        nursery = await stack.enter_async_context(trio.open_nursery())
        stack.callback(nursery.cancel_scope.cancel)
        nursery.start_soon(area.run_settler)
        rp = await readpath(aorigin, nursery)
        catalog = CatalogService(origin, ttl, via=aorigin, tmp_dir=cache_dir)

        async def close_readpath() -> None:
            with trio.CancelScope(shield=True):
                await rp.aclose()

        stack.push_async_callback(close_readpath)
        fs = Filesystem(
            aorigin,
            rp,
            area,
            root,
            ttl=ttl,
            immutable=immutable,
            owner=owner or Owner(os.getuid(), os.getgid()),
            write_wait_s=write_wait,
            allow_devices=allow_devices,
            guard=catalog.guard if guard is None else guard,
        )
        nursery.start_soon(fs.kernel.run)
        uploader = Uploader(
            area,
            aorigin,
            on_committed=fs.committed,
            concurrency=upload_concurrency,
            commit_delay=commit_delay,
        )
        if upload:
            await nursery.start(uploader.run)
        yield Built(aorigin, root, rp, area, uploader, fs, report, nursery, catalog)
